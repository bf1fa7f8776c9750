// The NCCL process group on real GPUs: skipped without one (the CI machines have none). One rank
// per GPU, as threads, bootstrapped through the in-memory store; with one GPU, a world of one,
// plus a world of two whose second rank never comes (init must time out, not hang).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/error.h"
#include "rendezvous/store/in_memory_store.h"
#include "worker/comm/process_group_nccl.h"

namespace dlaunch::comm {
namespace {

TEST(NcclProcessGroup, CollectivesOnEveryGpu) {
  int gpus = cuda_device_count();
  if (gpus < 1) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none or an error)";
  const int world = gpus;
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> failures(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = make_nccl_process_group(*store, r, world, r);
        const size_t n = 1 << 20;
        std::vector<float> host(n, static_cast<float>(r + 1));
        float* dev = nullptr;
        cudaMalloc(&dev, n * sizeof(float));
        cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
        pg->allreduce(dev, n, ReduceOp::kSum);
        auto work = pg->allreduce_async(dev, n, ReduceOp::kAvg);
        work->wait();
        cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost);
        float want = world * (world + 1) / 2.0f;
        for (float v : host) {
          if (v != want) {
            failures[r] = "allreduce gave " + std::to_string(v) + ", want " + std::to_string(want);
            break;
          }
        }
        auto all = pg->allgather(std::vector<uint8_t>(r + 1, static_cast<uint8_t>(r)));
        for (int k = 0; k < world; ++k) {
          if (all[k] != std::vector<uint8_t>(k + 1, static_cast<uint8_t>(k))) failures[r] = "allgather";
        }
        pg->barrier();
        // Host memory (the trainer's metadata collectives) is staged through the device.
        std::vector<double> sums = {1.5 + r, 1e8 + 0.125};
        pg->allreduce(sums.data(), sums.size(), ReduceOp::kSum);
        if (sums[0] != 1.5 * world + world * (world - 1) / 2.0 || sums[1] != world * (1e8 + 0.125))
          failures[r] = "host allreduce gave " + std::to_string(sums[0]) + ", " + std::to_string(sums[1]);
        std::vector<char> text(37, static_cast<char>('a' + r));
        pg->broadcast(text.data(), text.size(), 0);
        if (text != std::vector<char>(37, 'a')) failures[r] = "host broadcast";
        // Device memory written by a kernel queued on the default (compute) stream just before.
        cudaMemsetAsync(dev, 0, n * sizeof(float), cudaStreamLegacy);
        pg->broadcast(dev, n * sizeof(float), 0);
        cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost);
        if (host[n - 1] != 0.0f) failures[r] = "device broadcast did not see the memset";
        // SyncBN's in-stream all-reduce: queued on the compute stream after the copy that wrote
        // the values, read by a copy queued after it, with no wait by the host in between.
        if (!pg->device_allreduce()) failures[r] = "the NCCL group must reduce device memory";
        std::vector<double> stats = {0.5 + r, 1e8 + 0.125, 3.0 + r};
        double* dstats = nullptr;
        cudaMalloc(&dstats, stats.size() * sizeof(double));
        cudaMemcpyAsync(dstats, stats.data(), stats.size() * sizeof(double), cudaMemcpyHostToDevice,
                        cudaStreamLegacy);
        pg->allreduce_device(dstats, stats.size(), ReduceOp::kSum);
        cudaMemcpy(stats.data(), dstats, stats.size() * sizeof(double), cudaMemcpyDeviceToHost);
        const double base = world * (world - 1) / 2.0;
        if (stats[0] != 0.5 * world + base || stats[1] != world * (1e8 + 0.125) ||
            stats[2] != 3.0 * world + base)
          failures[r] = "device allreduce gave " + std::to_string(stats[0]) + ", " +
                        std::to_string(stats[2]);
        cudaFree(dstats);
        cudaFree(dev);
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(NcclProcessGroup, InitTimesOutWhenAPeerNeverJoins) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none or an error)";
  InMemoryStore store;
  NcclOptions options;
  options.timeout = std::chrono::seconds(3);
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 of 2; rank 1 never starts.
  EXPECT_THROW(make_nccl_process_group(store, 0, 2, 0, options), TimeoutError);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 60) << "init must give up near its 3 s timeout, not hang";
}

}  // namespace
}  // namespace dlaunch::comm
