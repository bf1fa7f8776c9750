// Optimizer (state, weight-decay exemptions, checkpoint state) and LR schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error.h"
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
