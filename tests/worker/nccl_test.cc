// The NCCL process group on real GPUs: skipped without one (every machine the tests run on
// today). One rank per GPU, as threads, bootstrapped through the in-memory store.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>

#include "rendezvous/in_memory_store.h"
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
        cudaFree(dev);
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

}  // namespace
}  // namespace dlaunch::comm
