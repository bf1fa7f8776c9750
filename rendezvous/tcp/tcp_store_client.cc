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
#include "rendezvous/tcp/wait_notes.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/tcp/name_wait.h"

namespace dlaunch {

using SteadyTime = std::chrono::steady_clock;
using wire::Op;
using wire::Request;

namespace {

int remaining_ms(SteadyTime::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyTime::now());
  if (left.count() <= 0) return 0;
  return left.count() > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(left.count());
}

// Saturating "now + d": the default timeouts must not overflow the clock.
SteadyTime::time_point deadline_after(Duration d) {
  auto now = SteadyTime::now();
  if (d > SteadyTime::time_point::max() - now) return SteadyTime::time_point::max();
  return now + d;
}

// The store's host name did not resolve (yet): retried at the name's own pace, and the final
// error says what was looked up and what the resolver answered.
class NameNotResolvedError : public ConnectionError {
 public:
  NameNotResolvedError(const std::string& host, std::string answer)
      : ConnectionError(fmt::format("cannot resolve '{}': {}", host, answer)),
        answer_(std::move(answer)) {}
  const std::string& answer() const { return answer_; }

 private:
  std::string answer_;
};

constexpr auto kFirstBackoff = std::chrono::milliseconds(20);

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

void TcpStoreClient::ensure_connected() {
  if (fd_ >= 0) return;
  const Duration bound = connected_once_ && options_.reconnect_timeout
                             ? *options_.reconnect_timeout
                             : options_.connect_timeout;
  auto deadline = deadline_after(bound);
  Duration backoff = kFirstBackoff;
  std::string last_error;
  // The last attempt connected and the peer did not answer its handshake; `judged_silent`: an
  // attempt gave it the whole handshake_timeout (the last may be cut short by `deadline`).
  bool silent_peer = false;
  bool judged_silent = false;
  bool every_attempt_refused = true;  // nothing listens: StoreRefusedError, not silence
  // The name did not resolve at the last attempt (its resolver's answer), and at every one.
  std::optional<std::string> unresolved;
  bool never_resolved = true;
  const auto started = SteadyTime::now();
  WaitNotes notes(started, options_.first_waiting_note);
  while (true) {
    silent_peer = false;
    const bool was_unresolved = unresolved.has_value();
    unresolved.reset();
    try {
      connect_once(deadline);
      // A peer that was a store before and is silent now is a store in trouble, and a
      // handshake cut short by the connect's own bound proves nothing.
      const auto handshake_deadline = deadline_after(options_.handshake_timeout);
      const bool judge = !connected_once_ && handshake_deadline < deadline;
      try {
        handshake(std::min(deadline, handshake_deadline));
      } catch (const TimeoutError&) {
        silent_peer = true;
        if (judge && !judged_silent) {
          judged_silent = true;
          log_warning("{}; still trying, up to {:g} s, in case it is a store too busy to "
                      "answer; check that no other service listens on that port",
                      silent_answer(), to_seconds(bound));
        }
        throw;
      }
      connected_once_ = true;
      return;
    } catch (const NameNotResolvedError& e) {
      drop();
      unresolved = e.answer();
      last_error = e.what();
      every_attempt_refused = false;
    } catch (const ConnectionError& e) {
      drop();
      last_error = e.what();
      if (!dynamic_cast<const StoreRefusedError*>(&e)) every_attempt_refused = false;
    } catch (const ClosedError& e) {
      // The server accepted and then closed: it is starting up, or overloaded. Retry.
      drop();
      last_error = e.what();
      every_attempt_refused = false;
    } catch (const TimeoutError& e) {
      drop();
      last_error = e.what();
      every_attempt_refused = false;
    }
    if (!unresolved) never_resolved = false;
    // A name that does not resolve is looked up at its own steady pace; once it resolves, the
    // host behind it is given the quick retries of a fresh start (it is probably starting up
    // right now), so the job forms within a second after the name appears.
    if (unresolved) {
      backoff = kNameRetryInterval;
    } else if (was_unresolved) {
      backoff = kFirstBackoff;
    }
    silent_peer = silent_peer && judged_silent;
    if (silent_peer) last_error = silent_answer();
    if (SteadyTime::now() + backoff >= deadline) break;
    if (!connected_once_ && notes.due(SteadyTime::now())) {
      note_waiting(last_error, unresolved, silent_peer, started, bound);
    }
    {
      // Back off, but wake at once for interrupt().
      std::unique_lock<std::mutex> lock(state_mutex_);
      interrupted_cv_.wait_for(lock, backoff, [&] { return interrupted_; });
    }
    if (interrupted()) throw_closed("");
    if (!unresolved) backoff = std::min<Duration>(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (interrupted()) throw_closed("");
  if (silent_peer) {
    throw ConnectionError(not_a_store(fmt::format(
        "for {:g} s it accepted connections and never answered the store handshake (each "
        "given {:g} s); another service holds the port: stop it, or give the job a free port "
        "(--rdzv_endpoint for c10d, --master_port for static)",
        to_seconds(bound), to_seconds(options_.handshake_timeout))));
  }
  if (unresolved) {
    throw ConnectionError(fmt::format(
        "cannot reach the store at {} within {:g} s: its host name '{}' {} (the resolver's "
        "last answer: {}); the store is hosted by the agent of node rank 0 (static) or the one "
        "owning --rdzv_endpoint (c10d); {}",
        endpoint(), to_seconds(bound), options_.host,
        never_resolved ? "never resolved" : "stopped resolving", *unresolved,
        unresolved_name_advice(options_.host)));
  }
  std::string message = fmt::format(
      "cannot reach the store at {} within {:g} s (last error: {}); check that the agent "
      "hosting it (node rank 0, or the owner of --rdzv_endpoint) is running, that the address "
      "and port are right, and that no firewall blocks the port",
      endpoint(), to_seconds(bound), last_error);
  if (every_attempt_refused) throw StoreRefusedError(message);
  throw ConnectionError(message);
}

void TcpStoreClient::note_waiting(const std::string& last_error,
                                  const std::optional<std::string>& unresolved, bool silent_peer,
                                  SteadyTime::time_point started, Duration bound) const {
  const double so_far = to_seconds(SteadyTime::now() - started);
  if (unresolved) {
    log_info("still waiting for the store at {} ({:.0f} s so far, up to {:g} s): its host name "
             "'{}' does not resolve yet ({}); looking it up again every {:g} s. It is hosted by "
             "the agent of node rank 0 (static) or the one owning --rdzv_endpoint (c10d), "
             "whose name may resolve only once that host is up (a Kubernetes pod)",
             endpoint(), so_far, to_seconds(bound), options_.host, *unresolved,
             to_seconds(kNameRetryInterval));
  } else if (silent_peer) {
    log_info("still waiting for the store at {} ({:.0f} s so far, up to {:g} s): {}", endpoint(),
             so_far, to_seconds(bound), last_error);
  } else {
    log_info("still waiting for the store at {} ({:.0f} s so far, up to {:g} s; last error: "
             "{}); it is hosted by the agent of node rank 0 (static) or the one owning "
             "--rdzv_endpoint (c10d): start it, or check its address and port",
             endpoint(), so_far, to_seconds(bound), last_error);
  }
}

std::string TcpStoreClient::silent_answer() const {
  return not_a_store(
      fmt::format("it accepts connections but did not answer the store handshake within {:g} s",
                  to_seconds(options_.handshake_timeout)));
}

std::string TcpStoreClient::not_a_store(const std::string& why) const {
  return fmt::format("{} answers but is not a dlaunch or PyTorch store: {}", endpoint(), why);
}

void TcpStoreClient::throw_not_a_store(const std::string& why) {
  drop();
  throw StateError(not_a_store(why) +
                   "; another service holds the port: stop it, or give the job a free port "
                   "(--rdzv_endpoint for c10d, --master_port for static)");
}

void TcpStoreClient::connect_once(SteadyTime::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(options_.port);
  // Resolved at every attempt, never cached: the name may appear late, or move.
  int rc = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) throw NameNotResolvedError(options_.host, gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> free_res(res, freeaddrinfo);
  std::string error = "no address";
  bool every_address_refused = true;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      every_address_refused = false;
      continue;
    }
    set_fd(fd);  // from here on interrupt() can shut it down
    if (interrupted()) throw_closed("");
    int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int pr;
      do {
        pr = ::poll(&p, 1, remaining_ms(deadline));
      } while (pr < 0 && errno == EINTR);
      if (pr == 0) {
        drop();
        throw TimeoutError("connect timed out");
      }
      int soerr = 0;
      socklen_t len = sizeof(soerr);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      r = soerr == 0 ? 0 : -1;
      errno = soerr;
    }
    if (r != 0) {
      if (errno != ECONNREFUSED) every_address_refused = false;
      error = std::strerror(errno);
      drop();
      if (interrupted()) throw_closed("");
      continue;
    }
    // Blocking from here on; receives are bounded with SO_RCVTIMEO (see recv_exact).
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return;
  }
  if (every_address_refused && res != nullptr) throw StoreRefusedError(error);
  throw ConnectionError(error);
}

void TcpStoreClient::handshake(SteadyTime::time_point deadline) {
  Bytes hello;
  wire::put_u8(hello, wire::op2::kValidate);
  wire::put_u32(hello, wire::kValidationMagic);
  // Only agents ask what the server can do (one round trip more per connection): a worker's
  // client may face PyTorch's own server, which knows no FEATURES, and a server that closed
  // on it once is not asked again.
  const bool ask_features = options_.agent && !features_refused_;
  if (!options_.token) {
    if (options_.agent) wire::put_u8(hello, wire::op2::kDeclareAgent);
    // Confirm that a store answers (not some other service on the port).
    wire::put_u8(hello, wire::op2::kPing);
    uint32_t nonce = static_cast<uint32_t>(::getpid()) ^ 0x5eed;
    wire::put_u32(hello, nonce);
    send_raw(hello, "PING");
    if (options_.agent) {
      uint8_t declared = recv_dlaunch_reply(deadline, "DECLARE_AGENT");
      if (declared == wire::kDeclareRefusedNoToken) {
        drop();
        throw UsageError(
            fmt::format("the store at {} refused this agent: this job requires a job token "
                        "(DLAUNCH_JOB_TOKEN) and this agent has none; give every node the job's "
                        "DLAUNCH_JOB_TOKEN (or the same token_file= in --rdzv_conf)",
                        endpoint()));
      }
      if (declared != 0) {
        throw_not_a_store(fmt::format("it answered the handshake with byte 0x{:02x}, where a "
                                      "store answers 0x00",
                                      declared));
      }
    }
    uint8_t buf[4];
    recv_exact(buf, 4, deadline, "PING", "");
    const uint32_t echoed = load_le<uint32_t>(buf);
    if (echoed != nonce) {
      throw_not_a_store(fmt::format(
          "it answered the handshake's PING with 0x{:08x}, where a store echoes 0x{:08x}", echoed,
          nonce));
    }
    if (ask_features) read_features(deadline);
    declare_run(deadline);
    return;
  }
  Request begin;
  begin.op = Op::kAuthBegin;
  begin.digest = random_nonce();
  wire::encode_request(wire::Dialect::kTorch2, begin, hello);
  send_raw(hello, "AUTH_BEGIN");
  uint8_t mode = recv_dlaunch_reply(deadline, "AUTH_BEGIN");
  if (mode > 1) {
    throw_not_a_store(fmt::format(
        "it answered the handshake with byte 0x{:02x}, where a store answers 0x00 or 0x01", mode));
  }
  wire::Digest server_nonce, proof;
  recv_exact(server_nonce.data(), server_nonce.size(), deadline, "AUTH_BEGIN", "");
  recv_exact(proof.data(), proof.size(), deadline, "AUTH_BEGIN", "");
  if (mode != 1) {
    drop();
    throw StateError(fmt::format(
        "the store at {} does not use a job token but this process has one "
        "(DLAUNCH_JOB_TOKEN): it may be another job's store on the same port; check "
        "--master_port / --rdzv_endpoint, or unset the token on every node",
        endpoint()));
  }
  auto expected = server_proof(*options_.token, begin.digest, server_nonce);
  if (!constant_time_equal(expected.data(), proof.data(), proof.size())) {
    drop();
    throw StateError(fmt::format(
        "the store at {} does not know this job's token: it is another job's store, or the "
        "nodes were given different DLAUNCH_JOB_TOKEN values",
        endpoint()));
  }
  Request answer;
  answer.op = Op::kAuthProof;
  answer.digest = client_proof(*options_.token, begin.digest, server_nonce);
  Bytes msg;
  wire::encode_request(wire::Dialect::kTorch2, answer, msg);
  if (options_.agent) wire::put_u8(msg, wire::op2::kDeclareAgent);
  send_raw(msg, "AUTH_PROOF");
  try {
    if (recv_u8(deadline, "AUTH_PROOF") != 0) throw ClosedError("refused");
    if (options_.agent) recv_u8(deadline, "DECLARE_AGENT");
  } catch (const ClosedError&) {
    throw StateError(fmt::format(
        "the store at {} refused this process's job token; give every node the same "
        "DLAUNCH_JOB_TOKEN",
        endpoint()));
  }
  if (ask_features) read_features(deadline);
  declare_run(deadline);
}

uint8_t TcpStoreClient::recv_dlaunch_reply(SteadyTime::time_point deadline, const char* what) {
  try {
    return recv_u8(deadline, what);
  } catch (const StoreInterruptedError&) {
    throw;
  } catch (const ClosedError&) {
    refuse_if_foreign_store(deadline);
    throw;
  }
}

void TcpStoreClient::refuse_if_foreign_store(SteadyTime::time_point deadline) {
  // The close may also be a dlaunch store starting up or shedding load, so it is judged only on
  // a second connection that asks PyTorch's PING first and dlaunch's op alone after the echo: a
  // store that answers the one and then closes on the other does not know the op. A dlaunch
  // store answers both (DECLARE_AGENT without a token is answered 1; AUTH_BEGIN always), so
  // only a foreign store is refused. Anything else: the caller's close stands and the connect
  // goes on retrying.
  deadline = std::min(deadline, deadline_after(options_.handshake_timeout));
  const char* ours_name = options_.token ? "AUTH_BEGIN" : "DECLARE_AGENT";
  bool echoed = false;
  try {
    drop();
    connect_once(deadline);
    Bytes probe;
    wire::put_u8(probe, wire::op2::kValidate);
    wire::put_u32(probe, wire::kValidationMagic);
    wire::put_u8(probe, wire::op2::kPing);
    const uint32_t nonce = 0xD1A0C0DE;
    wire::put_u32(probe, nonce);
    send_raw(probe, "PING");
    uint8_t buf[4];
    recv_exact(buf, 4, deadline, "PING", "");
    if (load_le<uint32_t>(buf) != nonce) return drop();
    echoed = true;
    Bytes ours;
    if (options_.token) {
      Request begin;
      begin.op = Op::kAuthBegin;
      begin.digest = random_nonce();
      wire::encode_request(wire::Dialect::kTorch2, begin, ours);
    } else {
      wire::put_u8(ours, wire::op2::kDeclareAgent);
    }
    send_raw(ours, ours_name);
    recv_u8(deadline, ours_name);
  } catch (const StoreInterruptedError&) {
    throw;
  } catch (const ClosedError&) {
    if (echoed) {
      throw UsageError(fmt::format(
          "the store at {} is not a dlaunch store: it answers PyTorch's store requests but "
          "closed the connection on dlaunch's {} (it is PyTorch's own TCPStore, such as "
          "torchrun's); dlaunch agents meet only on a store a dlaunch agent hosts: give this "
          "job a --rdzv_endpoint (or --master_port) that no torchrun uses, and the first "
          "dlaunch agent there hosts the store",
          endpoint(), ours_name));
    }
  } catch (const Error&) {
  }
  drop();  // it answered (a dlaunch store after all), or proved nothing: the caller retries
}

void TcpStoreClient::declare_run(SteadyTime::time_point deadline) {
  if (options_.run_id.empty() || !(server_features_ & wire::kFeatureDeclareRun)) return;
  Request declare;
  declare.op = Op::kDeclareRun;
  declare.keys = {options_.run_id};
  send_request(declare);
  if (recv_u8(deadline, "DECLARE_RUN") == wire::kDeclareAccepted) return;
  std::string theirs = to_string(recv_bytes(deadline, "DECLARE_RUN"));
  drop();
  throw UsageError(fmt::format(
      "the store at {} serves run '{}'; this agent's run is '{}': give this job its own "
      "--rdzv_endpoint (or the same --rdzv_id, if it is the same job)",
      endpoint(), theirs, options_.run_id));
}

void TcpStoreClient::read_features(SteadyTime::time_point deadline) {
  // Asked alone, once the rest of the handshake was answered: an older server closes the
  // connection on it and drops the replies still queued with it, so only a close right here
  // tells that it does not know the op.
  Bytes ask;
  wire::put_u8(ask, wire::op2::kFeatures);
  send_raw(ask, "FEATURES");
  uint8_t buf[4];
  try {
    recv_exact(buf, 4, deadline, "FEATURES", "");
  } catch (const StoreInterruptedError&) {
    throw;
  } catch (const ClosedError&) {
    // It answered everything before and closed on FEATURES: a dlaunch server older than the
    // op (an unknown opcode closes the connection). Connect again without asking; this client
    // then uses only the requests every dlaunch server knows.
    features_refused_ = true;
    server_features_ = 0;
    static std::atomic<bool> said{false};  // once per process, not per connection
    if (!said.exchange(true)) {
      log_info("the store at {} is an older dlaunch build (it does not know FEATURES): this "
               "agent uses the older requests with it (more round trips per rendezvous round)",
               endpoint());
    }
    throw;
  }
  server_features_ = load_le<uint32_t>(buf);
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
