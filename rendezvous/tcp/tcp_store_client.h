// A blocking Store client for the job's TcpStoreServer. It speaks the PyTorch 2.x dialect
// (VALIDATE first) plus dlaunch's job-token handshake, so it also works against PyTorch's own
// 2.x TCPStore server when no token is used.
//
// Blocking and timeouts: the constructor connects, retrying refused/unreachable attempts with
// backoff until connect_timeout passes (ConnectionError naming host:port and what to check);
// the host name is resolved anew at every attempt and every reconnect (a master's name may
// resolve late, or to a new address after its host was replaced: name_wait.h), and while it
// does not resolve it is looked up again every kNameRetryInterval;
// each attempt's handshake is bounded by handshake_timeout, so a foreign service on the port
// is named within seconds ("host:port answers but is not a dlaunch or PyTorch store").
// Every request waits for its reply at most timeout() (get/wait/multi_get: for the keys to
// appear; others: for the server to answer), then throws TimeoutError. A timed-out wait() is
// cancelled on the wire (CANCEL_WAIT) and keeps the connection, so waiting in short slices is
// cheap; any other timeout drops the connection (the server forgets the parked request) and the
// next call reconnects.
// Errors: ClosedError when the server closes the connection mid-request (the server or its
// agent died); ConnectionError when a reconnect fails (StoreRefusedError when every attempt was
// refused: nothing listens at the address); ProtocolError on a malformed reply;
// StateError when the job token is refused, the server is not this job's, or the peer answers
// the handshake with bytes no store sends; UsageError when the store refuses this agent for
// what the user must change: it requires a job token this agent lacks, it serves another run
// (options.run_id), or it is no dlaunch store (PyTorch's own, such as torchrun's, answers PING
// and closes the connection on an agent's DECLARE_AGENT or AUTH_BEGIN). None is retried.
// Thread-safe: one request at a time per client (a mutex); use one client per thread that
// blocks in get/wait while others must go on. interrupt() is the one call that does not wait
// for that mutex: another thread uses it to end a blocked call at once (a watcher's stop()).
//
// Cost per request: one send() of the whole frame and, for requests with a reply, usually one
// blocking recv() (SO_RCVTIMEO bounds it; no poll() first). One-key requests (set, get, add,
// compare_set, delete_key, append) allocate nothing once the buffers have grown, except the
// value they return.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"
#include "rendezvous/store/store.h"
#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {


struct TcpStoreClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  Duration connect_timeout = std::chrono::seconds(60);
  // Bound for connecting again after a connection that once worked was lost (the server died,
  // or a timeout dropped the connection); nullopt: connect_timeout. A store that answered
  // before and is gone for this long is not starting up, it is gone: callers that must not
  // hang on a dead store host (the rendezvous) keep this to a few seconds.
  std::optional<Duration> reconnect_timeout;
  // Do not connect in the constructor but at the first call, so the client exists (and
  // interrupt() can end its connect) before any I/O: for background threads that a shutdown
  // must be able to stop at once.
  bool lazy_connect = false;
  // While the first connect keeps failing (the host is not up yet: a node started before node
  // 0, or its name does not resolve yet), say so this long after it began, then at twice,
  // four times... that (WaitNotes), so a waiting node is not silent for the whole join timeout
  // and a long wait is a few lines.
  Duration first_waiting_note = std::chrono::seconds(5);
  // A store answers the handshake in milliseconds. A peer that accepts and stays silent this
  // long is some other service on the port (or a store too busy to answer yet): said at once in
  // the log, and the connect goes on retrying until its bound. One that answers with bytes no
  // store sends ends the connect at once (StateError).
  Duration handshake_timeout = std::chrono::seconds(5);
  Duration timeout = Store::kDefaultTimeout;
  std::optional<std::string> token;  // the job token; nullopt: connect without one
  // true: declare this connection an agent's (dlaunch's DECLARE_AGENT, which only dlaunch's
  // server knows), so it sees the store unscoped, and ask the server's FEATURES (WAIT_GET);
  // false: like PyTorch's clients, its keys go to the worker namespace of its round
  // (rendezvous/tcp/worker_namespace.h).
  bool agent = false;
  // The run (--rdzv_id) this agent belongs to, declared after the handshake (DECLARE_RUN) to a
  // server that knows the op: a store serving another run refuses the connection, and the
  // constructor (or the first call) throws UsageError naming both runs. Empty: declare none.
  std::string run_id;
};

class TcpStoreClient final : public Store {
 public:
  explicit TcpStoreClient(TcpStoreClientOptions options);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  // get and multi_get: an agent's connection sends one request, which dlaunch's server parks
  // until the keys exist. Anyone else's may face PyTorch's own server (dtrain under torchrun),
  // which answers GET of a missing key at once (libuv: an empty value; legacy: it closes the
  // connection), so it first WAITs for the keys, as PyTorch's client does: a round trip more.
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  // One WAIT_GET request, answered by the server at the latest when the timeout passes, when
  // it said it has the op (FEATURES, agents only); else Store's default.
  WaitGetResult wait_get(const std::vector<std::string>& keys, Duration timeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  // Appends to the value at `key` (PyTorch 2.x APPEND).
  void append(const std::string& key, const Bytes& value);
  // Round trip to the server; returns true when it echoed the nonce.
  bool ping();
  // Deletes every key starting with `prefix` (dlaunch servers only); returns how many.
  bool can_delete_prefix() const override { return true; }
  int64_t delete_prefix(const std::string& prefix) override;
  // The connection's last will (WILL; Store::set_will): registered now and again on every
  // connection this client makes later, so the counter moves only when this client's process
  // dies or its connection breaks and it does not come back. False (nothing registered) when
  // the server lacks the op (an agent's connection asks FEATURES; any other never has wills).
  bool set_will(const std::string& key) override;
  void clear_will() override;

  // Ends the call in progress on another thread, if any, within milliseconds: it throws
  // StoreInterruptedError (also while connecting or backing off between connect attempts),
  // and its connection is dropped, so the next call reconnects. Does nothing when no call is
  // in progress. Safe from any thread; never blocks on I/O; never throws.
  void interrupt() override;
  void connect() override;

  const TcpStoreClientOptions& options() const { return options_; }
  std::string endpoint() const;

 private:
  class CallScope;
  struct ConnectHistory;
  // All run with mutex_ held. The connection's functions are in tcp_store_client_connect.cc.
  void ensure_connected();
  // One connect and handshake; false (connection dropped, `seen` updated) when it failed.
  bool attempt_connection(std::chrono::steady_clock::time_point deadline, Duration bound,
                          ConnectHistory& seen);
  [[noreturn]] void throw_unreachable(Duration bound, const ConnectHistory& seen);
  void connect_once(std::chrono::steady_clock::time_point deadline);
  // One "still waiting for the store" line: why the last attempt failed, how long so far.
  void note_waiting(const ConnectHistory& seen, std::chrono::steady_clock::time_point started,
                    Duration bound) const;
  void wait_locked(const std::vector<std::string>& keys, Duration timeout);
  void handshake(std::chrono::steady_clock::time_point deadline);
  // The handshake's two ways after VALIDATE (already in `hello`): without a job token PING (and
  // DECLARE_AGENT for agents); with one, AUTH_BEGIN and AUTH_PROOF.
  void ping_and_declare(Bytes& hello, std::chrono::steady_clock::time_point deadline);
  void authenticate(Bytes& hello, std::chrono::steady_clock::time_point deadline);
  // "host:port answers but is not a dlaunch or PyTorch store: <why>".
  std::string not_a_store(const std::string& why) const;
  std::string silent_answer() const;
  [[noreturn]] void throw_not_a_store(const std::string& why);
  // Called when the server closed the connection on the handshake's dlaunch-only op
  // (DECLARE_AGENT or AUTH_BEGIN): throws UsageError when a second connection shows a store
  // that answers PyTorch's requests but not that op (PyTorch's own TCPStore); else returns,
  // its connection dropped, and the caller's close stands.
  void refuse_if_foreign_store(std::chrono::steady_clock::time_point deadline);
  // The first reply to the handshake's dlaunch-only op; a close there goes through
  // refuse_if_foreign_store before it is rethrown.
  uint8_t recv_dlaunch_reply(std::chrono::steady_clock::time_point deadline, const char* what);
  // Asks FEATURES into server_features_; a connection closed instead marks an older server.
  void read_features(std::chrono::steady_clock::time_point deadline);
  // Declares options_.run_id (DECLARE_RUN) to a server that has the op; throws UsageError when
  // the store serves another run.
  void declare_run(std::chrono::steady_clock::time_point deadline);
  // Sends WILL with `key` (empty: clear) and reads its answer.
  void send_will(const std::string& key, std::chrono::steady_clock::time_point deadline);
  void send_request(const wire::Request& request);
  // Frames a one-key request straight into wbuf_ (no Request, no copy of the value), after
  // connecting if needed: the 2.x opcode of `op`, then `key`. The caller appends the op's
  // other arguments (the layout encode_request writes) and calls send_framed(op). Blocks while
  // connecting; throws what ensure_connected throws.
  Bytes& begin_request(wire::Op op, const std::string& key);
  // Sends wbuf_; throws what send_raw throws.
  void send_framed(wire::Op op);
  void send_raw(const Bytes& bytes, const char* what);
  void recv_exact(void* dst, size_t n, std::chrono::steady_clock::time_point deadline,
                  const char* what, const std::string& key);
  uint8_t recv_u8(std::chrono::steady_clock::time_point deadline, const char* what,
                  const std::string& key = "");
  int64_t recv_i64(std::chrono::steady_clock::time_point deadline, const char* what,
                   const std::string& key = "");
  Bytes recv_bytes(std::chrono::steady_clock::time_point deadline, const char* what,
                   const std::string& key = "");
  void drop();
  void set_fd(int fd);
  bool interrupted();
  [[noreturn]] void throw_closed(const std::string& message);
  void set_recv_timeout(int ms);

  TcpStoreClientOptions options_;
  std::mutex mutex_;  // one request at a time; held for the whole call
  // Guards fd_ (its value, not I/O on it), busy_ and interrupted_; never held across I/O, so
  // interrupt() can take it while a call blocks.
  std::mutex state_mutex_;
  std::condition_variable interrupted_cv_;
  int fd_ = -1;
  bool busy_ = false;         // a call is in progress
  bool interrupted_ = false;  // interrupt() hit the call in progress
  int recv_timeout_ms_ = 0;   // SO_RCVTIMEO now set on fd_ (0: none)
  bool connected_once_ = false;  // a connection succeeded: later connects use reconnect_timeout
  uint32_t server_features_ = 0;   // wire::kFeature* bits from FEATURES (agents only)
  bool features_refused_ = false;  // the server closed on FEATURES: an older dlaunch build
  std::string will_;               // set_will()'s key, named again on every new connection
  Bytes wbuf_;                // the request being sent (reused)
  // Received bytes: [rpos_, rend_) not yet consumed. Not zero-filled: a connection's replies
  // are small, so only the pages recv() writes are ever touched (a zero-filled 64 KiB was 16
  // page faults per connection, three connections per agent, 1,024 agents at one start).
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rpos_ = 0, rend_ = 0;
};

}  // namespace dlaunch
