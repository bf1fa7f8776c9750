#include "rendezvous/tcp/tcp_store_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "common/byte_order.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/host_port.h"

namespace dlaunch {

using SteadyTime = std::chrono::steady_clock;
using wire::Op;
using wire::Request;

namespace {

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 5; ++i) {
    if (i) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > 5) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

}  // namespace

// One call: holds mutex_ for its duration and marks it in progress for interrupt(); when the
// call was interrupted, drops the connection on the way out (its socket was shut down under it,
// even if the call still finished).
class TcpStoreClient::CallScope {
 public:
  explicit CallScope(TcpStoreClient& c) : c_(c), lock_(c.mutex_) {
    std::lock_guard<std::mutex> lock(c_.state_mutex_);
    c_.busy_ = true;
  }
  ~CallScope() {
    bool hit;
    {
      std::lock_guard<std::mutex> lock(c_.state_mutex_);
      c_.busy_ = false;
      hit = c_.interrupted_;
      c_.interrupted_ = false;
    }
    if (hit) c_.drop();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  TcpStoreClient& c_;
  std::lock_guard<std::mutex> lock_;
};

TcpStoreClient::TcpStoreClient(TcpStoreClientOptions options) : options_(std::move(options)) {
  set_timeout(options_.timeout);
  if (options_.lazy_connect) return;
  CallScope call(*this);
  ensure_connected();
}

TcpStoreClient::~TcpStoreClient() { drop(); }

std::string TcpStoreClient::endpoint() const {
  return HostPort{options_.host, options_.port}.to_string();
}

void TcpStoreClient::interrupt() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (!busy_) return;
  interrupted_ = true;
  // Wakes a blocked connect/send/recv/poll on this socket: recv sees EOF, send EPIPE.
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  interrupted_cv_.notify_all();
}

bool TcpStoreClient::interrupted() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return interrupted_;
}

void TcpStoreClient::throw_closed(const std::string& message) {
  if (interrupted()) {
    throw StoreInterruptedError(fmt::format(
        "store {}: the call was interrupted by another thread (interrupt())", endpoint()));
  }
  throw ClosedError(message);
}

void TcpStoreClient::set_fd(int fd) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  fd_ = fd;
}

void TcpStoreClient::drop() {
  rpos_ = rend_ = 0;
  recv_timeout_ms_ = 0;
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void TcpStoreClient::send_raw(const Bytes& bytes, const char* what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      drop();
      throw_closed(std::string("store ") + endpoint() + ": sending " + what + " failed (" +
                   std::strerror(err) + "); the server closed the connection: is the "
                   "agent hosting the store still running?");
    }
    sent += static_cast<size_t>(n);
  }
}

void TcpStoreClient::send_request(const Request& request) {
  wbuf_.clear();
  wire::encode_request(wire::Dialect::kTorch2, request, wbuf_);
  send_raw(wbuf_, wire::op_name(request.op));
}

void TcpStoreClient::set_recv_timeout(int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0) recv_timeout_ms_ = ms;
}

void TcpStoreClient::recv_exact(void* dst, size_t n, SteadyTime::time_point deadline,
                                const char* what, const std::string& key) {
  constexpr size_t kRecvBuffer = 64 * 1024;
  auto* p = static_cast<uint8_t*>(dst);
  size_t got = 0;
  while (got < n) {
    // Serve from the receive buffer first: a MULTI_GET reply of 1,000 values is then a few
    // recv() calls, not two per value.
    if (rpos_ < rend_) {
      size_t take = std::min(n - got, rend_ - rpos_);
      std::memcpy(p + got, rbuf_.get() + rpos_, take);
      rpos_ += take;
      got += take;
      continue;
    }
    int left = remaining_ms(deadline);
    if (left <= 0) {
      drop();  // the server forgets a parked request when its connection closes
      throw TimeoutError(fmt::format("store {}: {}{} got no answer in time", endpoint(), what,
                                     key.empty() ? "" : fmt::format(" '{}'", key)));
    }
    // One blocking recv() per reply rather than poll() + recv(): SO_RCVTIMEO bounds it. It is
    // re-armed only when it would overshoot the deadline noticeably or is far too short, so a
    // run of calls with the same timeout sets it once.
    if (recv_timeout_ms_ == 0 || recv_timeout_ms_ > left + std::max(20, left / 64) ||
        recv_timeout_ms_ < left / 2) {
      set_recv_timeout(left);
    }
    const bool direct = n - got >= kRecvBuffer;  // a large value: straight into place
    uint8_t* into;
    size_t room;
    if (direct) {
      into = p + got;
      room = n - got;
    } else {
      if (!rbuf_) rbuf_.reset(new uint8_t[kRecvBuffer]);  // uninitialised on purpose
      into = rbuf_.get();
      room = kRecvBuffer;
    }
    ssize_t r = ::recv(fd_, into, room, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      continue;  // a signal, or SO_RCVTIMEO fired: the loop checks the deadline
    }
    if (r <= 0) {
      int err = r < 0 ? errno : 0;
      drop();
      throw_closed(std::string("store ") + endpoint() + " closed the connection during " +
                   what + (key.empty() ? "" : " '" + key + "'") +
                   (err ? std::string(" (") + std::strerror(err) + ")" : "") +
                   (options_.token ? "; the agent hosting the store probably exited, or "
                                     "refused this client's job token"
                                   : "; the agent hosting the store probably exited"));
    }
    if (direct) {
      got += static_cast<size_t>(r);
    } else {
      rpos_ = 0;
      rend_ = static_cast<size_t>(r);
    }
  }
}

uint8_t TcpStoreClient::recv_u8(SteadyTime::time_point deadline, const char* what,
                                const std::string& key) {
  uint8_t v;
  recv_exact(&v, 1, deadline, what, key);
  return v;
}

int64_t TcpStoreClient::recv_i64(SteadyTime::time_point deadline, const char* what,
                                 const std::string& key) {
  uint8_t buf[8];
  recv_exact(buf, 8, deadline, what, key);
  return load_le<int64_t>(buf);
}

Bytes TcpStoreClient::recv_bytes(SteadyTime::time_point deadline, const char* what,
                                 const std::string& key) {
  uint8_t buf[8];
  recv_exact(buf, 8, deadline, what, key);
  uint64_t n = load_le<uint64_t>(buf);
  if (n > wire::Limits().max_frame_bytes) {
    drop();
    throw ProtocolError(fmt::format("store {}: reply of {} bytes to {} is over the frame limit",
                                    endpoint(), n, what));
  }
  Bytes value(n);
  if (n) recv_exact(value.data(), n, deadline, what, key);
  return value;
}

namespace {
Request make(Op op, std::vector<std::string> keys = {}, std::vector<Bytes> values = {}) {
  Request q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  return q;
}
}  // namespace

Bytes& TcpStoreClient::begin_request(Op op, const std::string& key) {
  ensure_connected();
  wbuf_.clear();
  wire::put_u8(wbuf_, wire::opcode(wire::Dialect::kTorch2, op));
  wire::put_string(wbuf_, key);
  return wbuf_;
}

void TcpStoreClient::send_framed(Op op) { send_raw(wbuf_, wire::op_name(op)); }

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  CallScope call(*this);
  Bytes& frame = begin_request(Op::kSet, key);
  wire::put_bytes(frame, value);
  send_framed(Op::kSet);
}

Bytes TcpStoreClient::get(const std::string& key) {
  CallScope call(*this);
  if (!options_.agent) wait_locked({key}, timeout());
  begin_request(Op::kGet, key);
  send_framed(Op::kGet);
  try {
    return recv_bytes(deadline_after(timeout()), "GET", key);
  } catch (const TimeoutError&) {
    throw TimeoutError(fmt::format("store {}: key '{}' did not appear within {:g} s", endpoint(),
                                   key, to_seconds(timeout())));
  }
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  CallScope call(*this);
  Bytes& frame = begin_request(Op::kAdd, key);
  wire::put_i64(frame, delta);
  send_framed(Op::kAdd);
  return recv_i64(deadline_after(timeout()), "ADD", key);
}

Bytes TcpStoreClient::compare_set(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  CallScope call(*this);
  Bytes& frame = begin_request(Op::kCompareSet, key);
  wire::put_bytes(frame, expected);
  wire::put_bytes(frame, desired);
  send_framed(Op::kCompareSet);
  return recv_bytes(deadline_after(timeout()), "COMPARE_SET", key);
}

void TcpStoreClient::connect() {
  CallScope call(*this);
  ensure_connected();
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  CallScope call(*this);
  ensure_connected();
  send_request(make(Op::kCheck, keys));
  uint8_t r = recv_u8(deadline_after(timeout()), "CHECK");
  if (r != wire::kCheckReady && r != wire::kCheckNotReady) {
    drop();
    throw ProtocolError(fmt::format(
        "store {}: CHECK answered {}, expected 0 (ready) or 1 (not ready)", endpoint(), r));
  }
  return r == wire::kCheckReady;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, Duration timeout) {
  CallScope call(*this);
  wait_locked(keys, timeout);
}

void TcpStoreClient::wait_locked(const std::vector<std::string>& keys, Duration timeout) {
  ensure_connected();
  send_request(make(Op::kWait, keys));
  // Poll for the answer ourselves: on timeout we cancel the parked WAIT (2.x CANCEL_WAIT) and
  // keep the connection, so callers may wait in short slices cheaply.
  auto wait_deadline = deadline_after(timeout);
  bool ready = rpos_ < rend_;  // an answer may already be buffered
  while (!ready) {
    pollfd pfd{fd_, POLLIN, 0};
    int pr = ::poll(&pfd, 1, remaining_ms(wait_deadline));
    if (pr > 0) {
      ready = true;
    } else if (pr < 0 && errno == EINTR) {
      continue;
    } else if (pr < 0) {
      int err = errno;
      drop();
      throw SystemError(errno_message("poll on the store connection", err));
    } else {
      break;  // timed out
    }
  }
  auto answer_deadline = deadline_after(Store::timeout());
  if (!ready) {
    Bytes cancel;
    wire::put_u8(cancel, wire::op2::kCancelWait);
    send_raw(cancel, "CANCEL_WAIT");
    uint8_t r = recv_u8(answer_deadline, "CANCEL_WAIT");
    bool raced = r == wire::kStopWaiting;  // the keys came just before the cancel
    if (raced) r = recv_u8(answer_deadline, "CANCEL_WAIT");
    if (r != wire::kWaitCanceled) {
      drop();
      throw ProtocolError(fmt::format(
          "store {}: CANCEL_WAIT answered {}, expected WAIT_CANCELED (1)", endpoint(), r));
    }
    if (raced) return;
    throw TimeoutError(fmt::format("store {}: key(s) {} did not appear within {:g} s",
                                   endpoint(), describe_keys(keys), to_seconds(timeout)));
  }
  uint8_t r = recv_u8(answer_deadline, "WAIT");
  if (r != wire::kStopWaiting) {
    drop();
    throw ProtocolError(fmt::format("store {}: WAIT answered {}, expected STOP_WAITING (0)",
                                    endpoint(), r));
  }
}

WaitGetResult TcpStoreClient::wait_get(const std::vector<std::string>& keys, Duration timeout) {
  if (keys.empty()) return Store::wait_get(keys, timeout);  // usage error
  {
    CallScope call(*this);
    ensure_connected();
    if (server_features_ & wire::kFeatureWaitGet) {
      Request q = make(Op::kWaitGet, keys);
      // The server answers when the timeout passes (no CANCEL_WAIT round trip): at least 1 ms,
      // as 0 means no limit on the wire.
      q.timeout_ms = static_cast<uint64_t>(std::max<int64_t>(
          1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()));
      send_request(q);
      // The server's answer is due at the timeout; beyond that, the usual patience for a reply.
      auto deadline = deadline_after(timeout + Store::timeout());
      WaitGetResult result;
      uint8_t r = recv_u8(deadline, "WAIT_GET", keys[0]);
      if (r != wire::kStopWaiting && r != wire::kWaitTimedOut) {
        drop();
        throw ProtocolError(fmt::format(
            "store {}: WAIT_GET answered {}, expected STOP_WAITING (0) or WAIT_TIMED_OUT (2)",
            endpoint(), r));
      }
      result.ready = r == wire::kStopWaiting;
      result.values.reserve(keys.size());
      for (const auto& key : keys) {
        uint8_t present = recv_u8(deadline, "WAIT_GET", key);
        if (present > 1) {
          drop();
          throw ProtocolError(
              fmt::format("store {}: WAIT_GET marked '{}' {}, expected 1 (present) or 0 (absent)",
                          endpoint(), key, present));
        }
        if (present) {
          result.values.emplace_back(recv_bytes(deadline, "WAIT_GET", key));
        } else {
          result.values.emplace_back(std::nullopt);
        }
      }
      return result;
    }
  }
  // An older server: the same answer in several requests.
  return Store::wait_get(keys, timeout);
}

bool TcpStoreClient::delete_key(const std::string& key) {
  CallScope call(*this);
  begin_request(Op::kDeleteKey, key);
  send_framed(Op::kDeleteKey);
  return recv_i64(deadline_after(timeout()), "DELETE_KEY", key) == 1;
}

int64_t TcpStoreClient::num_keys() {
  CallScope call(*this);
  ensure_connected();
  send_request(make(Op::kNumKeys));
  return recv_i64(deadline_after(timeout()), "GETNUMKEYS");
}

std::vector<Bytes> TcpStoreClient::multi_get(const std::vector<std::string>& keys) {
  CallScope call(*this);
  if (!options_.agent) wait_locked(keys, timeout());
  ensure_connected();
  send_request(make(Op::kMultiGet, keys));
  auto deadline = deadline_after(timeout());
  std::vector<Bytes> values;
  values.reserve(keys.size());
  try {
    for (size_t i = 0; i < keys.size(); ++i) {
      values.push_back(recv_bytes(deadline, "MULTI_GET", keys[i]));
    }
  } catch (const TimeoutError&) {
    throw TimeoutError(fmt::format("store {}: key(s) {} did not all appear within {:g} s",
                                   endpoint(), describe_keys(keys), to_seconds(timeout())));
  }
  return values;
}

void TcpStoreClient::multi_set(const std::vector<std::string>& keys,
                               const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) return Store::multi_set(keys, values);  // usage error
  CallScope call(*this);
  ensure_connected();
  send_request(make(Op::kMultiSet, keys, values));
}

void TcpStoreClient::append(const std::string& key, const Bytes& value) {
  CallScope call(*this);
  Bytes& frame = begin_request(Op::kAppend, key);
  wire::put_bytes(frame, value);
  send_framed(Op::kAppend);
}

int64_t TcpStoreClient::delete_prefix(const std::string& prefix) {
  CallScope call(*this);
  begin_request(Op::kDeletePrefix, prefix);
  send_framed(Op::kDeletePrefix);
  return recv_i64(deadline_after(timeout()), "DELETE_PREFIX", prefix);
}

bool TcpStoreClient::set_will(const std::string& key) {
  if (key.empty()) throw UsageError("set_will: no key; clear_will() forgets a will");
  CallScope call(*this);
  ensure_connected();  // a new connection names the previous will, replaced just below
  if (!(server_features_ & wire::kFeatureWill)) return false;
  will_ = key;
  send_will(will_, deadline_after(timeout()));
  return true;
}

void TcpStoreClient::clear_will() {
  CallScope call(*this);
  if (will_.empty()) return;
  will_.clear();
  // Without a connection there is no will on the server to clear: the last one was carried
  // out when that connection ended.
  if (fd_ < 0) return;
  send_will("", deadline_after(timeout()));
}

bool TcpStoreClient::ping() {
  CallScope call(*this);
  ensure_connected();
  Request q = make(Op::kPing);
  q.u32 = 0xC0FFEE;
  send_request(q);
  uint8_t buf[4];
  recv_exact(buf, 4, deadline_after(timeout()), "PING", "");
  return load_le<uint32_t>(buf) == q.u32;
}

}  // namespace dlaunch
