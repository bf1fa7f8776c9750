// The TCP store server's state without its sockets: the table (StoreTable, shared with the
// in-memory store), the queues, the clients parked on missing keys, the watchers, and the
// per-round worker namespace (rendezvous/tcp/worker_namespace.h). It takes decoded requests and
// appends encoded replies to the session that sent them; the connection side
// (tcp_store_server.cc) does the I/O, framing, dialect detection and the job token. The split
// follows Asio's HTTP server example: connection and manager there, request handler here.
//
// Threading: not thread-safe; the server calls it from its one thread only. Nothing here
// blocks. Requests on missing keys wait in one of two ways:
//   WAIT                      pending, as in PyTorch's servers: the session goes on with its
//                             next requests, and STOP_WAITING is sent whenever the keys are
//                             there (or never, after CANCEL_WAIT). A PyTorch 1.13 client whose
//                             wait timed out has no cancel and keeps using its connection.
//   GET, MULTI_GET, WAIT_GET  parked (dlaunch's: PyTorch's servers never wait on these): the
//                             reply is the value, so the session's later requests are answered
//                             only after it.
//   BARRIER                   pending as a WAIT (in the same place: one per session), until
//                             its counter reaches the world size it names; CANCEL_WAIT ends it.
// Both are answered when a set/add/compare_set/append/queue push creates the keys. Never
// throws: a request that breaks the protocol (an ADD to a non-counter) comes back as
// Handled::kBadRequest.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/tcp/store_codec.h"
#include "rendezvous/store/store_table.h"

namespace dlaunch {

// One client as the state sees it; the server's connection derives from it. Held by shared_ptr
// (parked sessions stay alive until answered or dropped).
class StoreSession : public std::enable_shared_from_this<StoreSession> {
 public:
  virtual ~StoreSession() = default;

  // Replies are appended here in place; the connection sends them.
  Bytes out;
  // Set by the connection when it closes (it then calls TcpStoreState::drop()); the state
  // skips closed sessions it still holds.
  bool closed = false;

  // Whether a GET/MULTI_GET/WAIT_GET of this session waits for keys: only CANCEL_WAIT may be
  // handled before it is answered. A pending WAIT does not count: it holds nothing up.
  bool parked() const { return parked_.active; }

 protected:
  // Bytes were appended to `out` outside a handle() call for this session (a watch event, a
  // waiting request answered): send them. Never throws.
  virtual void replied() = 0;
  // The parked request was answered: decode this session's next requests (later, not from
  // inside the call, so one set waking many sessions does not recurse). Never throws.
  virtual void resumed() = 0;

  // Whether the session declared itself an agent's (DECLARE_AGENT) before this request.
  bool declared_agent() const { return agent_; }

 private:
  friend class TcpStoreState;
  // A request waiting for `awaiting` of its keys to appear.
  struct Waiting {
    bool active = false;
    wire::Request request;
    size_t awaiting = 0;
  };
  // Keys of a session that did not declare itself an agent's get its round's worker namespace,
  // fixed at its first key operation.
  bool agent_ = false;
  bool scope_known_ = false;
  std::string scope_;
  std::string will_;      // WILL's counter (in the session's namespace); empty: none
  Waiting parked_;        // a GET/MULTI_GET/WAIT_GET: the session's next requests wait for it
  Waiting pending_wait_;  // a WAIT or BARRIER: the session goes on meanwhile
};

class TcpStoreState final : private StoreTable::Observer {
 public:
  enum class Handled {
    kReplied,     // a reply was appended to the session's `out`
    kQuiet,       // no reply: a SET-like request, or the session was parked
    kBadRequest,  // the request breaks the protocol; `error` says why; close the connection
  };

  TcpStoreState() : table_(this) {}
  TcpStoreState(const TcpStoreState&) = delete;
  TcpStoreState& operator=(const TcpStoreState&) = delete;

  // Handles one decoded request other than AUTH_BEGIN/AUTH_PROOF (the connection's). `q` may
  // be the decoder's reused request: its buffers may be taken (a SET swaps its value into the
  // table), so it is left unspecified.
  Handled handle(StoreSession& s, wire::Request& q, std::string& error);
  // One GET, MULTI_GET, CHECK, WAIT or ADD each from several sessions (a channel GROUP, channel_frames.h), all of
  // the same keys in the same namespace and none parked: answers them all from one look at the
  // table, each exactly as handle() would had they come one after the other in this order now
  // (an ADD of the sum, each session its own prefix). False, changing nothing, when that
  // cannot be proven cheaply (a key missing, a watcher or barrier on the counter, an overflow,
  // anything else): the caller then handles each request on its own.
  bool handle_group(const std::vector<StoreSession*>& sessions,
                    const std::vector<wire::Request>& requests);
  // CANCEL_WAIT, also overtaking a parked request: forgets the session's pending WAIT (or
  // BARRIER) and its parked request, and appends WAIT_CANCELED (PyTorch's answer even when nothing waited).
  void cancel_wait(StoreSession& s);
  // A parked WAIT_GET's timeout passed (the connection keeps the timer): answers it
  // WAIT_TIMED_OUT with the keys' values as they are, like a completed one (replied(),
  // resumed()). False, doing nothing, when no WAIT_GET of `s` is parked.
  bool expire_wait(StoreSession& s);
  // The session is going away: takes it off every wait list, and carries out its will (adds 1
  // to the counter it named in WILL and did not clear): its client died or lost the connection.
  void drop(StoreSession& s);
  // The server stops: forgets every will, so that closing the connections carries none out
  // (the clients did not go away, the store did). Call before closing them.
  void forget_wills();
  // The server stops: forgets every waiter and watcher (their connections are closed).
  void forget_clients();
  // Keys in the table (worker namespaces included).
  size_t num_keys() const { return table_.size(); }
  // The hosting process's own writes (no session): waiters and watchers hear of them as of any.
  int64_t local_add(const std::string& key, int64_t delta) { return table_.add(key, delta); }
  void local_set(const std::string& key, const Bytes& value) { table_.set(key, value); }
  // begin_worker_namespace() (rendezvous/tcp/worker_namespace.h) by the hosting process.
  void local_begin_worker_namespace(const std::string& ns);

 private:
  using SessionPtr = std::shared_ptr<StoreSession>;
  // One entry of a key's wait list: the session, and which of its waiting requests.
  struct Waiter {
    SessionPtr session;
    bool pending_wait;  // its WAIT (else its parked request)
    StoreSession::Waiting& waiting() const {
      return pending_wait ? session->pending_wait_ : session->parked_;
    }
  };

  // StoreTable::Observer: watch events and waking the waiters of a changed key.
  bool wants_old_value(const std::string& key) const override;
  void changed(const std::string& key, bool created, const Bytes* old, const Bytes& now) override;
  void erased(const std::string& key, const Bytes& old) override;

  bool exists(const std::string& key) const;
  bool all_exist(const std::vector<std::string>& keys) const;
  template <typename Put>
  static void put_reply_first(Bytes& out, size_t at, Put put);
  const std::string& scope_of(StoreSession& s);
  void scope_keys(StoreSession& s, wire::Request& q);
  void notify_watchers(const std::string& key, uint8_t kind, const Bytes& old_value,
                       const Bytes& new_value);
  void wake_all(const std::string& key);
  void wake_one(const std::string& key);
  void forget(StoreSession& s, bool pending_wait);
  bool wait_if_missing(StoreSession& s, const wire::Request& q, bool pending_wait);
  void try_complete(StoreSession& s, bool pending_wait);
  void answer_ready(StoreSession& s, const wire::Request& q);
  void put_marked_values(Bytes& reply, const wire::Request& q) const;
  void queue_pop(StoreSession& s, const std::string& key);
  void list_keys(StoreSession& s);
  Handled barrier(StoreSession& s, wire::Request& q, std::string& error);
  void set_will(StoreSession& s, const std::string& key);
  void clear_will(StoreSession& s);
  void release_barrier_waiters(const std::string& key, const Bytes& count);

  StoreTable table_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
  std::unordered_map<std::string, std::vector<Waiter>> waiters_;
  // Sessions whose BARRIER on the key waits for its counter to reach their world size (their
  // pending_wait_ holds the request): a key that exists, so not on waiters_.
  std::unordered_map<std::string, std::vector<SessionPtr>> barrier_waiters_;
  std::unordered_map<std::string, std::vector<std::weak_ptr<StoreSession>>> watchers_;
  // Each will's counter and the one session whose will it is: a client that reconnects names
  // the same counter from its new connection, which takes the will over, so the old
  // connection's end (seen late, after a partition) no longer counts.
  std::unordered_map<std::string, StoreSession*> wills_;
};

}  // namespace dlaunch
