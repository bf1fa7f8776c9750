// The gloo process group with ranks as threads over loopback, bootstrapped through gloo's
// in-memory HashStore; and the bucketed gradient reducer on top of it.
#include <gtest/gtest.h>
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include "common/error.h"
#include "tests/worker/gloo_ranks.h"
#include "worker/comm/process_group_gloo.h"
#include "worker/ddp/grad_reducer.h"

namespace dlaunch::comm {
namespace {

using test::run_gloo_ranks;

TEST(GlooProcessGroup, Collectives) {
  const int world = 3;
  run_gloo_ranks(world, [&](ProcessGroup& pg) {
    EXPECT_EQ(pg.size(), world);
    std::vector<float> v = {1.0f * pg.rank(), 2.0f, -1.0f * pg.rank()};
    pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
    EXPECT_EQ(v, (std::vector<float>{3, 6, -3}));
    pg.allreduce(v.data(), v.size(), ReduceOp::kAvg);  // already equal: unchanged
    EXPECT_EQ(v, (std::vector<float>{3, 6, -3}));
    std::vector<double> m = {static_cast<double>(pg.rank())};
    pg.allreduce(m.data(), 1, ReduceOp::kMax);
    EXPECT_EQ(m[0], world - 1);
    // Doubles stay doubles (SyncBN's sums): 1e8 + 0.125 per rank is not a float.
    std::vector<double> d = {1e8 + 0.125 * (pg.rank() + 1), 16777217.0};
    pg.allreduce(d.data(), d.size(), ReduceOp::kSum);
    EXPECT_EQ(d[0], 3e8 + 0.75);
    EXPECT_EQ(d[1], 3 * 16777217.0);
    // gloo reads host memory only: SyncBN on a GPU stages through the host (sync_batch_norm.h).
    EXPECT_FALSE(pg.device_allreduce());
    EXPECT_THROW(pg.allreduce_device(d.data(), d.size(), ReduceOp::kSum), InternalError);

    std::vector<float> b(1000, static_cast<float>(pg.rank() + 10));
    pg.broadcast(b.data(), b.size() * sizeof(float), 1);
    for (float x : b) ASSERT_EQ(x, 11.0f);

    std::vector<uint8_t> mine(pg.rank() + 1, static_cast<uint8_t>(pg.rank()));
    auto all = pg.allgather(mine);
    ASSERT_EQ(all.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(all[r], std::vector<uint8_t>(r + 1, static_cast<uint8_t>(r)));
    }
    pg.barrier();
  });
}

TEST(GlooProcessGroup, AsyncAllreduceOverlapsWithBlockingCalls) {
  run_gloo_ranks(2, [](ProcessGroup& pg) {
    std::vector<std::vector<float>> bufs(8, std::vector<float>(100000, 1.0f + pg.rank()));
    std::vector<std::shared_ptr<Work>> works;
    for (auto& b : bufs) {
      works.push_back(pg.allreduce_async(b.data(), b.size(), ReduceOp::kAvg));
      // A blocking collective between async ones must not interfere (separate channel).
      std::vector<float> x = {1.0f};
      pg.allreduce(x.data(), 1, ReduceOp::kSum);
      EXPECT_EQ(x[0], 2.0f);
    }
    for (auto& w : works) w->wait();
    for (auto& b : bufs) {
      for (float v : b) ASSERT_EQ(v, 1.5f);
    }
  });
}

TEST(GlooProcessGroup, PeerExitSurfacesAsError) {
  gloo::rendezvous::HashStore store;
  std::exception_ptr survivor_error;
  std::thread quitter([&] {
    GlooOptions opts;
    opts.timeout = std::chrono::seconds(5);
    auto pg = make_gloo_process_group(store, 1, 2, opts);
  });  // destroys its group at once
  std::thread survivor([&] {
    GlooOptions opts;
    opts.timeout = std::chrono::seconds(5);
    auto pg = make_gloo_process_group(store, 0, 2, opts);
    quitter.join();
    std::vector<float> v(10, 1.0f);
    try {
      pg->allreduce(v.data(), v.size(), ReduceOp::kSum);
    } catch (...) {
      survivor_error = std::current_exception();
    }
  });
  survivor.join();
  ASSERT_TRUE(survivor_error);
  try {
    std::rethrow_exception(survivor_error);
  } catch (const ConnectionError&) {
  } catch (const TimeoutError&) {
  }
}

TEST(GradReducer, BucketsTileTheBufferAndAverage) {
  std::vector<model::ParamInfo> params;
  size_t off = 0;
  for (size_t count : {10, 3000, 7, 5000, 20, 400, 6000, 30}) {
    params.push_back(model::ParamInfo{"p" + std::to_string(params.size()), off, count, false});
    off += count;
  }
  run_gloo_ranks(2, [&](ProcessGroup& pg) {
    std::vector<float> grads(off);
    ddp::GradReducer reducer(pg, grads.data(), params, 16 * 1024);  // 4096 floats per bucket
    const auto& buckets = reducer.buckets();
    ASSERT_GE(buckets.size(), 3u);
    EXPECT_EQ(buckets.front().first, 0u);
    EXPECT_EQ(buckets.back().second, off);
    for (size_t i = 1; i < buckets.size(); ++i) EXPECT_EQ(buckets[i].first, buckets[i - 1].second);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < off; ++i) grads[i] = static_cast<float>(i % 97) * (pg.rank() + 1) + step;
      reducer.begin_step();
      for (const auto& p : params) reducer.on_grad_ready(p.offset, p.count);
      reducer.finish();
      for (size_t i = 0; i < off; ++i) {
        ASSERT_FLOAT_EQ(grads[i], static_cast<float>(i % 97) * 1.5f + step) << i;
      }
    }
    // Without callbacks finish() still reduces everything.
    std::fill(grads.begin(), grads.end(), static_cast<float>(pg.rank()));
    reducer.begin_step();
    reducer.finish();
    for (float g : grads) ASSERT_EQ(g, 0.5f);
  });
}

// Gradients the process group cannot read (a GPU's) go through the host mirror: the staging
// copies stand in for the device's here (a fake for the logic; the real copies are the CUDA
// backend's). Each bucket is copied out once when ready, the reduced buffer copied back once in
// finish(), and the process group never sees the gradients' own memory.
TEST(GradReducer, StagedGradientsAreCopiedOutPerBucketAndBackOnce) {
  std::vector<model::ParamInfo> params;
  size_t off = 0;
  for (size_t count : {10, 3000, 7, 5000, 20}) {
    params.push_back(model::ParamInfo{"p" + std::to_string(params.size()), off, count, false});
    off += count;
  }
  run_gloo_ranks(2, [&](ProcessGroup& pg) {
    std::vector<float> grads(off);
    size_t copied_out = 0, copies_back = 0;
    ddp::GradStaging staging{[&](float* host, const float* g, size_t n) {
                               EXPECT_NE(host, g);
                               std::copy(g, g + n, host);
                               copied_out += n;
                             },
                             [&](float* g, const float* host, size_t n) {
                               std::copy(host, host + n, g);
                               ++copies_back;
                               EXPECT_EQ(n, off);
                             }};
    ddp::GradReducer reducer(pg, grads.data(), params, 16 * 1024, staging);
    for (size_t i = 0; i < off; ++i) grads[i] = static_cast<float>(i % 13) * (pg.rank() + 1);
    reducer.begin_step();
    for (const auto& p : params) reducer.on_grad_ready(p.offset, p.count);
    reducer.finish();
    EXPECT_EQ(copied_out, off);
    EXPECT_EQ(copies_back, 1u);
    for (size_t i = 0; i < off; ++i) ASSERT_FLOAT_EQ(grads[i], static_cast<float>(i % 13) * 1.5f) << i;
  });
}

}  // namespace
}  // namespace dlaunch::comm
