#include "worker/comm/process_group_gloo.h"

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <cstring>

#include "common/error.h"
#include "worker/comm/allgather_padded.h"
#include "worker/comm/comm_thread.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/shm_allreduce.h"

namespace dlaunch::comm {
namespace {

// Who is asking, for error messages: with two ranks the peer a collective waits for is known.
struct Caller {
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  std::string peer() const {
    return size == 2 ? fmt::format("rank {}", 1 - rank) : std::string("a peer rank");
  }
};

// gloo reports failures as its own exceptions; callers handle ours, which name the collective,
// this rank and (when known) the peer.
template <typename Fn>
void translate_gloo_errors(const char* what, const Caller& who, Fn&& fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    std::string msg = e.what();
    if (msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos) {
      throw TimeoutError(fmt::format(
          "gloo {} on rank {} of {} did not complete within the collective timeout ({} ms, "
          "--collective_timeout): {} is stuck or gone ({}); this worker exits so the launcher "
          "restarts the group",
          what, who.rank, who.size, who.timeout.count(), who.peer(), msg));
    }
    throw ConnectionError(fmt::format("gloo {} on rank {} of {} failed: {} ({} probably exited)",
                                      what, who.rank, who.size, msg, who.peer()));
  } catch (const gloo::Exception& e) {
    throw ConnectionError(fmt::format("gloo {} on rank {} of {} failed: {}", what, who.rank, who.size, e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    // gloo's internal checks derive from std::exception, not gloo::Exception; they too mean
    // this collective cannot go on, and the launcher should restart the group.
    throw ConnectionError(fmt::format("gloo {} on rank {} of {} failed a check: {}", what, who.rank, who.size, e.what()));
  }
}

template <typename T>
void reduce_avg_scale(T* data, size_t count, int size) {
  const T inv = T(1) / static_cast<T>(size);
  for (size_t i = 0; i < count; ++i) data[i] *= inv;
}

template <typename T>
void gloo_allreduce(const std::shared_ptr<gloo::Context>& ctx, const Caller& who, T* data, size_t count,
                    ReduceOp op) {
  if (count == 0) return;
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(data, count);
  if (op == ReduceOp::kMax) {
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<T>));
  } else {
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
  }
  opts.setTag(1);
  translate_gloo_errors("allreduce", who, [&] { gloo::allreduce(opts); });
  if (op == ReduceOp::kAvg) reduce_avg_scale(data, count, ctx->size);
}

std::shared_ptr<gloo::Context> connect(gloo::rendezvous::Store& store, const std::string& prefix,
                                       int rank, int size, const GlooOptions& options,
                                       std::shared_ptr<gloo::transport::Device>& device) {
  gloo::rendezvous::PrefixStore prefixed(prefix, store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  const auto connect_timeout = options.connect_timeout.count() > 0 ? options.connect_timeout : options.timeout;
  ctx->setTimeout(connect_timeout);
  translate_gloo_errors("connect", Caller{rank, size, connect_timeout},
                        [&] { ctx->connectFullMesh(prefixed, device); });
  ctx->setTimeout(options.timeout);  // every collective from here on
  return ctx;
}

class GlooProcessGroup : public ProcessGroup {
 public:
  GlooProcessGroup(gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& options)
      : rank_(rank), size_(size), who_{rank, size, options.timeout} {
    if (size < 1 || rank < 0 || rank >= size) {
      throw UsageError(fmt::format("gloo process group: rank {} of size {} is invalid", rank, size));
    }
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) {
      attr.iface = options.iface;
    } else {
      attr.hostname = options.hostname;
    }
    translate_gloo_errors("device creation", who_, [&] { device_ = gloo::transport::tcp::CreateDevice(attr); });
    sync_ = connect(store, "sync", rank, size, options, device_);
    async_ = connect(store, "async", rank, size, options, device_);
    // After sync_ is up: the bootstrap uses this group's gloo allgather/broadcast.
    shm_ = ShmAllreduce::create(*this, options.timeout);
  }

  ~GlooProcessGroup() override { comm_.reset(); }  // drain the async queue before contexts die

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }

  // Small vectors on one host go through shared memory (SyncBN, metrics); every rank passes
  // the same count, so every rank picks the same path.
  void allreduce(float* data, size_t count, ReduceOp op) override {
    if (shm_ && ShmAllreduce::fits(count, sizeof(float))) return shm_->allreduce(data, count, op);
    gloo_allreduce(sync_, who_, data, count, op);
  }
  void allreduce(double* data, size_t count, ReduceOp op) override {
    if (shm_ && ShmAllreduce::fits(count, sizeof(double))) return shm_->allreduce(data, count, op);
    gloo_allreduce(sync_, who_, data, count, op);
  }

  bool uses_shared_memory() const { return shm_ != nullptr; }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    gloo::BroadcastOptions opts(sync_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);  // the root sends its output buffer
    opts.setRoot(root);
    opts.setTag(2);
    translate_gloo_errors("broadcast", who_, [&] { gloo::broadcast(opts); });
  }

  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override {
    auto sizes = [&](uint64_t my_size) { return gather_blocks(std::vector<uint64_t>{my_size}, 3); };
    auto blocks = [&](const std::vector<uint8_t>& block) { return gather_blocks(block, 4); };
    return allgather_padded(size_, mine, sizes, blocks);
  }

  // Every rank's `mine` (all of one size), rank after rank; `tag` tells the two of an
  // allgather apart.
  template <typename T>
  std::vector<T> gather_blocks(std::vector<T> mine, int tag) {
    std::vector<T> out(mine.size() * static_cast<size_t>(size_));
    gloo::AllgatherOptions opts(sync_);
    opts.setInput(mine.data(), mine.size());
    opts.setOutput(out.data(), out.size());
    opts.setTag(tag);
    translate_gloo_errors("allgather", who_, [&] { gloo::allgather(opts); });
    return out;
  }

  void barrier() override {
    gloo::BarrierOptions opts(sync_);
    opts.setTag(5);
    translate_gloo_errors("barrier", who_, [&] { gloo::barrier(opts); });
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override {
    return comm_->submit([this, data, count, op] {
      if (abandoned_.load(std::memory_order_acquire)) {
        throw ConnectionError(fmt::format(
            "gloo allreduce on rank {} of {} not started: the group was abandoned after a failure",
            rank_, size_));
      }
      gloo_allreduce(async_, who_, data, count, op);
    });
  }

  // The training thread (the one caller of the blocking collectives) is here, so no collective
  // runs on the sync context and its connections can close now: the peers blocked on this rank
  // there fail at once and abandon theirs in turn. The async context stays open until the
  // destructor: an allreduce may still run on it on the communication thread, and it ends when
  // its peers (which abandon too) close theirs, or the collective timeout.
  void abandon() override {
    abandoned_.store(true, std::memory_order_release);
    if (shm_) shm_->abandon();
    try {
      sync_->closeConnections();
    } catch (const std::exception&) {
      // a pair already broken by the failure: nothing left to close
    }
  }

 private:
  int rank_;
  int size_;
  Caller who_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> sync_;
  std::shared_ptr<gloo::Context> async_;
  std::unique_ptr<ShmAllreduce> shm_;  // null: every allreduce uses gloo
  std::unique_ptr<CommThread> comm_ = std::make_unique<CommThread>();
  std::atomic<bool> abandoned_{false};
};

}  // namespace

bool gloo_uses_shared_memory(const ProcessGroup& pg) {
  auto* gloo_pg = dynamic_cast<const GlooProcessGroup*>(&pg);
  return gloo_pg != nullptr && gloo_pg->uses_shared_memory();
}

std::unique_ptr<ProcessGroup> make_gloo_process_group(gloo::rendezvous::Store& store, int rank,
                                                      int size, const GlooOptions& options) {
  return std::make_unique<GlooProcessGroup>(store, rank, size, options);
}

std::unique_ptr<ProcessGroup> make_gloo_process_group(dlaunch::Store& store, int rank, int size,
                                                      const GlooOptions& options) {
  GlooStoreAdapter adapter(store);
  return std::make_unique<GlooProcessGroup>(adapter, rank, size, options);
}

}  // namespace dlaunch::comm
