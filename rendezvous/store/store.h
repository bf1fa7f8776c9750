// The key-value store every part of a job meets through: rendezvous state, worker bootstrap
// (NCCL unique id, CPU collective peers), barriers. One small abstract interface, several
// implementations (in-memory for tests, TCP client against the agent's server, prefix wrapper,
// etcd). Modelled on gloo's rendezvous::Store and c10d's Store.
//
// Blocking and timeouts: get() and wait() block until every key exists or the store's timeout
// (set_timeout, default 300 s) passes, then throw TimeoutError. All other calls return as soon
// as the backend answers. Implementations are thread-safe: any method may be called from any
// thread at any time.
//
// Errors: TimeoutError (deadline), ConnectionError/ClosedError (the backend went away),
// ProtocolError (the backend answered nonsense). Values are opaque bytes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"

namespace dlaunch {

using Bytes = std::vector<uint8_t>;

inline Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// A blocked call was ended by Store::interrupt() from another thread (not by the backend).
class StoreInterruptedError : public ClosedError {
 public:
  using ClosedError::ClosedError;
};

// Every attempt to connect to the store for its whole bound was refused: nothing listens at
// its address. Unlike silence (a partition, an overloaded host), that is conclusive for a
// store hosted by an agent: the agent, and the store's keys with it, are gone.
class StoreRefusedError : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};

struct WaitGetResult {
  bool ready = false;  // the first key exists; false: the timeout passed first
  std::vector<std::optional<Bytes>> values;  // one per key, nullopt where it is missing
};

class Store {
 public:
  static constexpr Duration kDefaultTimeout = std::chrono::seconds(300);

  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists (or the timeout passes) and returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the integer stored at `key` (missing counts as 0) and returns the result.
  // Counters are stored as ASCII decimal, as c10d does, so get() on them reads "5". A key that
  // holds no counter, or a sum outside int64, is refused (ProtocolError; over TCP the server
  // drops the connection, so the client sees ClosedError) and the value stays.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // If the current value equals `expected` (a missing key equals an empty `expected`), stores
  // `desired`. Returns the value now stored (desired on success, the current value otherwise;
  // for a missing key with non-empty `expected`, returns `expected`, as c10d does).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // True when every key exists. Never blocks on missing keys.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists, or `timeout` passes (TimeoutError).
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Removes `key`; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Number of keys in the store (for a prefix store: in the whole underlying store, as c10d).
  virtual int64_t num_keys() = 0;
  // Several keys at once; multi_get blocks like get() until all exist.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys);
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);
  // Blocks until the first of `keys` exists or `timeout` passes, then returns the value of
  // each key as it is then (nullopt for a missing one: only the first is waited for), and
  // which of the two happened: a timeout is no error here. The TCP client does it in one
  // request where its server can (WAIT_GET, answered by the server at the timeout); the
  // default is a wait and then a check and a get per key (a key deleted between the two blocks
  // that get). Throws UsageError for no keys.
  virtual WaitGetResult wait_get(const std::vector<std::string>& keys, Duration timeout);

  // Optional: deleting every key under a prefix in one request. A dlaunch TCP store client has
  // it (the op is dlaunch's own: its server runs it), as has a prefix store over one; PyTorch's
  // protocol, etcd here and the in-memory store do not. The per-round namespace of workers'
  // keys (worker_namespace.h) needs it, so it is kept where workers meet.
  virtual bool can_delete_prefix() const { return false; }
  // Deletes every key starting with `prefix`; returns how many. Throws StateError where
  // can_delete_prefix() is false.
  virtual int64_t delete_prefix(const std::string& prefix);

  // Optional: this client's last will, as MQTT has one. The backend adds 1 to the counter at
  // `key` when this client's connection ends without clear_will() first: its process died
  // (the kernel closes a dead process's sockets), or the connection broke. A client that
  // connects again names the will again on its new connection, which takes it over (the old
  // connection's end, seen late, no longer counts). Returns whether the backend carries wills
  // out: a dlaunch TCP store client whose server has the op (WILL) does, as a prefix store
  // over one; PyTorch's servers, an older dlaunch server, etcd here and the in-memory store do
  // not, and nothing is registered then. Blocks while connecting; errors: the backend's.
  virtual bool set_will(const std::string& key) {
    (void)key;
    return false;
  }
  // Forgets the will, so that closing the connection now adds nothing (a clean exit).
  virtual void clear_will() {}

  // Ends a call blocked in get/wait on another thread, which then throws StoreInterruptedError;
  // later calls work as before. Where the backend cannot, or no call is blocked, it does
  // nothing, so a caller that must stop a thread repeats it until the thread is out (see
  // EventWatcher::stop). Never blocks, never throws.
  virtual void interrupt() {}
  // Opens the connection now where the backend opens it at the first call (a TcpStoreClient
  // with lazy_connect), so a caller can take the connect off a later, busier moment; throws
  // what that first call would. interrupt() ends it. Elsewhere nothing.
  virtual void connect() {}

  // Atomic: one thread may change the timeout while others are inside calls that read it.
  Duration timeout() const { return timeout_.load(std::memory_order_relaxed); }
  void set_timeout(Duration timeout) { timeout_.store(timeout, std::memory_order_relaxed); }

 private:
  std::atomic<Duration> timeout_{kDefaultTimeout};
};

}  // namespace dlaunch
