// The connection side of the TCP store server, as Asio's HTTP server example splits it: a
// connection per client (I/O, framing, dialect detection, the job token) and the manager that
// holds them and what they share; the request handler is TcpStoreState (socket-free).
//
// Threading: everything here runs on the server's one thread (its io_context); nothing blocks.
// Errors: a client's I/O error or bad request closes that connection only (logged); nothing
// here throws to the server.
// Asio appears in this header, so only the server's own .cc files include it.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rendezvous/tcp/channel_frames.h"
#include "rendezvous/tcp/store_stats.h"
#include "rendezvous/tcp/tcp_store_server_options.h"
#include "rendezvous/tcp/tcp_store_state.h"

namespace dlaunch {

class TcpStoreConnection;
using TcpStoreConnectionPtr = std::shared_ptr<TcpStoreConnection>;

// What the connections of one server share, and the set of open ones. Owned by the server.
class TcpStoreConnectionManager {
 public:
  TcpStoreConnectionManager(boost::asio::io_context& ctx, const TcpStoreServerOptions& options)
      : ctx(ctx), options(options) {}

  // Takes a newly accepted socket and starts reading from it.
  void start(boost::asio::ip::tcp::socket socket);
  // Forgets a closed connection (called by the connection itself).
  void remove(const TcpStoreConnectionPtr& c);
  // Closes every connection and forgets every waiter and watcher (the server stops).
  void stop_all();
  // Connections open right now; any thread may read it (approximate).
  size_t size() const { return open_.load(std::memory_order_relaxed); }
  // Since start (any thread): the most open at once, how many were accepted, and how many
  // channels proxies opened (each a client's connection carried by a proxy's).
  size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  int64_t channels_opened() const { return channels_opened_.load(std::memory_order_relaxed); }
  void note_channel_opened() { channels_opened_.fetch_add(1, std::memory_order_relaxed); }

  // Logs a refused or malformed client, at most once a second (the rest are counted).
  void complain(const std::string& message);

  boost::asio::io_context& ctx;
  const TcpStoreServerOptions& options;
  // The store itself.
  TcpStoreState state;
  // Requests served and their latency, for the agent's /status (read from any thread).
  StoreStats stats;
  // Decoded requests land here, reused (no allocation per request for short keys).
  wire::Request scratch;
  // Peers that proved the job token (see admit_unauthenticated_from_agent_hosts).
  std::set<boost::asio::ip::address> agent_hosts;

 private:
  std::unordered_set<TcpStoreConnectionPtr> connections_;
  std::atomic<size_t> open_{0};
  std::atomic<size_t> peak_{0};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> channels_opened_{0};
  std::chrono::steady_clock::time_point last_complaint_{};
  size_t suppressed_complaints_ = 0;
};

// One client connection. Its replies collect in `out` (StoreSession's) and go out in one write
// per batch of requests read. A malformed or oversized frame closes it (logged, rate-limited).
//
// Or one channel of a connection that carries many (CHANNELS, rendezvous/tcp/channel_frames.h):
// the same session without a socket of its own. Its bytes come in its carrier's DATA frames
// and its replies go out as such; its close is the carrier's CLOSED frame.
class TcpStoreConnection final : public StoreSession {
 public:
  TcpStoreConnection(TcpStoreConnectionManager& manager, boost::asio::ip::tcp::socket socket);
  // A channel of `carrier`.
  TcpStoreConnection(TcpStoreConnectionManager& manager, TcpStoreConnectionPtr carrier,
                     uint32_t channel);

  // Starts reading requests.
  void start();
  // Closes the socket and leaves the manager; pending handlers see `closed`. Idempotent.
  void close();

 private:
  TcpStoreConnectionPtr self() {
    return std::static_pointer_cast<TcpStoreConnection>(shared_from_this());
  }
  // StoreSession: replies appended outside handle(), and a parked request answered.
  void replied() override;
  void resumed() override;

  void start_read();
  // Channels: the carrier's side, and a channel's.
  void process_channel_frames();
  void open_channel(uint32_t id);
  void handle_group(const wire::ChannelFrame& f);
  bool share_replies(const std::vector<TcpStoreConnectionPtr>& members);
  void send_channel_data(uint32_t id, const Bytes& bytes);
  void channel_closed(uint32_t id);
  void feed(const uint8_t* data, size_t size);
  void close_channels();
  void send(const Bytes& bytes);
  void flush();
  void bad_frame(const std::string& why);
  void process();
  void process_frames();
  void handle(wire::Request& q);
  void handle_auth(const wire::Request& q);
  bool admit(const wire::Request& q);
  void declare_run(const std::string& run_id);
  // Sends `reply`, then closes the connection; reads nothing more from it. `why` is logged
  // (rate-limited).
  void refuse(const Bytes& reply, const std::string& why);
  void arm_wait_timeout(uint64_t timeout_ms);

  TcpStoreConnectionManager& manager_;
  boost::asio::ip::tcp::socket socket_;
  std::string peer_;  // "addr:port", for logs
  boost::asio::ip::address peer_address_;
  Bytes in_;    // received bytes; [in_begin_, in_.size()) not yet decoded
  static constexpr size_t kSmallRead = 4096, kLargeRead = 65536;
  std::unique_ptr<uint8_t[]> rbuf_;  // the buffer of the pending read, rbuf_size_ bytes
  size_t rbuf_size_ = 0;
  size_t in_begin_ = 0;
  Bytes out_writing_;
  bool writing_ = false;
  bool reading_ = false;
  bool in_process_ = false;  // inside process(): replies collect in `out`, one write
  bool closing_ = false;     // refused: close once `out` is written
  bool process_posted_ = false;
  // A parked WAIT_GET's timeout. wait_generation_ counts the WAIT_GETs parked, so a timer that
  // fires after its request was answered (or cancelled) does not expire a later one.
  boost::asio::steady_timer wait_timer_;
  uint64_t wait_generation_ = 0;
  bool dialect_known_ = false;
  wire::Dialect dialect_ = wire::Dialect::kTorch113;
  // Job token state.
  bool authenticated_ = false;
  bool admitted_ = false;  // allowed to use the store (authenticated, or no token needed)
  bool auth_begun_ = false;
  wire::Digest client_nonce_{}, server_nonce_{};
  // A carrier of channels (after CHANNELS), and its open channels by id.
  bool carries_channels_ = false;
  bool shared_replies_ = false;  // the proxy reads SHARED frames (channel_frames.h)
  std::unordered_map<uint32_t, TcpStoreConnectionPtr> channels_;
  // A channel: the connection that carries it (null for a connection of its own).
  TcpStoreConnectionPtr carrier_;
  uint32_t channel_ = 0;
};

}  // namespace dlaunch
