// The TCP store server's state without its sockets: the table (StoreTable, shared with the
// in-memory store), the queues, the clients parked on missing keys, the watchers, and the
// per-round worker namespace (rendezvous/tcp/worker_namespace.h). It takes decoded requests and
// appends encoded replies to the session that sent them; the connection side
// (tcp_store_server.cc) does the I/O, framing, dialect detection and the job token. The split
// follows Asio's HTTP server example: connection and manager there, request handler here.
//
// Threading: not thread-safe; the server calls it from its one thread only. Nothing here
// blocks: a GET/WAIT/MULTI_GET (or a WAIT_GET on its first key) on missing keys parks its session
// and is answered later, when a set/add/compare_set/append/queue push creates the keys. Never
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

  // Whether a GET/WAIT/MULTI_GET/WAIT_GET of this session waits for keys: only CANCEL_WAIT may be
  // handled before it is answered.
  bool parked() const { return parked_; }

 protected:
  // Bytes were appended to `out` outside a handle() call for this session (a watch event, a
  // parked request answered): send them. Never throws.
  virtual void replied() = 0;
  // The parked request was answered: decode this session's next requests (later, not from
  // inside the call, so one set waking many sessions does not recurse). Never throws.
  virtual void resumed() = 0;

 private:
  friend class TcpStoreState;
  // Keys of a session that did not declare itself an agent's get its round's worker namespace,
  // fixed at its first key operation.
  bool agent_ = false;
  bool scope_known_ = false;
  std::string scope_;
  // A parked GET/WAIT/MULTI_GET/WAIT_GET waiting for `awaiting_` keys to appear.
  bool parked_ = false;
  wire::Request parked_request_;
  size_t awaiting_ = 0;
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
  // CANCEL_WAIT overtaking a parked request: forgets the wait and appends the answer.
  void cancel_wait(StoreSession& s);
  // A parked WAIT_GET's timeout passed (the connection keeps the timer): answers it
  // WAIT_TIMED_OUT with the keys' values as they are, like a completed one (replied(),
  // resumed()). False, doing nothing, when no WAIT_GET of `s` is parked.
  bool expire_wait(StoreSession& s);
  // The session is going away: takes it off every wait list.
  void drop(StoreSession& s);
  // The server stops: forgets every waiter and watcher (their connections are closed).
  void forget_clients();
  // Keys in the table (worker namespaces included).
  size_t num_keys() const { return table_.size(); }
  // The hosting process's own writes (no session): waiters and watchers hear of them as of any.
  int64_t local_add(const std::string& key, int64_t delta) { return table_.add(key, delta); }
  void local_set(const std::string& key, const Bytes& value) { table_.set(key, value); }

 private:
  using SessionPtr = std::shared_ptr<StoreSession>;

  // StoreTable::Observer: watch events and waking the waiters of a changed key.
  bool wants_old_value(const std::string& key) const override;
  void changed(const std::string& key, bool created, const Bytes* old, const Bytes& now) override;
  void erased(const std::string& key, const Bytes& old) override;

  bool exists(const std::string& key) const;
  void scope_keys(StoreSession& s, wire::Request& q);
  void notify_watchers(const std::string& key, uint8_t kind, const Bytes& old_value,
                       const Bytes& new_value);
  void wake_all(const std::string& key);
  void wake_one(const std::string& key);
  void unpark(StoreSession& s);
  bool park_if_missing(StoreSession& s, const wire::Request& q);
  void try_complete_parked(StoreSession& s);
  void answer_ready(StoreSession& s, const wire::Request& q);
  void put_marked_values(Bytes& reply, const wire::Request& q) const;
  void queue_pop(StoreSession& s, const std::string& key);

  StoreTable table_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
  std::unordered_map<std::string, std::vector<SessionPtr>> waiters_;
  std::unordered_map<std::string, std::vector<std::weak_ptr<StoreSession>>> watchers_;
};

}  // namespace dlaunch
