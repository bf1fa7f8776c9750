#include "rendezvous/tcp/tcp_store_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "common/byte_order.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/tcp/wait_notes.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/tcp/name_wait.h"

namespace dlaunch {

using SteadyTime = std::chrono::steady_clock;
using wire::Op;
using wire::Request;

namespace {

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

}  // namespace

// What the attempts of one ensure_connected() saw: the retry pace and the final error follow it.
struct TcpStoreClient::ConnectHistory {
  std::string last_error;
  // The last attempt connected and the peer did not answer its handshake; `judged_silent`: an
  // attempt gave it the whole handshake_timeout (the last may be cut short by the deadline).
  bool silent_peer = false;
  bool judged_silent = false;
  bool every_attempt_refused = true;  // nothing listens: StoreRefusedError, not silence
  // The name did not resolve at the last attempt (its resolver's answer), and at every one.
  std::optional<std::string> unresolved;
  bool never_resolved = true;
};

void TcpStoreClient::ensure_connected() {
  if (fd_ >= 0) return;
  const Duration bound = connected_once_ && options_.reconnect_timeout
                             ? *options_.reconnect_timeout
                             : options_.connect_timeout;
  auto deadline = deadline_after(bound);
  Duration backoff = kFirstBackoff;
  ConnectHistory seen;
  const auto started = SteadyTime::now();
  WaitNotes notes(started, options_.first_waiting_note);
  while (true) {
    const bool was_unresolved = seen.unresolved.has_value();
    if (attempt_connection(deadline, bound, seen)) return;
    if (!seen.unresolved) seen.never_resolved = false;
    // A name that does not resolve is looked up at its own steady pace; once it resolves, the
    // host behind it is given the quick retries of a fresh start (it is probably starting up
    // right now), so the job forms within a second after the name appears.
    if (seen.unresolved) {
      backoff = kNameRetryInterval;
    } else if (was_unresolved) {
      backoff = kFirstBackoff;
    }
    seen.silent_peer = seen.silent_peer && seen.judged_silent;
    if (seen.silent_peer) seen.last_error = silent_answer();
    if (SteadyTime::now() + backoff >= deadline) break;
    if (!connected_once_ && notes.due(SteadyTime::now())) note_waiting(seen, started, bound);
    {
      // Back off, but wake at once for interrupt().
      std::unique_lock<std::mutex> lock(state_mutex_);
      interrupted_cv_.wait_for(lock, backoff, [&] { return interrupted_; });
    }
    if (interrupted()) throw_closed("");
    if (!seen.unresolved) {
      backoff = std::min<Duration>(backoff * 2, std::chrono::milliseconds(1000));
    }
  }
  if (interrupted()) throw_closed("");
  throw_unreachable(bound, seen);
}

bool TcpStoreClient::attempt_connection(SteadyTime::time_point deadline, Duration bound,
                                        ConnectHistory& seen) {
  seen.silent_peer = false;
  seen.unresolved.reset();
  try {
    connect_once(deadline);
    // A peer that was a store before and is silent now is a store in trouble, and a
    // handshake cut short by the connect's own bound proves nothing.
    const auto handshake_deadline = deadline_after(options_.handshake_timeout);
    const bool judge = !connected_once_ && handshake_deadline < deadline;
    try {
      handshake(std::min(deadline, handshake_deadline));
    } catch (const TimeoutError&) {
      seen.silent_peer = true;
      if (judge && !seen.judged_silent) {
        seen.judged_silent = true;
        log_warning("{}; still trying, up to {:g} s, in case it is a store too busy to "
                    "answer; check that no other service listens on that port",
                    silent_answer(), to_seconds(bound));
      }
      throw;
    }
    connected_once_ = true;
    return true;
  } catch (const NameNotResolvedError& e) {
    seen.unresolved = e.answer();
    seen.last_error = e.what();
    seen.every_attempt_refused = false;
  } catch (const ConnectionError& e) {
    seen.last_error = e.what();
    if (!dynamic_cast<const StoreRefusedError*>(&e)) seen.every_attempt_refused = false;
  } catch (const ClosedError& e) {
    // The server accepted and then closed: it is starting up, or overloaded. Retry.
    seen.last_error = e.what();
    seen.every_attempt_refused = false;
  } catch (const TimeoutError& e) {
    seen.last_error = e.what();
    seen.every_attempt_refused = false;
  }
  drop();
  return false;
}

void TcpStoreClient::throw_unreachable(Duration bound, const ConnectHistory& seen) {
  if (seen.silent_peer) {
    throw ConnectionError(not_a_store(fmt::format(
        "for {:g} s it accepted connections and never answered the store handshake (each "
        "given {:g} s); another service holds the port: stop it, or give the job a free port "
        "(--rdzv_endpoint for c10d, --master_port for static)",
        to_seconds(bound), to_seconds(options_.handshake_timeout))));
  }
  if (seen.unresolved) {
    throw ConnectionError(fmt::format(
        "cannot reach the store at {} within {:g} s: its host name '{}' {} (the resolver's "
        "last answer: {}); the store is hosted by the agent of node rank 0 (static) or the one "
        "owning --rdzv_endpoint (c10d); {}",
        endpoint(), to_seconds(bound), options_.host,
        seen.never_resolved ? "never resolved" : "stopped resolving", *seen.unresolved,
        unresolved_name_advice(options_.host)));
  }
  std::string message = fmt::format(
      "cannot reach the store at {} within {:g} s (last error: {}); check that the agent "
      "hosting it (node rank 0, or the owner of --rdzv_endpoint) is running, that the address "
      "and port are right, and that no firewall blocks the port",
      endpoint(), to_seconds(bound), seen.last_error);
  if (seen.every_attempt_refused) throw StoreRefusedError(message);
  throw ConnectionError(message);
}

void TcpStoreClient::note_waiting(const ConnectHistory& seen, SteadyTime::time_point started,
                                  Duration bound) const {
  const double so_far = to_seconds(SteadyTime::now() - started);
  if (seen.unresolved) {
    log_info("still waiting for the store at {} ({:.0f} s so far, up to {:g} s): its host name "
             "'{}' does not resolve yet ({}); looking it up again every {:g} s. It is hosted by "
             "the agent of node rank 0 (static) or the one owning --rdzv_endpoint (c10d), "
             "whose name may resolve only once that host is up (a Kubernetes pod)",
             endpoint(), so_far, to_seconds(bound), options_.host, *seen.unresolved,
             to_seconds(kNameRetryInterval));
  } else if (seen.silent_peer) {
    log_info("still waiting for the store at {} ({:.0f} s so far, up to {:g} s): {}", endpoint(),
             so_far, to_seconds(bound), seen.last_error);
  } else {
    log_info("still waiting for the store at {} ({:.0f} s so far, up to {:g} s; last error: "
             "{}); it is hosted by the agent of node rank 0 (static) or the one owning "
             "--rdzv_endpoint (c10d): start it, or check its address and port",
             endpoint(), so_far, to_seconds(bound), seen.last_error);
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
  if (options_.token) {
    authenticate(hello, deadline);
  } else {
    ping_and_declare(hello, deadline);
  }
  if (ask_features) read_features(deadline);
  declare_run(deadline);
  // A connection that replaces a lost one carries the will on: the server hands it over from
  // the old connection, whose end (if the server sees it only now) then counts for nothing.
  if (!will_.empty() && (server_features_ & wire::kFeatureWill)) send_will(will_, deadline);
}

void TcpStoreClient::ping_and_declare(Bytes& hello, SteadyTime::time_point deadline) {
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
}

void TcpStoreClient::authenticate(Bytes& hello, SteadyTime::time_point deadline) {
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

void TcpStoreClient::send_will(const std::string& key, SteadyTime::time_point deadline) {
  Request will;
  will.op = Op::kWill;
  will.keys = {key};
  send_request(will);
  uint8_t r = recv_u8(deadline, "WILL", key);
  if (r != 0) {
    drop();
    throw ProtocolError(fmt::format("store {}: WILL answered {}, expected 0", endpoint(), r));
  }
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

}  // namespace dlaunch
