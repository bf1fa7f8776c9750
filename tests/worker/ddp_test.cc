// Data parallelism is exact: two ranks (threads over loopback gloo) with SyncBN, each seeing half
// of the global batch, train exactly like one rank on the whole batch; and SyncBN's forward and
// backward match plain batch norm on the concatenated batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "kernels/ops.h"
#include "tests/worker/gloo_ranks.h"
#include "worker/comm/process_group_gloo.h"
#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"
#include "worker/ddp/data_parallel.h"
#include "worker/model/batch_norm.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/weight_ema.h"

namespace dlaunch::ddp {
namespace {

using namespace dlaunch::model;
using namespace dlaunch::optim;

constexpr int kGlobalBatch = 8;
constexpr int kSteps = 5;

ResNetConfig small_net() {
  ResNetConfig c;
  c.depth = 18;
  c.width = 4;
  return c;
}

OptimConfig sgd() {
  OptimConfig o;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 5e-4;
  return o;
}

const data::ImageDataset& dataset() {
  static const data::ImageDataset ds = data::make_synthetic(3, true);
  return ds;
}

// Global batch of step s: samples [8s, 8s + 8), augmented with epoch = s; `part` of `parts`.
data::Batch batch(int step, int part, int parts) {
  std::vector<int64_t> idx;
  int per = kGlobalBatch / parts;
  for (int i = 0; i < per; ++i) idx.push_back(step * kGlobalBatch + part * per + i);
  return data::make_batch(dataset(), idx, /*augment=*/true, /*seed=*/9, /*epoch=*/step);
}

Tensor to_tensor(const data::Batch& b) {
  Tensor t({b.size, 3, 32, 32});
  std::memcpy(t.data(), b.images.data(), b.images.size() * sizeof(float));
  return t;
}

using test::run_gloo_ranks;

struct Trace {
  std::vector<double> losses;
  std::vector<float> first_grads;
  std::vector<float> final_params;
  std::vector<float> final_running_mean;
};

Trace train_single() {
  auto pg = comm::make_local_process_group();
  ResNet model(small_net(), 1);
  DataParallel dp(model, *pg, /*sync_bn=*/true);
  Optimizer opt(sgd());
  Trace t;
  for (int s = 0; s < kSteps; ++s) {
    data::Batch b = batch(s, 0, 1);
    StepResult r = dp.train_step(to_tensor(b), b.labels.data());
    t.losses.push_back(r.loss);
    if (s == 0) t.first_grads.assign(model.grads(), model.grads() + model.num_params());
    opt.step(model.params(), model.grads(), model.num_params(), 0.05f, model.param_info());
  }
  t.final_params.assign(model.params(), model.params() + model.num_params());
  Tensor* rm = model.buffers().front();
  t.final_running_mean.assign(rm->data(), rm->data() + rm->numel());
  return t;
}

TEST(DataParallel, TwoRanksWithSyncBnEqualOneRankOnTheGlobalBatch) {
  kernels::cpu::set_num_threads(1);
  Trace single = train_single();
  std::vector<Trace> traces(2);
  run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    // Different seeds per rank: the initial broadcast must make the replicas identical.
    ResNet model(small_net(), 1 + 100 * pg.rank());
    DataParallel dp(model, pg, /*sync_bn=*/true, /*bucket_bytes=*/64 * 1024);
    EXPECT_GT(dp.reducer().buckets().size(), 2u);
    dp.broadcast_state();
    Optimizer opt(sgd());
    Trace& t = traces[pg.rank()];
    for (int s = 0; s < kSteps; ++s) {
      data::Batch b = batch(s, pg.rank(), 2);
      StepResult r = dp.train_step(to_tensor(b), b.labels.data());
      double loss = r.loss;
      pg.allreduce(&loss, 1, comm::ReduceOp::kAvg);
      t.losses.push_back(loss);
      if (s == 0) t.first_grads.assign(model.grads(), model.grads() + model.num_params());
      opt.step(model.params(), model.grads(), model.num_params(), 0.05f, model.param_info());
    }
    t.final_params.assign(model.params(), model.params() + model.num_params());
    Tensor* rm = model.buffers().front();
    t.final_running_mean.assign(rm->data(), rm->data() + rm->numel());
  });
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(traces[r].losses[s], single.losses[s], 1e-4) << "rank " << r << " step " << s;
    }
    // SyncBN backward + gradient averaging: the global-batch gradient.
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < single.first_grads.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(traces[r].first_grads[i]) - single.first_grads[i]));
      max_abs = std::max(max_abs, std::fabs(double(single.first_grads[i])));
    }
    EXPECT_LT(max_diff, 1e-4 * std::max(1.0, max_abs)) << "rank " << r;
    for (size_t i = 0; i < single.final_params.size(); ++i) {
      ASSERT_NEAR(traces[r].final_params[i], single.final_params[i], 1e-4) << "param " << i;
    }
    // SyncBN running statistics are those of the global batch on every rank.
    for (size_t i = 0; i < single.final_running_mean.size(); ++i) {
      EXPECT_NEAR(traces[r].final_running_mean[i], single.final_running_mean[i], 1e-4);
    }
  }
  // The losses changed over the steps: the comparison is not between constants.
  EXPECT_NE(single.losses.front(), single.losses.back());
}

// A process group that counts the blocking double all-reduces (SyncBN's statistics on the CPU;
// gradient buckets are float and asynchronous) and forwards everything to a real group.
class CountingGroup : public comm::ProcessGroup {
 public:
  explicit CountingGroup(comm::ProcessGroup& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  void allreduce(float* data, size_t count, comm::ReduceOp op) override {
    inner_.allreduce(data, count, op);
  }
  void allreduce(double* data, size_t count, comm::ReduceOp op) override {
    ++double_allreduces;
    inner_.allreduce(data, count, op);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    inner_.broadcast(data, bytes, root);
  }
  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override {
    return inner_.allgather(mine);
  }
  void barrier() override { inner_.barrier(); }
  std::shared_ptr<comm::Work> allreduce_async(float* data, size_t count,
                                              comm::ReduceOp op) override {
    return inner_.allreduce_async(data, count, op);
  }
  int double_allreduces = 0;

 private:
  comm::ProcessGroup& inner_;
};

// Blocking double all-reduces in one training step, and the model's BN buffers (2 per layer).
std::pair<int, size_t> syncbn_collectives_in_a_step(comm::ProcessGroup& pg, bool sync_bn) {
  CountingGroup counting(pg);
  ResNet model(small_net(), 1);
  DataParallel dp(model, counting, sync_bn);
  data::Batch b = batch(0, pg.rank(), pg.size());
  dp.train_step(to_tensor(b), b.labels.data());
  return {counting.double_allreduces, model.buffers().size()};
}

// A world of one, or no --sync_bn, is plain batch norm: no SyncBN collective at all. With SyncBN
// on two ranks the counter sees two per layer (forward and backward), so it can fail.
TEST(DataParallel, SyncBnRunsNoCollectiveInAWorldOfOneOrWhenOff) {
  kernels::cpu::set_num_threads(1);
  auto local = comm::make_local_process_group();
  EXPECT_EQ(syncbn_collectives_in_a_step(*local, /*sync_bn=*/true).first, 0);
  run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    EXPECT_EQ(syncbn_collectives_in_a_step(pg, /*sync_bn=*/false).first, 0);
    const auto [calls, bn_buffers] = syncbn_collectives_in_a_step(pg, /*sync_bn=*/true);
    EXPECT_GT(bn_buffers, 0u);
    EXPECT_EQ(static_cast<size_t>(calls), bn_buffers);
  });
}

TEST(DataParallel, SyncBnForwardMatchesBatchNormOnTheConcatenatedBatch) {
  kernels::cpu::set_num_threads(1);
  // One rank, plain BN, whole batch.
  ResNet ref(small_net(), 5);
  data::Batch whole = batch(0, 0, 1);
  Tensor logits_ref = ref.forward(to_tensor(whole), true);
  // Without sync, each half normalised by its own statistics gives different logits.
  ResNet local(small_net(), 5);
  data::Batch half0 = batch(0, 0, 2);
  Tensor logits_local = local.forward(to_tensor(half0), true);
  double unsynced_diff = 0;
  for (int64_t i = 0; i < logits_local.numel(); ++i) {
    unsynced_diff = std::max(unsynced_diff, std::fabs(double(logits_local.data()[i]) - logits_ref.data()[i]));
  }
  EXPECT_GT(unsynced_diff, 1e-3);

  run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    ResNet model(small_net(), 5);
    ProcessGroupBatchNormSync sync(pg);
    model.set_batchnorm_sync(&sync);
    data::Batch half = batch(0, pg.rank(), 2);
    const Tensor& logits = model.forward(to_tensor(half), true);
    const int64_t classes = logits.dim(1);
    for (int64_t i = 0; i < logits.numel(); ++i) {
      int64_t row = pg.rank() * half.size + i / classes;
      EXPECT_NEAR(logits.data()[i], logits_ref.data()[row * classes + i % classes], 1e-4);
    }
    model.set_batchnorm_sync(nullptr);
  });
}

// The count travels in SyncBN's buffer with the sums (batch_norm_sync.h): ranks holding different
// numbers of images (3 and 5) normalise with the statistics of all 8, forward and backward, like
// one layer on the union. Were the count not summed with the sums (each rank dividing the global
// sums by its own count, or by an assumed equal share), the means, variances and dx would differ.
TEST(SyncBatchNorm, UnequalLocalBatchesEqualOneLayerOnTheUnion) {
  kernels::cpu::set_num_threads(1);
  constexpr int64_t kC = 16, kH = 3, kW = 2, kBlock = 8, kImage = kC * kH * kW;
  const int64_t first[2] = {0, 3}, count[2] = {3, 5};
  auto values = [](int64_t n, uint32_t seed, float lo, float hi) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(gen);
    return v;
  };
  const std::vector<float> x = values(8 * kImage, 1, -2.f, 3.f), dy = values(8 * kImage, 2, -1.f, 1.f),
                           gamma = values(kC, 3, 0.5f, 1.5f), beta = values(kC, 4, -1.f, 1.f);
  struct Result {
    std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var;
  };
  // One training forward (fused ReLU) and backward of images [begin, begin + n).
  auto run = [&](int64_t begin, int64_t n, BatchNormSync* sync) {
    const kernels::ActShape s{n, kC, kH, kW, kBlock};
    const float* xs = x.data() + begin * kImage;
    Result r{std::vector<float>(n * kImage), std::vector<float>(n * kImage),
             std::vector<float>(kC), std::vector<float>(kC), {}, {}};
    BatchNorm2d bn(kC);
    bn.bind(gamma.data(), beta.data(), r.dgamma.data(), r.dbeta.data());
    bn.forward(s, xs, nullptr, /*relu=*/true, /*training=*/true, sync, r.y.data());
    bn.backward(s, xs, dy.data() + begin * kImage, r.y.data(), sync, r.dx.data());
    r.running_mean = bn.running_mean().to_host();
    r.running_var = bn.running_var().to_host();
    return r;
  };
  const Result whole = run(0, 8, nullptr);
  const Result alone = run(0, 3, nullptr);  // rank 0's images by themselves: the test can fail
  EXPECT_GT(std::fabs(alone.running_var[0] - whole.running_var[0]), 1e-4);

  std::vector<Result> ranks(2);
  run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    ProcessGroupBatchNormSync sync(pg);
    ranks[pg.rank()] = run(first[pg.rank()], count[pg.rank()], &sync);
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Result& mine = ranks[r];
    const size_t offset = static_cast<size_t>(first[r] * kImage);
    for (size_t i = 0; i < mine.y.size(); ++i) {
      ASSERT_NEAR(mine.y[i], whole.y[offset + i], 1e-5) << "y at " << i;
      ASSERT_NEAR(mine.dx[i], whole.dx[offset + i], 1e-5) << "dx at " << i;
    }
    for (int64_t c = 0; c < kC; ++c) {
      // The running variance is unbiased with the global count (8 images x 6 pixels), not 3 x 6.
      EXPECT_NEAR(mine.running_mean[c], whole.running_mean[c], 1e-6) << "channel " << c;
      EXPECT_NEAR(mine.running_var[c], whole.running_var[c], 1e-6) << "channel " << c;
    }
  }
  // dgamma and dbeta stay local sums (DDP reduces them with the other gradients).
  for (int64_t c = 0; c < kC; ++c) {
    EXPECT_NEAR(ranks[0].dgamma[c] + ranks[1].dgamma[c], whole.dgamma[c], 1e-4) << "channel " << c;
    EXPECT_NEAR(ranks[0].dbeta[c] + ranks[1].dbeta[c], whole.dbeta[c], 1e-4) << "channel " << c;
  }
}

// --ema across ranks without SyncBN: the averaged parameters agree by construction (every rank
// applies the same averaged gradients), the averaged running statistics drift apart with each
// rank's own batches, and rank 0's broadcast (the trainer's, before evaluating and checkpointing)
// makes the whole average identical on every rank.
TEST(DataParallel, EmaIsIdenticalOnEveryRankAfterTheBufferBroadcast) {
  kernels::cpu::set_num_threads(1);
  std::vector<std::vector<float>> before(2), after(2), params(2);
  run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    ResNet model(small_net(), 1);
    DataParallel dp(model, pg, /*sync_bn=*/false);
    dp.broadcast_state();
    Optimizer opt(sgd());
    WeightEma ema(model, 0.8, 1);
    for (int s = 0; s < kSteps; ++s) {
      data::Batch b = batch(s, pg.rank(), 2);
      dp.train_step(to_tensor(b), b.labels.data());
      opt.step(model.params(), model.grads(), model.num_params(), 0.05f, model.param_info());
      ema.after_step(opt.step_count());
    }
    const int r = pg.rank();
    before[r] = ema.state();
    params[r].assign(before[r].begin(), before[r].begin() + static_cast<long>(model.num_params()));
    for (Tensor* t : ema.buffers()) broadcast_tensor(pg, *t);
    after[r] = ema.state();
  });
  EXPECT_EQ(params[0], params[1]);
  EXPECT_NE(before[0], before[1]);  // the statistics differed: the broadcast had work to do
  EXPECT_EQ(after[0], after[1]);
  EXPECT_EQ(after[0], before[0]);  // rank 0's values won
}

}  // namespace
}  // namespace dlaunch::ddp
