// Optimizer (state, weight-decay exemptions, checkpoint state) and LR schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/op_timing_backend.h"
#include "kernels/optim_update.h"
#include "worker/model/resnet.h"
#include "worker/optim/lr_schedule.h"
#include "worker/optim/optimizer.h"

namespace dlaunch {
namespace {

using namespace dlaunch::model;
using namespace dlaunch::optim;

TEST(Optimizer, SgdMomentumStateAndDecayExemption) {
  OptimConfig cfg;
  cfg.kind = OptimKind::kSgd;
  cfg.momentum = 0.9;
  cfg.weight_decay = 0.1;
  cfg.decay_bn_and_bias = false;
  Optimizer opt(cfg);
  std::vector<float> p = {1.f, 1.f}, g = {0.f, 0.f};
  const std::vector<ParamInfo> infos = {{"bn.weight", 0, 1, true}, {"conv.weight", 1, 1, false}};
  opt.step(p.data(), g.data(), 2, 0.5f, infos);
  EXPECT_FLOAT_EQ(p[0], 1.f);               // exempt: zero gradient, no decay
  EXPECT_FLOAT_EQ(p[1], 1.f - 0.5f * 0.1f);  // decayed
  EXPECT_EQ(opt.step_count(), 1);
  ASSERT_EQ(opt.state().size(), 2u);
  EXPECT_FLOAT_EQ(opt.state()[1], 0.1f);
  opt.step(p.data(), g.data(), 2, 0.5f, infos);  // buf = 0.9 * 0.1 + 0.1 * 0.95
  EXPECT_NEAR(opt.state()[1], 0.09f + 0.095f, 1e-6);

  // Restoring the state continues identically.
  Optimizer again(cfg);
  std::vector<float> q = {1.f, 0.95f};
  again.load_state({0.f, 0.1f}, 1);
  again.step(q.data(), g.data(), 2, 0.5f, infos);
  EXPECT_FLOAT_EQ(q[1], p[1]);
  EXPECT_THROW(again.load_state({1.f}, 3), UsageError);
}

// torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True) from p = 1 with the
// gradient 1 at every step, worked by hand: d = g + wd p; buf = first ? d : 0.9 buf + d;
// p -= lr (d + 0.9 buf).
TEST(Optimizer, NesterovStepsMatchAHandComputedTable) {
  OptimConfig cfg;
  cfg.momentum = 0.9;
  cfg.nesterov = true;
  cfg.weight_decay = 0.1;
  Optimizer opt(cfg);
  struct Row {
    double buf, p;
  };
  const Row table[] = {
      {1.1, 1 - 0.1 * (1.1 + 0.9 * 1.1)},                          // 0.791
      {0.9 * 1.1 + 1.0791, 0.791 - 0.1 * (1.0791 + 0.9 * 2.0691)},  // 0.496871
      {0.9 * 2.0691 + 1.0496871, 0.496871 - 0.1 * (1.0496871 + 0.9 * 2.9118771)},  // 0.1298334
  };
  std::vector<float> p = {1.f};
  const std::vector<float> g = {1.f};
  for (const Row& row : table) {
    opt.step(p.data(), g.data(), 1, 0.1f, {});
    EXPECT_NEAR(opt.state()[0], row.buf, 1e-5) << "step " << opt.step_count();
    EXPECT_NEAR(p[0], row.p, 1e-5) << "step " << opt.step_count();
  }
  EXPECT_NEAR(p[0], 0.1298334, 1e-6);
}

// Plain SGD (no momentum, so one step is p -= lr * (g + wd * p)) over a BN weight, a conv
// weight and the fc bias, with --no_bn_weight_decay and --bn_lr_scale 4.
TEST(Optimizer, BatchNormLearningRateScaleAndDecayExemption) {
  OptimConfig cfg;
  cfg.momentum = 0;
  cfg.weight_decay = 0.5;
  cfg.decay_bn_and_bias = false;
  cfg.bn_lr_scale = 4;
  Optimizer opt(cfg);
  const std::vector<ParamInfo> infos = {{"bn1.weight", 0, 1, true, true},
                                        {"conv1.weight", 1, 1, false, false},
                                        {"fc.bias", 2, 1, true, false}};
  std::vector<float> p = {1.f, 1.f, 1.f};
  const std::vector<float> g = {1.f, 1.f, 1.f};
  opt.step(p.data(), g.data(), 3, 0.1f, infos);
  EXPECT_FLOAT_EQ(p[0], 1.f - 0.4f * 1.f);          // lr x 4, no decay
  EXPECT_FLOAT_EQ(p[1], 1.f - 0.1f * (1.f + 0.5f));  // lr, decayed
  EXPECT_FLOAT_EQ(p[2], 1.f - 0.1f * 1.f);          // lr, no decay (a bias)

  // Decay on (PyTorch's default) with the scale: the BN weight is decayed at lr x 4.
  cfg.decay_bn_and_bias = true;
  Optimizer decayed(cfg);
  std::vector<float> q = {1.f, 1.f, 1.f};
  decayed.step(q.data(), g.data(), 3, 0.1f, infos);
  EXPECT_FLOAT_EQ(q[0], 1.f - 0.4f * 1.5f);
  EXPECT_FLOAT_EQ(q[2], 1.f - 0.1f * 1.5f);

  cfg.bn_lr_scale = -1;
  EXPECT_THROW(Optimizer{cfg}, UsageError);
}

// The per-tensor steps the optimizer made before its grouped op (one sgd_step/adam_step per
// ParamInfo, the group's lr and weight decay), kept as the reference.
void per_tensor_step(const OptimConfig& c, std::vector<float>& p, const std::vector<float>& g,
                     std::vector<float>& state, float lr, int64_t step, const std::vector<ParamInfo>& infos) {
  kernels::Backend& cpu = kernels::cpu_backend();
  const size_t n = p.size();
  for (const ParamInfo& info : infos) {
    const bool exempt = info.no_weight_decay && !c.decay_bn_and_bias;
    const float wd = exempt ? 0.f : static_cast<float>(c.weight_decay);
    const float group_lr = info.batch_norm ? static_cast<float>(lr * c.bn_lr_scale) : lr;
    const size_t b = info.offset;
    if (c.kind == OptimKind::kSgd) {
      cpu.sgd_step(static_cast<int64_t>(info.count), p.data() + b, g.data() + b, state.data() + b, group_lr,
                   static_cast<float>(c.momentum), c.nesterov, wd, step == 1);
    } else {
      cpu.adam_step(static_cast<int64_t>(info.count), p.data() + b, g.data() + b, state.data() + b,
                    state.data() + n + b, group_lr, static_cast<float>(c.beta1), static_cast<float>(c.beta2),
                    static_cast<float>(c.eps), wd, step);
    }
  }
}

// Issue 11 item 2, one multi-tensor optimizer call: with --bn_lr_scale and --no_bn_weight_decay the
// optimizer makes ONE grouped call per step over a real ResNet-18's parameters (62 tensors), and
// every parameter and state value equals the per-tensor steps bit for bit, for SGD (Nesterov,
// weight decay) and Adam over 4 steps with a changing learning rate.
TEST(Optimizer, GroupedStepIsOneCallAndEqualsThePerTensorStepsBitForBit) {
  ResNet net(ResNetConfig{18, 4, 3, 10, 32}, 0);
  const std::vector<ParamInfo>& infos = net.param_info();
  const size_t n = static_cast<size_t>(net.num_params());
  ASSERT_GT(infos.size(), 60u);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> p0(n), grads(n);
  for (auto& x : p0) x = normal(rng);
  for (OptimKind kind : {OptimKind::kSgd, OptimKind::kAdam}) {
    OptimConfig c;
    c.kind = kind;
    c.nesterov = kind == OptimKind::kSgd;
    c.weight_decay = 5e-4;
    c.decay_bn_and_bias = false;
    c.bn_lr_scale = 3;
    kernels::OpTimingBackend counting(kernels::cpu_backend(), /*skip_steps=*/0);
    // The counter counts from the first loss op on (it marks a training step).
    const float logits[2] = {0.f, 1.f};
    const int32_t label = 1;
    float dlogits[2];
    double sums[3] = {0, 0, 0};
    counting.softmax_cross_entropy_sums(1, 2, logits, &label, dlogits, 0.f, sums, 1);
    Optimizer opt(c, counting);
    std::vector<float> p = p0, ref = p0, ref_state(kind == OptimKind::kSgd ? n : 2 * n, 0.f);
    for (int64_t step = 1; step <= 4; ++step) {
      for (auto& x : grads) x = normal(rng);
      const float lr = 0.1f / static_cast<float>(step);
      opt.step(p.data(), grads.data(), n, lr, infos);
      per_tensor_step(c, ref, grads, ref_state, lr, step, infos);
    }
    EXPECT_EQ(0, std::memcmp(p.data(), ref.data(), n * sizeof(float))) << "parameters differ";
    const std::vector<float> state = opt.state();
    ASSERT_EQ(state.size(), ref_state.size());
    EXPECT_EQ(0, std::memcmp(state.data(), ref_state.data(), state.size() * sizeof(float))) << "state differs";
    const std::string report = counting.report();
    const char* op = kind == OptimKind::kSgd ? "sgd_step_grouped" : "adam_step_grouped";
    EXPECT_NE(report.find(std::string("\n") + op + " "), std::string::npos) << report;
    EXPECT_EQ(report.find("sgd_step "), std::string::npos) << report;
    EXPECT_EQ(report.find("adam_step "), std::string::npos) << report;
  }
}

// The CUDA kernel's per-element view of the groups (optim_update.h: segment_of, segment_lr,
// adam_step_size; the GPU runs the same functions), checked here against the CPU op: every
// element finds its segment and takes that segment's lr and weight decay.
TEST(Optimizer, GroupedStepsPerElementViewEqualsTheSegmentLoop) {
  const std::vector<kernels::OptimSegment> segs = {{0, 3, 1.0, 5e-4f}, {3, 4, 3.0, 0.f}, {4, 9, 1.0, 5e-4f},
                                                   {9, 10, 3.0, 0.f}};
  const int64_t n = 10, count = static_cast<int64_t>(segs.size());
  std::vector<float> p(n), g(n), buf(n, 0.f), m(n, 0.f), v(n, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = 0.3f * static_cast<float>(i) - 1;
    g[i] = 0.7f - 0.11f * static_cast<float>(i);
  }
  for (int64_t i = 0; i < n; ++i) {
    const kernels::OptimSegment& s = kernels::segment_of(segs.data(), count, i);
    EXPECT_TRUE(s.begin <= i && i < s.end) << i;
  }
  std::vector<float> ps = p, pe = p, bs = buf, be = buf, ms = m, me = m, vs = v, ve = v;
  kernels::cpu_backend().sgd_step_grouped(count, segs.data(), n, ps.data(), g.data(), bs.data(), 0.1f, 0.9f,
                                          true, true);
  kernels::cpu_backend().adam_step_grouped(count, segs.data(), n, ps.data(), g.data(), ms.data(), vs.data(),
                                           1e-3f, 0.9f, 0.999f, 1e-8f, 3);
  const double bc1 = kernels::adam_bc1(0.9f, 3);
  const kernels::AdamCorrection k = kernels::adam_correction(1e-3f, 0.9f, 0.999f, 3);
  for (int64_t i = 0; i < n; ++i) {  // the kernels' loop bodies, one element at a time
    const kernels::OptimSegment& s = kernels::segment_of(segs.data(), count, i);
    kernels::sgd_update(pe[i], g[i], be[i], kernels::segment_lr(0.1f, s), 0.9f, true, s.weight_decay, true);
  }
  for (int64_t i = 0; i < n; ++i) {
    const kernels::OptimSegment& s = kernels::segment_of(segs.data(), count, i);
    const kernels::AdamCorrection ks{kernels::adam_step_size(kernels::segment_lr(1e-3f, s), bc1), k.bc2_sqrt};
    kernels::adam_update(pe[i], g[i], me[i], ve[i], ks, 0.9f, 0.999f, 1e-8f, s.weight_decay);
  }
  EXPECT_EQ(ps, pe);
  EXPECT_EQ(bs, be);
  EXPECT_EQ(ms, me);
  EXPECT_EQ(vs, ve);
  EXPECT_NE(ps[3] - p[3], ps[2] - p[2]) << "the lr x 3 group must differ from its neighbour";
}

TEST(Optimizer, AdamStateHoldsBothMoments) {
  OptimConfig cfg;
  cfg.kind = OptimKind::kAdam;
  Optimizer opt(cfg);
  std::vector<float> p = {0.f, 0.f, 0.f}, g = {1.f, -2.f, 0.f};
  opt.step(p.data(), g.data(), 3, 0.01f, {});
  ASSERT_EQ(opt.state().size(), 6u);
  // First Adam step moves every parameter with a gradient by about lr, against its sign.
  EXPECT_NEAR(p[0], -0.01f, 1e-6);
  EXPECT_NEAR(p[1], 0.01f, 1e-6);
  EXPECT_EQ(p[2], 0.f);
  EXPECT_NEAR(opt.state()[3 + 1], 0.001f * 4, 1e-7);  // v = (1 - beta2) g^2
}

TEST(Optimizer, RejectsBadConfig) {
  OptimConfig cfg;
  cfg.nesterov = true;
  cfg.momentum = 0;
  EXPECT_THROW(Optimizer{cfg}, UsageError);
  EXPECT_THROW(parse_optim_kind("adamw"), UsageError);
  EXPECT_EQ(parse_optim_kind("adam"), OptimKind::kAdam);
}

TEST(LrSchedule, TriangleRisesToThePeakAndFallsToZeroAtTheEnd) {
  LrSchedule s;
  s.kind = parse_lr_schedule("triangle");
  s.base_lr = 0.4;
  s.warmup_epochs = 2;
  s.total_epochs = 10;
  const double table[][2] = {{0, 0},     {1, 0.2},   {2, 0.4},  {4, 0.3},
                             {6, 0.2},   {9, 0.05},  {10, 0},   {12, 0}};
  for (const auto& row : table) EXPECT_NEAR(lr_at(s, row[0]), row[1], 1e-12) << "epoch " << row[0];
  s.warmup_epochs = 0;  // a linear decay from the peak
  EXPECT_NEAR(lr_at(s, 0), 0.4, 1e-12);
  EXPECT_NEAR(lr_at(s, 7.5), 0.1, 1e-12);
}

TEST(LrSchedule, WarmupThenCosineStepConstant) {
  LrSchedule s;
  s.kind = LrScheduleKind::kCosine;
  s.base_lr = 0.1;
  s.warmup_epochs = 1;
  s.total_epochs = 21;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 0.5), 0.05);
  EXPECT_DOUBLE_EQ(lr_at(s, 1), 0.1);
  EXPECT_NEAR(lr_at(s, 11), 0.05, 1e-12);
  EXPECT_NEAR(lr_at(s, 21), 0.0, 1e-12);
  EXPECT_NEAR(lr_at(s, 30), 0.0, 1e-12);
  s.kind = LrScheduleKind::kStep;
  s.warmup_epochs = 0;
  s.step_size = 10;
  EXPECT_DOUBLE_EQ(lr_at(s, 9.9), 0.1);
  EXPECT_NEAR(lr_at(s, 10), 0.01, 1e-12);
  EXPECT_NEAR(lr_at(s, 25), 0.001, 1e-12);
  s.kind = LrScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(lr_at(s, 100), 0.1);
  EXPECT_EQ(parse_lr_schedule("step"), LrScheduleKind::kStep);
  EXPECT_THROW(parse_lr_schedule("linear"), UsageError);
}

}  // namespace
}  // namespace dlaunch
