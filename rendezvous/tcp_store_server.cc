#include "rendezvous/tcp_store_server.h"

#include <sys/resource.h>

#include <cerrno>

#include <atomic>
#include <boost/asio.hpp>
#include <charconv>
#include <chrono>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"
#include "rendezvous/in_memory_store.h"
#include "rendezvous/job_token.h"
#include "rendezvous/worker_namespace.h"

namespace dlaunch {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Op;
using wire::Request;

namespace {

// Raises the soft open-file limit to the hard one, so one server can hold 10,000+ sockets.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    rlim_t old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) == 0) {
      log_debug("store server: raised the open-file limit from {} to {}", old, lim.rlim_max);
    }
  }
}

}  // namespace

struct TcpStoreServer::Impl {
  struct Conn;
  using ConnPtr = std::shared_ptr<Conn>;

  // One client connection. Touched only on the server thread.
  struct Conn : std::enable_shared_from_this<Conn> {
    Conn(Impl& s, tcp::socket sock) : srv(s), socket(std::move(sock)) {}

    Impl& srv;
    tcp::socket socket;
    std::string peer;         // "addr:port", for logs
    asio::ip::address peer_address;
    Bytes in;                 // received bytes; [in_begin, in.size()) not yet decoded
    Bytes rbuf;               // the buffer of the pending read
    size_t in_begin = 0;
    Bytes out_pending, out_writing;
    bool writing = false;
    bool reading = false;
    bool in_process = false;  // inside process(): replies collect in out_pending, one write
    bool closed = false;
    bool dialect_known = false;
    wire::Dialect dialect = wire::Dialect::kTorch113;
    // Job token state.
    bool authenticated = false;
    bool admitted = false;  // allowed to use the store (authenticated, or no token needed)
    bool auth_begun = false;
    wire::Digest client_nonce{}, server_nonce{};
    // Keys of a connection that did not declare itself an agent's get its round's worker
    // namespace (rendezvous/worker_namespace.h), fixed at its first key operation.
    bool agent = false;
    bool scope_known = false;
    std::string scope;
    // A parked GET/WAIT/MULTI_GET waiting for `awaiting` keys to appear.
    bool parked = false;
    Request parked_request;
    size_t awaiting = 0;
    bool process_posted = false;
  };

  explicit Impl(TcpStoreServerOptions o) : options(std::move(o)), acceptor(ctx), retry_timer(ctx) {}

  TcpStoreServerOptions options;
  // One thread runs this context: the hint lets Asio skip its internal locking.
  asio::io_context ctx{1};
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::thread thread;
  std::mutex lifecycle_mutex;
  bool started = false;
  bool stopped = false;
  uint16_t bound_port = 0;
  std::atomic<size_t> open_connections{0};

  // Decoded requests land here, reused (no allocation per request for short keys).
  Request scratch;

  // The store, touched only on the server thread.
  std::unordered_map<std::string, Bytes> table;
  std::unordered_map<std::string, std::deque<Bytes>> queues;
  std::unordered_map<std::string, std::vector<ConnPtr>> waiters;
  std::unordered_map<std::string, std::vector<std::weak_ptr<Conn>>> watchers;
  std::unordered_set<ConnPtr> connections;
  std::set<asio::ip::address> agent_hosts;  // peers that proved the token

  // Rate-limited logging of refused and malformed clients.
  std::chrono::steady_clock::time_point last_complaint{};
  size_t suppressed_complaints = 0;

  void complain(const std::string& message) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_complaint < std::chrono::seconds(1)) {
      ++suppressed_complaints;
      return;
    }
    last_complaint = now;
    if (suppressed_complaints > 0) {
      log_warning("store server: {} ({} similar messages suppressed)", message,
                  suppressed_complaints);
      suppressed_complaints = 0;
    } else {
      log_warning("store server: {}", message);
    }
  }

  // ---- accept -----------------------------------------------------------------------------

  void accept_next() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE/ENFILE) or a transient error: back off briefly rather
        // than spin on a listener that stays readable.
        complain("accept failed: " + ec.message() + "; retrying in 50 ms");
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](const boost::system::error_code& e) {
          if (!e) accept_next();
        });
        return;
      }
      boost::system::error_code ignore;
      sock.set_option(tcp::no_delay(true), ignore);
      auto conn = std::make_shared<Conn>(*this, std::move(sock));
      auto ep = conn->socket.remote_endpoint(ignore);
      conn->peer_address = ep.address();
      conn->peer = ep.address().is_v6() ? "[" + ep.address().to_string() + "]:" +
                                              std::to_string(ep.port())
                                        : ep.address().to_string() + ":" + std::to_string(ep.port());
      conn->admitted = !options.token.has_value();
      connections.insert(conn);
      open_connections.store(connections.size(), std::memory_order_relaxed);
      start_read(conn);
      accept_next();
    });
  }

  // ---- I/O --------------------------------------------------------------------------------

  void start_read(const ConnPtr& c) {
    if (c->closed || c->reading) return;
    // A parked client may send CANCEL_WAIT, so keep reading, but do not buffer without bound.
    if (c->in.size() - c->in_begin > options.limits.max_frame_bytes) {
      complain("client " + c->peer + " sent more than a frame while blocked; closing it");
      close(c);
      return;
    }
    // Read into a separate buffer: process() may run (posted) while this read is pending.
    size_t chunk = c->in.size() - c->in_begin > 4096 ? 65536 : 4096;
    if (c->rbuf.size() != chunk) c->rbuf.resize(chunk);
    c->reading = true;
    c->socket.async_read_some(
        asio::buffer(c->rbuf.data(), chunk),
        [this, c](const boost::system::error_code& ec, size_t n) {
          c->reading = false;
          if (c->closed) return;
          if (ec) {
            close(c);
            return;
          }
          if (c->in.empty()) {
            // The common case: nothing pending. Swap buffers instead of copying.
            c->rbuf.resize(n);
            c->in.swap(c->rbuf);
          } else {
            c->in.insert(c->in.end(), c->rbuf.begin(),
                         c->rbuf.begin() + static_cast<std::ptrdiff_t>(n));
          }
          process(c);
          start_read(c);
        });
  }

  // Replies are appended to c->out_pending in place, then replied(c) is called: it writes at
  // once, or at the end of process() when c is being processed, so all the replies to one
  // read go out in one write.
  void replied(const ConnPtr& c) {
    if (c->closed) {
      c->out_pending.clear();
      return;
    }
    // A client that sends requests but never reads the replies must not grow our memory.
    if (c->out_pending.size() > options.limits.max_frame_bytes) {
      complain("client " + c->peer + " does not read its replies; closing it");
      close(c);
      return;
    }
    if (!c->in_process) flush(c);
  }

  void send(const ConnPtr& c, const Bytes& bytes) {
    if (c->closed) return;
    c->out_pending.insert(c->out_pending.end(), bytes.begin(), bytes.end());
    replied(c);
  }

  void flush(const ConnPtr& c) {
    if (c->writing || c->out_pending.empty() || c->closed) return;
    c->out_writing.swap(c->out_pending);
    c->out_pending.clear();
    c->writing = true;
    asio::async_write(c->socket, asio::buffer(c->out_writing),
                      [this, c](const boost::system::error_code& ec, size_t) {
                        c->writing = false;
                        c->out_writing.clear();
                        // Keep small buffers for the next replies, not a big one's memory
                        // (10,000 connections x one large MULTI_GET each would add up).
                        if (c->out_writing.capacity() > (1u << 20)) Bytes().swap(c->out_writing);
                        if (ec) {
                          close(c);
                          return;
                        }
                        flush(c);
                      });
  }

  void close(const ConnPtr& c) {
    if (c->closed) return;
    c->closed = true;
    if (c->auth_begun && !c->authenticated) {  // a client checks our proof first, then leaves
      note_job_token_refusal();
      complain("refused client " + c->peer + ": " +
               (options.token ? "its job token differs from this store's"
                              : "it has a job token, this store none") +
               " (give every node the same DLAUNCH_JOB_TOKEN)");
    }
    if (c->parked) unpark(c);
    boost::system::error_code ignore;
    c->socket.shutdown(tcp::socket::shutdown_both, ignore);
    c->socket.close(ignore);
    c->out_pending.clear();
    connections.erase(c);
    open_connections.store(connections.size(), std::memory_order_relaxed);
  }

  void bad_frame(const ConnPtr& c, const std::string& why) {
    complain("closing client " + c->peer + ": " + why);
    close(c);
  }

  // ---- decoding ---------------------------------------------------------------------------

  void process(const ConnPtr& c) {
    c->in_process = true;
    process_frames(c);
    c->in_process = false;
    if (!c->closed) flush(c);
    // Compact the input buffer.
    if (c->in_begin > 0) {
      c->in.erase(c->in.begin(), c->in.begin() + static_cast<std::ptrdiff_t>(c->in_begin));
      c->in_begin = 0;
      if (c->in.empty() && c->in.capacity() > 65536) Bytes().swap(c->in);
    }
  }

  // Decodes and handles every complete frame in c->in.
  void process_frames(const ConnPtr& c) {
    Request& q = scratch;
    while (!c->closed) {
      const uint8_t* data = c->in.data() + c->in_begin;
      size_t size = c->in.size() - c->in_begin;
      if (!c->dialect_known) {
        auto d = wire::detect_dialect(data, size, options.limits);
        if (d.status == wire::Status::kNeedMore) break;
        if (d.status == wire::Status::kBad) return bad_frame(c, d.error);
        c->dialect_known = true;
        c->dialect = d.dialect;
        c->in_begin += d.consumed;
        continue;
      }
      auto r = wire::decode_request(c->dialect, data, size, options.limits, &q);
      if (r.status == wire::Status::kNeedMore) break;
      if (r.status == wire::Status::kBad) return bad_frame(c, r.error);
      if (c->parked) {
        // Only CANCEL_WAIT may overtake a parked request; anything else waits its turn.
        if (q.op != Op::kCancelWait) break;
        c->in_begin += r.consumed;
        unpark(c);
        wire::put_u8(c->out_pending, wire::kWaitCanceled);
        replied(c);
        continue;
      }
      c->in_begin += r.consumed;
      handle(c, q);
    }
  }

  // Resume decoding a connection after its parked request completed; posted, so a set that
  // wakes many clients does not recurse into their handlers.
  void post_process(const ConnPtr& c) {
    if (c->process_posted) return;
    c->process_posted = true;
    asio::post(ctx, [this, c] {
      c->process_posted = false;
      if (c->closed) return;
      process(c);
      start_read(c);
    });
  }

  // ---- the store --------------------------------------------------------------------------

  bool exists(const std::string& key) const {
    if (table.count(key)) return true;
    auto q = queues.find(key);
    return q != queues.end() && !q->second.empty();
  }

  void notify_watchers(const std::string& key, uint8_t kind, const Bytes& old_value,
                       const Bytes& new_value) {
    auto it = watchers.find(key);
    if (it == watchers.end()) return;
    auto& list = it->second;
    for (auto w = list.begin(); w != list.end();) {
      auto c = w->lock();
      if (!c || c->closed) {
        w = list.erase(w);
        continue;
      }
      Bytes& msg = c->out_pending;
      wire::put_u8(msg, kind);
      wire::put_string(msg, key);
      wire::put_bytes(msg, old_value);
      wire::put_bytes(msg, new_value);
      replied(c);
      ++w;
    }
    if (list.empty()) watchers.erase(it);
  }

  // Changes the value at `key` (created empty if missing) with modify(Bytes&), tells the
  // watchers and wakes whoever waits for the key. Modifying in place lets a SET swap buffers
  // with the decoded request and an ADD rewrite its digits: no allocation per operation.
  template <typename Modify>
  void update_value(const std::string& key, Modify modify) {
    auto [it, created] = table.try_emplace(key);
    if (!watchers.empty() && watchers.count(key)) {
      Bytes old = it->second;
      modify(it->second);
      notify_watchers(key, created ? wire::kWatchKeyCreated : wire::kWatchKeyUpdated, old,
                      it->second);
    } else {
      modify(it->second);
    }
    wake_all(key);
  }

  // Wakes every waiter on `key` (a set, add, compare_set or append created or changed it).
  void wake_all(const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    std::vector<ConnPtr> woken = std::move(it->second);
    waiters.erase(it);
    for (auto& c : woken) {
      if (c->closed || !c->parked) continue;
      if (c->awaiting > 0) --c->awaiting;
      if (c->awaiting == 0) try_complete_parked(c);
    }
  }

  // A QUEUE_PUSH on `key`: as PyTorch 2.x's server does (TCPStoreLibUvBackend's
  // wakeupOneWaitingClient), one item answers one waiter, the first in arrival order for which
  // this key was the last one missing; the other waiters stay parked even though the queue is
  // not empty (the woken one is expected to pop the item). Waiters that still miss other keys
  // count this one as present and leave its list (PyTorch leaves them on it and counts them
  // down again at every push; completion re-checks every key anyway, see try_complete_parked).
  void wake_one(const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    std::vector<ConnPtr>& list = it->second;
    ConnPtr chosen;
    size_t kept = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      ConnPtr& c = list[i];
      if (c->closed || !c->parked) continue;  // stale entry: drop it
      if (!chosen && c->awaiting <= 1) {
        chosen = c;
        continue;
      }
      if (!chosen && c->awaiting > 1) {
        --c->awaiting;  // passed over: this key counts as present for it
        continue;
      }
      list[kept++] = std::move(c);  // after the chosen one: still waiting for this key
    }
    list.resize(kept);
    if (list.empty()) waiters.erase(it);
    if (chosen) {
      chosen->awaiting = 0;
      try_complete_parked(chosen);
    }
  }

  // Removes `c` from every wait list it is on.
  void unpark(const ConnPtr& c) {
    for (const auto& key : c->parked_request.keys) {
      auto it = waiters.find(key);
      if (it == waiters.end()) continue;
      auto& list = it->second;
      list.erase(std::remove(list.begin(), list.end(), c), list.end());
      if (list.empty()) waiters.erase(it);
    }
    c->parked = false;
    c->awaiting = 0;
    c->parked_request = Request();
  }

  // Parks `c` on the keys of `q` that are missing; false when none is missing.
  bool park_if_missing(const ConnPtr& c, const Request& q) {
    // One wait-list entry per missing key occurrence, counted in `awaiting`; no duplicate
    // search, which would make a WAIT on N keys by N clients cost N^3.
    size_t missing = 0;
    for (const auto& key : q.keys) {
      if (!exists(key)) {
        waiters[key].push_back(c);
        ++missing;
      }
    }
    if (missing == 0) return false;
    c->parked = true;
    c->awaiting = missing;
    c->parked_request = q;
    return true;
  }

  void try_complete_parked(const ConnPtr& c) {
    Request q = std::move(c->parked_request);
    unpark(c);
    // A key may have been deleted between its set and now: park again on what is missing.
    if (park_if_missing(c, q)) return;
    answer_ready(c, q);
    post_process(c);
  }

  // Answers a GET/WAIT/MULTI_GET whose keys all exist.
  void answer_ready(const ConnPtr& c, const Request& q) {
    Bytes& reply = c->out_pending;
    if (q.op == Op::kWait) {
      wire::put_u8(reply, wire::kStopWaiting);
    } else {
      for (const auto& key : q.keys) {
        auto it = table.find(key);
        if (it == table.end()) {
          wire::put_u64(reply, 0);
        } else {
          wire::put_bytes(reply, it->second);
        }
      }
    }
    replied(c);
  }

  bool handle_auth(const ConnPtr& c, const Request& q) {
    if (q.op == Op::kAuthBegin) {
      if (c->dialect != wire::Dialect::kTorch2 || c->auth_begun) {
        bad_frame(c, "unexpected AUTH_BEGIN");
        return true;
      }
      c->auth_begun = true;
      c->client_nonce = q.digest;
      Bytes reply;
      if (!options.token) {
        wire::put_u8(reply, 0);
        wire::Digest zero{};
        wire::put_raw(reply, zero.data(), zero.size());
        wire::put_raw(reply, zero.data(), zero.size());
      } else {
        c->server_nonce = random_nonce();
        auto proof = server_proof(*options.token, c->client_nonce, c->server_nonce);
        wire::put_u8(reply, 1);
        wire::put_raw(reply, c->server_nonce.data(), c->server_nonce.size());
        wire::put_raw(reply, proof.data(), proof.size());
      }
      send(c, std::move(reply));
      return true;
    }
    if (q.op == Op::kAuthProof) {
      if (!c->auth_begun || !options.token || c->authenticated) {
        bad_frame(c, "unexpected AUTH_PROOF");
        return true;
      }
      auto expected = client_proof(*options.token, c->client_nonce, c->server_nonce);
      if (!constant_time_equal(expected.data(), q.digest.data(), expected.size())) {
        complain("refused client " + c->peer + ": wrong job token (check DLAUNCH_JOB_TOKEN)");
        c->auth_begun = false;  // logged
        note_job_token_refusal();
        close(c);
        return true;
      }
      c->authenticated = true;
      c->admitted = true;
      agent_hosts.insert(c->peer_address);
      Bytes reply;
      wire::put_u8(reply, 0);
      send(c, std::move(reply));
      return true;
    }
    return false;
  }

  // `q` is the reused scratch request: handlers may take its buffers.
  void handle(const ConnPtr& c, Request& q) {
    if (q.op == Op::kAuthBegin || q.op == Op::kAuthProof) {
      handle_auth(c, q);
      return;
    }
    if (!c->admitted) {
      if (options.admit_unauthenticated_from_agent_hosts && agent_hosts.count(c->peer_address)) {
        c->admitted = true;
      } else {
        complain("refused client " + c->peer + " (" + wire::op_name(q.op) +
                 "): this store requires the job token and the client did not prove it" +
                 (options.admit_unauthenticated_from_agent_hosts
                      ? " (nor does it connect from an agent's host)"
                      : ""));
        close(c);
        return;
      }
    }
    if (!q.keys.empty()) scope_keys(c, q);
    // The reply is appended to the connection's pending output in place (see replied()).
    Bytes& reply = c->out_pending;
    switch (q.op) {
      case Op::kValidate:
        return bad_frame(c, "VALIDATE after the first message");
      case Op::kPing:
        wire::put_u32(reply, q.u32);
        break;
      case Op::kSet:
        // The request's buffer goes into the table; the table's old buffer comes back to the
        // reused request, to be filled by the next decode.
        update_value(q.keys[0], [&](Bytes& v) { v.swap(q.values[0]); });
        return;
      case Op::kCompareSet: {
        const auto& key = q.keys[0];
        auto it = table.find(key);
        if (it == table.end()) {
          if (q.values[0].empty()) {
            update_value(key, [&](Bytes& v) { v = q.values[1]; });
            wire::put_bytes(reply, q.values[1]);
          } else {
            wire::put_bytes(reply, q.values[0]);  // c10d's answer for a missing key
          }
        } else {
          if (it->second == q.values[0]) update_value(key, [&](Bytes& v) { v = q.values[1]; });
          wire::put_bytes(reply, table[key]);
        }
        break;
      }
      case Op::kGet:
      case Op::kWait:
      case Op::kMultiGet:
        if (park_if_missing(c, q)) return;
        answer_ready(c, q);
        return;
      case Op::kAdd: {
        int64_t value = 0;
        auto it = table.find(q.keys[0]);
        try {
          value = add_to_counter(it == table.end() ? nullptr : &it->second, q.delta, q.keys[0]);
        } catch (const Error& e) {
          return bad_frame(c, std::string("ADD: ") + e.what());
        }
        char digits[24];
        auto written = std::to_chars(digits, digits + sizeof(digits), value);
        update_value(q.keys[0], [&](Bytes& v) { v.assign(digits, written.ptr); });
        wire::put_i64(reply, value);
        break;
      }
      case Op::kCheck: {
        bool ready = true;
        for (const auto& k : q.keys) ready = ready && exists(k);
        wire::put_u8(reply, ready ? wire::kCheckReady : wire::kCheckNotReady);
        break;
      }
      case Op::kNumKeys:
        wire::put_i64(reply, static_cast<int64_t>(table.size()));
        break;
      case Op::kWatchKey:
        watchers[q.keys[0]].push_back(c);
        wire::put_u8(reply, wire::kWatchCallbackRegistered);
        break;
      case Op::kDeleteKey: {
        auto it = table.find(q.keys[0]);
        bool existed = it != table.end();
        if (existed) {
          Bytes old = std::move(it->second);
          table.erase(it);
          if (!watchers.empty()) notify_watchers(q.keys[0], wire::kWatchKeyDeleted, old, Bytes());
        }
        wire::put_i64(reply, existed ? 1 : 0);
        break;
      }
      case Op::kAppend:
        update_value(q.keys[0], [&](Bytes& v) {
          v.insert(v.end(), q.values[0].begin(), q.values[0].end());
        });
        return;
      case Op::kMultiSet:
        for (size_t i = 0; i < q.keys.size(); ++i) {
          update_value(q.keys[i], [&](Bytes& v) { v.swap(q.values[i]); });
        }
        return;
      case Op::kCancelWait:
        wire::put_u8(reply, wire::kWaitCanceled);
        break;
      case Op::kQueuePush:
        queues[q.keys[0]].push_back(std::move(q.values[0]));
        wake_one(q.keys[0]);
        return;
      case Op::kQueuePop: {
        auto& queue = queues[q.keys[0]];
        wire::put_i64(reply, static_cast<int64_t>(queue.size()));
        if (!queue.empty()) {
          wire::put_bytes(reply, queue.front());
          queue.pop_front();
        }
        if (queue.empty()) queues.erase(q.keys[0]);
        break;
      }
      case Op::kQueueLen: {
        auto it = queues.find(q.keys[0]);
        wire::put_i64(reply, it == queues.end() ? 0 : static_cast<int64_t>(it->second.size()));
        break;
      }
      case Op::kDeletePrefix: {
        // dlaunch's extension: clears a finished generation's keys (e.g. PyTorch's
        // "/worker/attempt_N/...") before the next one starts. Linear in the table size.
        int64_t n = 0;
        const std::string& prefix = q.keys[0];
        for (auto it = table.begin(); it != table.end();) {
          if (it->first.compare(0, prefix.size(), prefix) == 0) {
            it = table.erase(it);
            ++n;
          } else {
            ++it;
          }
        }
        wire::put_i64(reply, n);
        break;
      }
      case Op::kDeclareAgent:
        c->agent = true;
        wire::put_u8(reply, 0);
        break;
      case Op::kAuthBegin:
      case Op::kAuthProof:
        return;
    }
    replied(c);
  }

  void scope_keys(const ConnPtr& c, Request& q) {
    if (c->agent) return;
    if (!c->scope_known) {
      c->scope_known = true;
      auto it = table.find(kWorkerNamespaceKey);
      if (it != table.end()) c->scope.assign(it->second.begin(), it->second.end());
    }
    if (c->scope.empty()) return;
    for (auto& key : q.keys) key.insert(0, c->scope);
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

uint16_t TcpStoreServer::start() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  DL_CHECK(!impl_->started) << "TcpStoreServer::start called twice";
  auto& o = impl_->options;
  raise_fd_limit();

  boost::system::error_code ec;
  auto address = asio::ip::make_address(o.host, ec);
  if (ec) {
    // A name: resolve it forward (never reverse) and bind its first address.
    tcp::resolver resolver(impl_->ctx);
    auto results = resolver.resolve(o.host, std::to_string(o.port),
                                    tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      throw UsageError("store server: cannot resolve the bind address '" + o.host +
                       "': " + ec.message() + "; pass an IP address of this machine");
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(address, o.port);
  std::string where = (address.is_v6() ? "[" + address.to_string() + "]" : address.to_string()) +
                      ":" + std::to_string(o.port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (ec) throw SystemError("store server: cannot open a socket for " + where + ": " + ec.message());
  acc.set_option(tcp::acceptor::reuse_address(true), ec);
  acc.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    throw AddressInUseError("store server: port " + std::to_string(o.port) + " on " +
                            address.to_string() +
                            " is already in use by another process (another job or a stale "
                            "agent); pick another port, or 0 to let dlaunch choose one");
  }
  if (ec.value() == EADDRNOTAVAIL) {
    throw UsageError("store server: " + address.to_string() +
                     " is not an address of this machine; pass one of its own addresses "
                     "(--local_addr) to bind the store");
  }
  if (ec) throw SystemError("store server: cannot bind " + where + ": " + ec.message());
  acc.listen(o.backlog, ec);
  if (ec) throw SystemError("store server: cannot listen on " + where + ": " + ec.message());
  impl_->bound_port = acc.local_endpoint().port();
  impl_->started = true;
  impl_->accept_next();
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->ctx.run();
    } catch (const std::exception& e) {
      log_error("store server thread stopped on an unexpected error: {}", e.what());
    }
  });
  log_debug("store server listening on {}:{}", address.to_string(), impl_->bound_port);
  return impl_->bound_port;
}

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  if (!impl_->started || impl_->stopped) return;
  impl_->stopped = true;
  asio::post(impl_->ctx, [impl = impl_.get()] {
    boost::system::error_code ignore;
    impl->acceptor.close(ignore);
    impl->retry_timer.cancel();
    auto conns = impl->connections;
    for (auto& c : conns) impl->close(c);
    impl->waiters.clear();
    impl->watchers.clear();
    impl->ctx.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t TcpStoreServer::port() const { return impl_->bound_port; }
const std::string& TcpStoreServer::host() const { return impl_->options.host; }
size_t TcpStoreServer::num_connections() const {
  return impl_->open_connections.load(std::memory_order_relaxed);
}

}  // namespace dlaunch
