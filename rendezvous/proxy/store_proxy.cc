#include "rendezvous/proxy/store_proxy.h"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio.hpp>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/proxy/request_batch.h"
#include "rendezvous/tcp/channel_frames.h"
#include "rendezvous/tcp/job_token.h"
#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

// One worker's connection to the proxy: its channel to the store.
struct Worker : std::enable_shared_from_this<Worker> {
  Worker(uint32_t id, tcp::socket socket) : id(id), socket(std::move(socket)) {}
  uint32_t id;
  tcp::socket socket;
  uint8_t rbuf[16384];
  Bytes in;
  size_t in_begin = 0;
  bool dialect_known = false;
  wire::Dialect dialect = wire::Dialect::kTorch113;
  bool undecodable = false;  // a frame the codec refused: the rest goes up as it comes
  Bytes out, writing;
  bool write_pending = false;
  bool close_after_write = false;  // the store closed this channel
  bool closed = false;
};
using WorkerPtr = std::shared_ptr<Worker>;

std::string where(const std::string& host, uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

}  // namespace

struct StoreProxy::Impl {
  explicit Impl(StoreProxyOptions o)
      : options(std::move(o)), acceptor(ctx), upstream(ctx), batch(options.group_requests) {}

  StoreProxyOptions options;
  asio::io_context ctx{1};
  tcp::acceptor acceptor;
  tcp::socket upstream;
  std::thread thread;
  std::mutex lifecycle_mutex;
  bool started = false, stopped = false;
  uint16_t bound_port = 0;
  std::atomic<bool> connected{false};
  wire::Limits limits;
  wire::Request scratch;

  // Workers by channel id; ids are never reused (the store may still speak of a closed one).
  std::unordered_map<uint32_t, WorkerPtr> workers;
  uint32_t next_channel = 1;

  // Upstream: the batch being gathered, the bytes being written, the bytes read.
  RequestBatch batch;
  bool flush_posted = false;
  Bytes up_out;
  bool up_write_pending = false;
  Bytes up_in;
  size_t up_in_begin = 0;
  uint8_t up_rbuf[65536];

  std::atomic<int64_t> workers_accepted{0}, requests{0}, grouped{0}, upstream_writes{0},
      shared_replies{0};

  // ---- the handshake with the store (start(), before the thread runs) ----

  // Runs the io_context until `done` or the deadline; on the deadline closes the upstream
  // socket (ending the operation) and throws ConnectionError.
  void run_until(const bool& done, TimePoint deadline, const std::string& what) {
    ctx.restart();
    while (!done) {
      if (ctx.run_one_until(deadline) == 0 && !done) {
        error_code ignore;
        upstream.close(ignore);
        ctx.restart();
        ctx.run();  // the cancelled handler runs
        throw ConnectionError(fmt::format(
            "store proxy: {} the job's store at {} took longer than {:g} s; check that the "
            "store host is up and reachable from this node",
            what, where(options.store_host, options.store_port),
            std::chrono::duration<double>(options.connect_timeout).count()));
      }
    }
  }

  void write_up(const Bytes& bytes, TimePoint deadline) {
    bool done = false;
    error_code result;
    asio::async_write(upstream, asio::buffer(bytes), [&](const error_code& ec, size_t) {
      done = true;
      result = ec;
    });
    run_until(done, deadline, "writing to");
    if (result) {
      throw ConnectionError(fmt::format("store proxy: lost the job's store at {} in the "
                                        "handshake: {}",
                                        where(options.store_host, options.store_port),
                                        result.message()));
    }
  }

  // Reads exactly n bytes; the store closing the connection instead is `refused`'s message.
  Bytes read_up(size_t n, TimePoint deadline, const std::string& refused) {
    Bytes bytes(n);
    bool done = false;
    error_code result;
    asio::async_read(upstream, asio::buffer(bytes), [&](const error_code& ec, size_t) {
      done = true;
      result = ec;
    });
    run_until(done, deadline, "reading from");
    if (result) throw StateError(refused + " (" + result.message() + ")");
    return bytes;
  }

  void connect_upstream(TimePoint deadline) {
    const std::string at = where(options.store_host, options.store_port);
    std::string last_error;
    while (true) {
      error_code ec;
      tcp::resolver resolver(ctx);
      auto endpoints = resolver.resolve(options.store_host, std::to_string(options.store_port),
                                        tcp::resolver::numeric_service, ec);
      if (!ec) {
        bool done = false;
        asio::async_connect(upstream, endpoints, [&](const error_code& e, const tcp::endpoint&) {
          done = true;
          ec = e;
        });
        run_until(done, deadline, "connecting to");
        if (!ec) break;
      }
      last_error = ec.message();
      error_code ignore;
      upstream.close(ignore);
      if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) {
        throw ConnectionError(fmt::format(
            "store proxy: cannot connect to the job's store at {} ({}); check that the store "
            "host is up and reachable from this node",
            at, last_error));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    error_code ignore;
    upstream.set_option(tcp::no_delay(true), ignore);
  }

  // VALIDATE, the job token, DECLARE_AGENT, FEATURES, CHANNELS (channel_frames.h).
  void handshake(TimePoint deadline) {
    const std::string at = where(options.store_host, options.store_port);
    Bytes hello;
    wire::put_u8(hello, wire::op2::kValidate);
    wire::put_u32(hello, wire::kValidationMagic);
    wire::Digest client_nonce{};
    if (options.token) {
      client_nonce = random_nonce();
      wire::put_u8(hello, wire::op2::kAuthBegin);
      wire::put_raw(hello, client_nonce.data(), client_nonce.size());
    }
    write_up(hello, deadline);
    if (options.token) {
      Bytes answer = read_up(65, deadline,
                             "store proxy: the store at " + at +
                                 " closed the connection at the job-token handshake; is it a "
                                 "dlaunch store?");
      if (answer[0] != 1) {
        throw StateError("store proxy: this node has a job token (DLAUNCH_JOB_TOKEN) but the "
                         "store at " + at + " has none; give every node the same token");
      }
      wire::Digest server_nonce{}, proof{};
      std::copy(answer.begin() + 1, answer.begin() + 33, server_nonce.begin());
      std::copy(answer.begin() + 33, answer.end(), proof.begin());
      auto expected = server_proof(*options.token, client_nonce, server_nonce);
      if (!constant_time_equal(expected.data(), proof.data(), proof.size())) {
        throw StateError("store proxy: the store at " + at +
                         " holds another job token than this node; give every node the same "
                         "DLAUNCH_JOB_TOKEN");
      }
      Bytes reply;
      wire::put_u8(reply, wire::op2::kAuthProof);
      auto mine = client_proof(*options.token, client_nonce, server_nonce);
      wire::put_raw(reply, mine.data(), mine.size());
      write_up(reply, deadline);
      read_up(1, deadline,
              "store proxy: the store at " + at +
                  " refused this node's job token; give every node the same DLAUNCH_JOB_TOKEN");
    }
    const std::string older =
        "store proxy: the store at " + at +
        " runs a dlaunch build without channels (older than the store proxy); run the job with "
        "--store_proxy off, or the same dlaunch on every node";
    // The proxy is part of its agent: its own requests count as an agent's in the store's
    // statistics, and the channels it carries as the workers' connections they are.
    Bytes features;
    wire::put_u8(features, wire::op2::kDeclareAgent);
    wire::put_u8(features, wire::op2::kFeatures);
    write_up(features, deadline);
    Bytes declared = read_up(1, deadline, older);
    if (declared[0] == wire::kDeclareRefusedNoToken) {
      throw UsageError("store proxy: the store at " + at +
                       " requires the job token and this node has none; give every node the "
                       "same DLAUNCH_JOB_TOKEN");
    }
    Bytes bits = read_up(4, deadline, older);
    uint32_t value = uint32_t(bits[0]) | uint32_t(bits[1]) << 8 | uint32_t(bits[2]) << 16 |
                     uint32_t(bits[3]) << 24;
    if (!(value & wire::kFeatureChannels)) throw StateError(older);
    Bytes channels;
    wire::put_u8(channels, wire::op2::kChannels);
    write_up(channels, deadline);
    Bytes answer = read_up(1, deadline, older);
    if (answer[0] == wire::kDeclareRefusedNoToken) {
      throw UsageError("store proxy: the store at " + at +
                       " requires the job token and this node has none; give every node the "
                       "same DLAUNCH_JOB_TOKEN");
    }
    if (answer[0] != 0) throw StateError(older);
    // Replies the store may send once for several workers; a store without the bit never
    // hears of them and sends each worker its own.
    if (value & wire::kFeatureSharedReplies) {
      Bytes shared;
      wire::put_channel_shared_accepted(shared);
      write_up(shared, deadline);
      batch.send_same_bytes_once(true);
    }
  }

  // ---- the workers ----

  void accept_next() {
    acceptor.async_accept([this](const error_code& ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;
      if (!ec) {
        error_code ignore;
        socket.set_option(tcp::no_delay(true), ignore);
        auto w = std::make_shared<Worker>(next_channel++, std::move(socket));
        workers.emplace(w->id, w);
        workers_accepted.fetch_add(1, std::memory_order_relaxed);
        batch.open(w->id);
        post_flush();
        read_worker(w);
      } else if (ec != asio::error::operation_aborted) {
        log_warning("store proxy: accept failed: {}", ec.message());
      }
      accept_next();
    });
  }

  void read_worker(const WorkerPtr& w) {
    w->socket.async_read_some(asio::buffer(w->rbuf), [this, w](const error_code& ec, size_t n) {
      if (w->closed) return;
      if (ec) return worker_gone(w);
      w->in.insert(w->in.end(), w->rbuf, w->rbuf + n);
      decode_worker(*w);
      read_worker(w);
    });
  }

  // Cuts the worker's bytes into requests for the batch.
  void decode_worker(Worker& w) {
    while (true) {
      const uint8_t* data = w.in.data() + w.in_begin;
      const size_t size = w.in.size() - w.in_begin;
      if (size == 0) break;
      if (w.undecodable) {
        batch.raw(w.id, data, size);
        w.in_begin += size;
        break;
      }
      if (!w.dialect_known) {
        auto d = wire::detect_dialect(data, size, limits);
        if (d.status == wire::Status::kNeedMore) break;
        if (d.status == wire::Status::kBad) {
          w.undecodable = true;
          continue;
        }
        w.dialect_known = true;
        w.dialect = d.dialect;
        if (d.consumed > 0) batch.raw(w.id, data, d.consumed);
        w.in_begin += d.consumed;
        continue;
      }
      auto r = wire::decode_request(w.dialect, data, size, limits, &scratch);
      if (r.status == wire::Status::kNeedMore) break;
      if (r.status == wire::Status::kBad) {
        w.undecodable = true;
        continue;
      }
      batch.request(w.id, scratch, data, r.consumed);
      requests.fetch_add(1, std::memory_order_relaxed);
      w.in_begin += r.consumed;
    }
    if (w.in_begin > 0) {
      w.in.erase(w.in.begin(), w.in.begin() + static_cast<std::ptrdiff_t>(w.in_begin));
      w.in_begin = 0;
    }
    post_flush();
  }

  // The worker disconnected: its channel closes at the store (its waits end there).
  void worker_gone(const WorkerPtr& w) {
    if (w->closed) return;
    close_worker(*w);
    if (connected) {
      batch.close(w->id);
      post_flush();
    }
  }

  void close_worker(Worker& w) {
    if (w.closed) return;
    w.closed = true;
    error_code ignore;
    w.socket.shutdown(tcp::socket::shutdown_both, ignore);
    w.socket.close(ignore);
    workers.erase(w.id);
  }

  void write_worker(const WorkerPtr& w) {
    if (w->write_pending || w->closed) return;
    if (w->out.empty()) {
      if (w->close_after_write) close_worker(*w);
      return;
    }
    w->writing.swap(w->out);
    w->out.clear();
    w->write_pending = true;
    asio::async_write(w->socket, asio::buffer(w->writing),
                      [this, w](const error_code& ec, size_t) {
                        w->write_pending = false;
                        w->writing.clear();
                        if (ec) return worker_gone(w);
                        write_worker(w);
                      });
  }

  // ---- the store ----

  void post_flush() {
    if (flush_posted || batch.empty()) return;
    flush_posted = true;
    asio::post(ctx, [this] {
      flush_posted = false;
      flush_up();
    });
  }

  // One write per batch; requests received while it is on the wire form the next batch.
  void flush_up() {
    if (up_write_pending || !connected || batch.empty()) return;
    up_out.clear();
    int64_t in_groups = 0;
    batch.encode(up_out, &in_groups);
    grouped.fetch_add(in_groups, std::memory_order_relaxed);
    upstream_writes.fetch_add(1, std::memory_order_relaxed);
    up_write_pending = true;
    asio::async_write(upstream, asio::buffer(up_out), [this](const error_code& ec, size_t) {
      up_write_pending = false;
      if (ec) return upstream_lost(ec.message());
      flush_up();
    });
  }

  void read_up_loop() {
    upstream.async_read_some(asio::buffer(up_rbuf), [this](const error_code& ec, size_t n) {
      if (!connected) return;
      if (ec) return upstream_lost(ec == asio::error::eof ? "the store closed the connection"
                                                          : ec.message());
      up_in.insert(up_in.end(), up_rbuf, up_rbuf + n);
      wire::ChannelFrame f;
      while (connected) {
        auto r = wire::decode_channel_frame(up_in.data() + up_in_begin, up_in.size() - up_in_begin,
                                            limits, /*from_store=*/true, &f);
        if (r.status == wire::Status::kNeedMore) break;
        if (r.status == wire::Status::kBad) return upstream_lost("bad frame: " + r.error);
        if (f.kind == wire::ChannelFrameKind::kClose) {
          deliver(f.channel, nullptr, 0, /*closed=*/true);
        } else {
          // DATA: one worker's bytes; SHARED: the same bytes for each of several workers.
          for (const auto& m : f.members) deliver(m.channel, m.data, m.size, /*closed=*/false);
          if (f.kind == wire::ChannelFrameKind::kShared) {
            shared_replies.fetch_add(static_cast<int64_t>(f.members.size()),
                                     std::memory_order_relaxed);
          }
        }
        up_in_begin += r.consumed;
      }
      up_in.erase(up_in.begin(), up_in.begin() + static_cast<std::ptrdiff_t>(up_in_begin));
      up_in_begin = 0;
      read_up_loop();
    });
  }

  // What the store sent one worker (or closed its channel), on its way down.
  void deliver(uint32_t channel, const uint8_t* data, size_t size, bool closed) {
    auto it = workers.find(channel);
    if (it == workers.end()) return;  // the worker left meanwhile
    WorkerPtr w = it->second;
    if (closed) {
      w->close_after_write = true;
    } else {
      w->out.insert(w->out.end(), data, data + size);
    }
    // A worker that does not read its replies must not grow the proxy's memory: closed, as
    // the store closes such a client of its own.
    if (w->out.size() > limits.max_frame_bytes) {
      log_warning("store proxy: worker connection {} does not read its replies; closing it",
                  w->id);
      worker_gone(w);
    } else {
      write_worker(w);
    }
  }

  // The store is gone for this node: every worker sees its connection closed, as it would had
  // it been connected to the store, and connecting again is refused.
  void upstream_lost(const std::string& why) {
    if (!connected.exchange(false)) return;
    // With no worker connected (the job's end: the store host stops after the last agent
    // left), nobody loses anything.
    if (workers.empty()) {
      log_debug("store proxy: the job's store at {} closed: {}",
                where(options.store_host, options.store_port), why);
    } else {
      log_warning("store proxy: lost the job's store at {}: {}; closing the connections of {} "
                  "workers",
                  where(options.store_host, options.store_port), why, workers.size());
    }
    shut_down();
  }

  void shut_down() {
    connected = false;
    error_code ignore;
    acceptor.close(ignore);
    upstream.shutdown(tcp::socket::shutdown_both, ignore);
    upstream.close(ignore);
    auto all = workers;
    for (auto& entry : all) close_worker(*entry.second);
  }
};

StoreProxy::StoreProxy(StoreProxyOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreProxy::~StoreProxy() { stop(); }

uint16_t StoreProxy::start() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  DL_CHECK(!impl_->started) << "StoreProxy::start called twice";
  auto& o = impl_->options;
  const TimePoint deadline = std::chrono::steady_clock::now() + o.connect_timeout;
  impl_->connect_upstream(deadline);
  impl_->handshake(deadline);

  error_code ec;
  auto address = asio::ip::make_address(o.listen_host, ec);
  if (ec) {
    throw UsageError(fmt::format("store proxy: the listen address '{}' is no IP address; pass "
                                 "one of this node's addresses",
                                 o.listen_host));
  }
  tcp::endpoint endpoint(address, o.listen_port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(endpoint, ec);
  if (!ec) acc.listen(4096, ec);
  if (ec) {
    throw SystemError(fmt::format("store proxy: cannot listen on {}: {}; pick another port",
                                  where(o.listen_host, o.listen_port), ec.message()));
  }
  impl_->bound_port = acc.local_endpoint().port();
  impl_->connected = true;
  impl_->started = true;
  impl_->ctx.restart();
  impl_->accept_next();
  impl_->read_up_loop();
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->ctx.run();
    } catch (const std::exception& e) {
      log_error("store proxy thread stopped on an unexpected error: {}", e.what());
    }
  });
  log_debug("store proxy on {} for the store at {}", where(o.listen_host, impl_->bound_port),
            where(o.store_host, o.store_port));
  return impl_->bound_port;
}

void StoreProxy::stop() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mutex);
  if (!impl_->started || impl_->stopped) return;
  impl_->stopped = true;
  asio::post(impl_->ctx, [impl = impl_.get()] {
    impl->shut_down();
    impl->ctx.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t StoreProxy::port() const { return impl_->bound_port; }

bool StoreProxy::connected() const { return impl_->connected.load(); }

StoreProxyStats StoreProxy::stats() const {
  StoreProxyStats s;
  s.workers_accepted = impl_->workers_accepted.load(std::memory_order_relaxed);
  s.requests = impl_->requests.load(std::memory_order_relaxed);
  s.grouped = impl_->grouped.load(std::memory_order_relaxed);
  s.upstream_writes = impl_->upstream_writes.load(std::memory_order_relaxed);
  s.shared_replies = impl_->shared_replies.load(std::memory_order_relaxed);
  return s;
}

}  // namespace dlaunch
