#include "rendezvous/tcp/tcp_store_connection.h"

#include <algorithm>

#include "common/log.h"
#include "rendezvous/tcp/job_token.h"

namespace dlaunch {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Op;
using wire::Request;

// ---- the manager --------------------------------------------------------------------------

void TcpStoreConnectionManager::start(tcp::socket socket) {
  boost::system::error_code ignore;
  socket.set_option(tcp::no_delay(true), ignore);
  auto conn = std::make_shared<TcpStoreConnection>(*this, std::move(socket));
  connections_.insert(conn);
  open_.store(connections_.size(), std::memory_order_relaxed);
  // Written on the server thread only; atomics so that stats() may read them from any thread.
  if (connections_.size() > peak_.load(std::memory_order_relaxed)) {
    peak_.store(connections_.size(), std::memory_order_relaxed);
  }
  accepted_.fetch_add(1, std::memory_order_relaxed);
  conn->start();
}

void TcpStoreConnectionManager::remove(const TcpStoreConnectionPtr& c) {
  connections_.erase(c);
  open_.store(connections_.size(), std::memory_order_relaxed);
}

void TcpStoreConnectionManager::stop_all() {
  state.forget_wills();  // the clients did not go away: the store does
  auto conns = connections_;
  for (auto& c : conns) c->close();
  state.forget_clients();
}

void TcpStoreConnectionManager::complain(const std::string& message) {
  auto now = std::chrono::steady_clock::now();
  if (now - last_complaint_ < std::chrono::seconds(1)) {
    ++suppressed_complaints_;
    return;
  }
  last_complaint_ = now;
  if (suppressed_complaints_ > 0) {
    log_warning("store server: {} ({} similar messages suppressed)", message,
                suppressed_complaints_);
    suppressed_complaints_ = 0;
  } else {
    log_warning("store server: {}", message);
  }
}

// ---- I/O ----------------------------------------------------------------------------------

TcpStoreConnection::TcpStoreConnection(TcpStoreConnectionManager& manager, tcp::socket socket)
    : manager_(manager), socket_(std::move(socket)), wait_timer_(manager.ctx) {
  boost::system::error_code ignore;
  auto ep = socket_.remote_endpoint(ignore);
  peer_address_ = ep.address();
  peer_ = ep.address().is_v6() ? "[" + ep.address().to_string() + "]:" + std::to_string(ep.port())
                               : ep.address().to_string() + ":" + std::to_string(ep.port());
  admitted_ = !manager_.options.token.has_value();
}

// A channel has no socket: its peer is its carrier's (a node's proxy, whose workers connect
// from that node), so the job token admits it as it would admit that node's own connections.
TcpStoreConnection::TcpStoreConnection(TcpStoreConnectionManager& manager,
                                       TcpStoreConnectionPtr carrier, uint32_t channel)
    : manager_(manager),
      socket_(manager.ctx),
      wait_timer_(manager.ctx),
      carrier_(std::move(carrier)),
      channel_(channel) {
  peer_address_ = carrier_->peer_address_;
  peer_ = carrier_->peer_ + " channel " + std::to_string(channel);
  admitted_ = !manager_.options.token.has_value();
}

void TcpStoreConnection::start() {
  start_read();
}

void TcpStoreConnection::start_read() {
  if (closed || reading_ || carrier_) return;
  // A parked client may send CANCEL_WAIT, so keep reading, but do not buffer without bound.
  if (in_.size() - in_begin_ > manager_.options.limits.max_frame_bytes) {
    manager_.complain("client " + peer_ + " sent more than a frame while blocked; closing it");
    close();
    return;
  }
  // Read into a separate buffer: process() may run (posted) while this read is pending. It is
  // allocated without zero-filling and reused: resizing a vector here cleared 4 KiB per request
  // (3% of the store host's CPU at 16,384 clients). Large only while a big frame is arriving.
  size_t chunk = in_.size() - in_begin_ > kSmallRead ? kLargeRead : kSmallRead;
  if (rbuf_size_ != chunk) {
    rbuf_.reset(new uint8_t[chunk]);
    rbuf_size_ = chunk;
  }
  reading_ = true;
  socket_.async_read_some(asio::buffer(rbuf_.get(), chunk),
                          [c = self()](const boost::system::error_code& ec, size_t n) {
                            c->reading_ = false;
                            if (c->closed || c->closing_) return;
                            if (ec) {
                              c->close();
                              return;
                            }
                            // Copied into in_, which keeps its capacity from request to request.
                            c->in_.insert(c->in_.end(), c->rbuf_.get(), c->rbuf_.get() + n);
                            c->process();
                            c->start_read();
                          });
}

// Replies are appended to `out` in place, then replied() is called: it writes at once, or at
// the end of process() when this connection is being processed, so all the replies to one
// read go out in one write.
void TcpStoreConnection::replied() {
  if (closed) {
    out.clear();
    return;
  }
  // A client that sends requests but never reads the replies must not grow our memory.
  if (out.size() > manager_.options.limits.max_frame_bytes) {
    manager_.complain("client " + peer_ + " does not read its replies; closing it");
    close();
    return;
  }
  if (!in_process_) flush();
}

void TcpStoreConnection::send(const Bytes& bytes) {
  if (closed) return;
  out.insert(out.end(), bytes.begin(), bytes.end());
  replied();
}

void TcpStoreConnection::flush() {
  if (carrier_) {  // a channel: into the carrier's next write
    if (closed) return;
    if (!out.empty()) {
      carrier_->send_channel_data(channel_, out);
      out.clear();
    }
    if (closing_) close();
    return;
  }
  if (writing_ || closed) return;
  if (out.empty()) {
    if (closing_) close();  // the refusal is written
    return;
  }
  out_writing_.swap(out);
  out.clear();
  writing_ = true;
  asio::async_write(socket_, asio::buffer(out_writing_),
                    [c = self()](const boost::system::error_code& ec, size_t) {
                      c->writing_ = false;
                      c->out_writing_.clear();
                      // Keep small buffers for the next replies, not a big one's memory
                      // (10,000 connections x one large MULTI_GET each would add up).
                      if (c->out_writing_.capacity() > (1u << 20)) Bytes().swap(c->out_writing_);
                      if (ec) {
                        c->close();
                        return;
                      }
                      c->flush();
                    });
}

void TcpStoreConnection::close() {
  if (closed) return;
  closed = true;
  wait_timer_.cancel();  // its handler holds this connection
  if (auth_begun_ && !authenticated_) {  // a client checks our proof first, then leaves
    note_job_token_refusal();
    manager_.complain("refused client " + peer_ + ": " +
                      (manager_.options.token ? "its job token differs from this store's"
                                              : "it has a job token, this store none") +
                      " (give every node the same DLAUNCH_JOB_TOKEN)");
  }
  manager_.state.drop(*this);
  out.clear();
  if (carrier_) {
    // Let go of the carrier (it holds this channel too); it tells the proxy.
    TcpStoreConnectionPtr carrier = std::move(carrier_);
    carrier->channel_closed(channel_);
    return;
  }
  close_channels();
  boost::system::error_code ignore;
  socket_.shutdown(tcp::socket::shutdown_both, ignore);
  socket_.close(ignore);
  manager_.remove(self());
}

void TcpStoreConnection::bad_frame(const std::string& why) {
  manager_.complain("closing client " + peer_ + ": " + why);
  close();
}

// ---- decoding -----------------------------------------------------------------------------

void TcpStoreConnection::process() {
  in_process_ = true;
  process_frames();
  in_process_ = false;
  if (!closed) flush();
  // Compact the input buffer.
  if (in_begin_ > 0) {
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(in_begin_));
    in_begin_ = 0;
    if (in_.empty() && in_.capacity() > 65536) Bytes().swap(in_);
  }
}

// Decodes and handles every complete frame in in_.
void TcpStoreConnection::process_frames() {
  Request& q = manager_.scratch;
  const wire::Limits& limits = manager_.options.limits;
  while (!closed && !closing_) {
    if (carries_channels_) return process_channel_frames();
    const uint8_t* data = in_.data() + in_begin_;
    size_t size = in_.size() - in_begin_;
    if (!dialect_known_) {
      auto d = wire::detect_dialect(data, size, limits);
      if (d.status == wire::Status::kNeedMore) break;
      if (d.status == wire::Status::kBad) return bad_frame(d.error);
      dialect_known_ = true;
      dialect_ = d.dialect;
      in_begin_ += d.consumed;
      continue;
    }
    auto r = wire::decode_request(dialect_, data, size, limits, &q);
    if (r.status == wire::Status::kNeedMore) break;
    if (r.status == wire::Status::kBad) return bad_frame(r.error);
    if (!manager_.options.knows_features &&
        (q.op == Op::kFeatures || q.op == Op::kWaitGet || q.op == Op::kDeclareRun ||
         q.op == Op::kChannels || q.op == Op::kWill)) {
      return bad_frame("unknown opcode " + std::to_string(wire::opcode(dialect_, q.op)) +
                       " (this server plays a build older than FEATURES)");
    }
    if (parked()) {
      // Only CANCEL_WAIT may overtake a parked request; anything else waits its turn.
      if (q.op != Op::kCancelWait) break;
      in_begin_ += r.consumed;
      manager_.state.cancel_wait(*this);
      replied();
      continue;
    }
    in_begin_ += r.consumed;
    handle(q);
  }
}

// Resume decoding after the parked request completed; posted, so a set that wakes many
// clients does not recurse into their handlers.
void TcpStoreConnection::resumed() {
  // Nothing buffered behind the parked request, and the pending read will process what comes:
  // nothing to do. The usual case: a set that wakes 16,384 waiters then costs 16,384 writes,
  // not 16,384 posted handlers more.
  if (in_begin_ == in_.size() && (reading_ || carrier_)) return;
  if (process_posted_) return;
  process_posted_ = true;
  asio::post(manager_.ctx, [c = self()] {
    c->process_posted_ = false;
    if (c->closed || c->closing_) return;
    c->process();
    c->start_read();
  });
}

// ---- requests -----------------------------------------------------------------------------

void TcpStoreConnection::handle_auth(const Request& q) {
  const auto& token = manager_.options.token;
  if (q.op == Op::kAuthBegin) {
    if (dialect_ != wire::Dialect::kTorch2 || auth_begun_)
      return bad_frame("unexpected AUTH_BEGIN");
    auth_begun_ = true;
    client_nonce_ = q.digest;
    Bytes reply;
    if (!token) {
      wire::put_u8(reply, 0);
      wire::Digest zero{};
      wire::put_raw(reply, zero.data(), zero.size());
      wire::put_raw(reply, zero.data(), zero.size());
    } else {
      server_nonce_ = random_nonce();
      auto proof = server_proof(*token, client_nonce_, server_nonce_);
      wire::put_u8(reply, 1);
      wire::put_raw(reply, server_nonce_.data(), server_nonce_.size());
      wire::put_raw(reply, proof.data(), proof.size());
    }
    return send(reply);
  }
  // AUTH_PROOF.
  if (!auth_begun_ || !token || authenticated_) return bad_frame("unexpected AUTH_PROOF");
  auto expected = client_proof(*token, client_nonce_, server_nonce_);
  if (!constant_time_equal(expected.data(), q.digest.data(), expected.size())) {
    manager_.complain("refused client " + peer_ + ": wrong job token (check DLAUNCH_JOB_TOKEN)");
    auth_begun_ = false;  // logged
    note_job_token_refusal();
    return close();
  }
  authenticated_ = true;
  admitted_ = true;
  manager_.agent_hosts.insert(peer_address_);
  Bytes reply;
  wire::put_u8(reply, 0);
  send(reply);
}

void TcpStoreConnection::refuse(const Bytes& reply, const std::string& why) {
  manager_.complain(why);
  closing_ = true;
  send(reply);
}

// An agent of another run would share this store's keys with ours (the workers' namespace is
// store-wide): refused, told which run the store serves.
void TcpStoreConnection::declare_run(const std::string& run_id) {
  const std::string& mine = manager_.options.run_id;
  Bytes reply;
  if (mine.empty() || run_id == mine) {
    wire::put_u8(reply, wire::kDeclareAccepted);
    return send(reply);
  }
  wire::put_u8(reply, wire::kDeclareRefusedOtherRun);
  wire::put_string(reply, mine);
  refuse(reply, "refused agent " + peer_ + " of run '" + run_id + "': this store serves run '" +
                    mine + "' (another job was given this job's --rdzv_endpoint)");
}

// Whether this client may use the store; closes it (logged) when not.
bool TcpStoreConnection::admit(const Request& q) {
  const auto& o = manager_.options;
  if (o.admit_unauthenticated_from_agent_hosts && manager_.agent_hosts.count(peer_address_)) {
    admitted_ = true;
    return true;
  }
  manager_.complain("refused client " + peer_ + " (" + wire::op_name(q.op) +
                    "): this store requires the job token and the client did not prove it" +
                    (o.admit_unauthenticated_from_agent_hosts
                         ? " (nor does it connect from an agent's host)"
                         : ""));
  close();
  return false;
}

void TcpStoreConnection::arm_wait_timeout(uint64_t timeout_ms) {
  const uint64_t generation = wait_generation_;
  constexpr uint64_t kYearMs = 365ull * 24 * 3600 * 1000;  // no overflow of the clock
  wait_timer_.expires_after(std::chrono::milliseconds(std::min(timeout_ms, kYearMs)));
  wait_timer_.async_wait([c = self(), generation](const boost::system::error_code& ec) {
    // Answered, cancelled or closed meanwhile: a later WAIT_GET has a later generation.
    if (ec || c->closed || generation != c->wait_generation_) return;
    c->manager_.state.expire_wait(*c);
  });
}

// `q` is the reused scratch request: the state may take its buffers.
void TcpStoreConnection::handle(Request& q) {
  if (q.op == Op::kAuthBegin || q.op == Op::kAuthProof) return handle_auth(q);
  // The exception for unauthenticated clients on an agent's host is for PyTorch's workers,
  // which cannot prove the token; an agent can, so one that did not is refused, from any
  // address, with a reply that lets it say why at once rather than retry.
  if (q.op == Op::kDeclareAgent && manager_.options.token && !authenticated_) {
    Bytes reply;
    wire::put_u8(reply, wire::kDeclareRefusedNoToken);
    return refuse(reply, "refused agent " + peer_ +
                             ": it has no job token and this job requires one "
                             "(give every node the same DLAUNCH_JOB_TOKEN)");
  }
  if (q.op == Op::kChannels) {
    if (carrier_ || dialect_ != wire::Dialect::kTorch2) {
      return bad_frame("CHANNELS on a channel or on a 1.13 connection");
    }
    // A proxy carries other clients' connections, admitted from its address: it must prove
    // the job token itself, as an agent must.
    if (manager_.options.token && !authenticated_) {
      Bytes reply;
      wire::put_u8(reply, wire::kDeclareRefusedNoToken);
      return refuse(reply, "refused store proxy " + peer_ +
                               ": it has no job token and this job requires one "
                               "(give every node the same DLAUNCH_JOB_TOKEN)");
    }
    carries_channels_ = true;
    Bytes reply;
    wire::put_u8(reply, 0);
    return send(reply);
  }
  if (!admitted_ && !admit(q)) return;
  if (q.op == Op::kDeclareRun) return declare_run(q.keys[0]);
  std::string error;
  const auto began = std::chrono::steady_clock::now();
  const auto handled = manager_.state.handle(*this, q, error);
  manager_.stats.record(q.op, declared_agent(), std::chrono::steady_clock::now() - began,
                        manager_.state.num_keys());
  switch (handled) {
    case TcpStoreState::Handled::kReplied:
      return replied();
    case TcpStoreState::Handled::kQuiet:
      if (parked() && q.op == Op::kWaitGet) {
        ++wait_generation_;  // an older timer that fires now must not expire this one
        if (q.timeout_ms > 0) arm_wait_timeout(q.timeout_ms);
      }
      return;
    case TcpStoreState::Handled::kBadRequest:
      return bad_frame(error);
  }
}

// ---- channels (channel_frames.h) ----------------------------------------------------------

// The carrier's input: channel frames only.
void TcpStoreConnection::process_channel_frames() {
  wire::ChannelFrame f;
  while (!closed) {
    const uint8_t* data = in_.data() + in_begin_;
    size_t size = in_.size() - in_begin_;
    auto r = wire::decode_channel_frame(data, size, manager_.options.limits,
                                        /*from_store=*/false, &f);
    if (r.status == wire::Status::kNeedMore) break;
    if (r.status == wire::Status::kBad) return bad_frame(r.error);
    switch (f.kind) {
      case wire::ChannelFrameKind::kOpen:
        open_channel(f.channel);
        break;
      case wire::ChannelFrameKind::kData: {
        // An unknown channel is one this side closed; the proxy had not heard yet.
        auto it = channels_.find(f.channel);
        if (it != channels_.end()) {
          TcpStoreConnectionPtr c = it->second;
          c->feed(f.members[0].data, f.members[0].size);
        }
        break;
      }
      case wire::ChannelFrameKind::kClose: {
        auto it = channels_.find(f.channel);
        if (it != channels_.end()) {
          TcpStoreConnectionPtr c = std::move(it->second);
          channels_.erase(it);
          c->close();
        }
        break;
      }
      case wire::ChannelFrameKind::kGroup:
        handle_group(f);
        break;
      case wire::ChannelFrameKind::kShared:
        shared_replies_ = true;
        break;
    }
    if (closed) return;
    in_begin_ += r.consumed;
  }
}

void TcpStoreConnection::open_channel(uint32_t id) {
  if (channels_.count(id) > 0) return bad_frame("channel " + std::to_string(id) + " opened twice");
  channels_.emplace(id, std::make_shared<TcpStoreConnection>(manager_, self(), id));
  manager_.note_channel_opened();
}

// A channel's bytes arrived: as a read on a connection of its own.
void TcpStoreConnection::feed(const uint8_t* data, size_t size) {
  if (closed || closing_) return;
  in_.insert(in_.end(), data, data + size);
  process();
  if (!closed && in_.size() - in_begin_ > manager_.options.limits.max_frame_bytes) {
    manager_.complain("client " + peer_ + " sent more than a frame while blocked; closing it");
    close();
  }
}

// A GROUP: combined by the state when it can prove that exact (TcpStoreState::handle_group),
// else each member as a DATA frame, in the order listed.
void TcpStoreConnection::handle_group(const wire::ChannelFrame& f) {
  std::vector<TcpStoreConnectionPtr> members;
  std::vector<StoreSession*> sessions;
  std::vector<Request> requests(f.members.size());
  bool combinable = true;
  for (size_t i = 0; i < f.members.size() && combinable; ++i) {
    auto it = channels_.find(f.members[i].channel);
    if (it == channels_.end()) {
      combinable = false;
      break;
    }
    const TcpStoreConnectionPtr& c = it->second;
    // Idle: nothing buffered before this request, nothing parked, its dialect and admission
    // settled by earlier requests.
    combinable = !c->closed && !c->closing_ && c->dialect_known_ && c->admitted_ &&
                 !c->parked() && c->in_begin_ == c->in_.size() &&
                 std::find(members.begin(), members.end(), c) == members.end();
    if (!combinable) break;
    auto r = wire::decode_request(c->dialect_, f.members[i].data, f.members[i].size,
                                  manager_.options.limits, &requests[i]);
    combinable = r.status == wire::Status::kOk && r.consumed == f.members[i].size;
    members.push_back(c);
    sessions.push_back(c.get());
  }
  if (combinable) {
    const auto began = std::chrono::steady_clock::now();
    combinable = manager_.state.handle_group(sessions, requests);
    if (combinable) {
      manager_.stats.record(requests[0].op, members[0]->declared_agent(),
                            std::chrono::steady_clock::now() - began, manager_.state.num_keys());
      if (!share_replies(members)) {
        for (auto& c : members) c->replied();
      }
      return;
    }
  }
  for (const auto& m : f.members) {
    auto it = channels_.find(m.channel);
    if (it == channels_.end()) continue;
    TcpStoreConnectionPtr c = it->second;
    c->feed(m.data, m.size);
  }
}

// The members' replies as one SHARED frame, when the proxy reads them and every member's
// bytes are the same (a GET, MULTI_GET, CHECK or WAIT of the same keys): what each worker
// reads is unchanged, the bytes cross this socket once. False: each member replies itself.
bool TcpStoreConnection::share_replies(const std::vector<TcpStoreConnectionPtr>& members) {
  if (!shared_replies_ || closed || members.size() < 2) return false;
  const Bytes& first = members[0]->out;
  if (first.empty()) return false;
  for (const auto& c : members) {
    if (c->closed || c->closing_ || c->out != first) return false;
  }
  std::vector<uint32_t> ids;
  ids.reserve(members.size());
  for (const auto& c : members) ids.push_back(c->channel_);
  wire::put_channel_shared(out, ids, first.data(), first.size());
  for (const auto& c : members) c->out.clear();
  replied();
  return true;
}

void TcpStoreConnection::send_channel_data(uint32_t id, const Bytes& bytes) {
  if (closed) return;
  wire::put_channel_data(out, id, bytes.data(), bytes.size());
  replied();
}

// A channel closed on this side (a bad frame, a refusal): the proxy closes its client.
void TcpStoreConnection::channel_closed(uint32_t id) {
  if (channels_.erase(id) == 0 || closed) return;
  wire::put_channel_close(out, id);
  replied();
}

// The carrier closed: every channel goes with it, as every connection goes with the store.
void TcpStoreConnection::close_channels() {
  auto channels = std::move(channels_);
  channels_.clear();
  for (auto& entry : channels) entry.second->close();
}

}  // namespace dlaunch
