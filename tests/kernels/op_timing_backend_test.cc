// kernels::OpTimingBackend (DTRAIN_PROFILE_OPS): forwards every op unchanged, leaves the warm-up
// steps out and counts each later op call once.
#include "kernels/op_timing_backend.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

namespace dlaunch::kernels {
namespace {

// The calls column of `op`'s row in the report, or -1 when the op has no row.
int64_t calls_of(const std::string& report, const std::string& op) {
  std::smatch m;
  if (!std::regex_search(report, m, std::regex("\n" + op + " +([0-9]+) "))) return -1;
  return std::stoll(m[1]);
}

TEST(OpTimingBackend, ForwardsEveryOpAndCountsOnlyTheCallsAfterTheWarmUpSteps) {
  Backend& cpu = cpu_backend();
  OpTimingBackend timed(cpu, /*skip_steps=*/1);
  EXPECT_EQ(timed.name(), cpu.name());

  std::vector<float> a{1, -2, 3}, b{4, 5, -6}, y(3);
  timed.add(3, a.data(), b.data(), y.data());  // warm-up: before the first step's loss op
  EXPECT_EQ(y, (std::vector<float>{5, 3, -3}));

  const std::vector<float> logits{2, -1, 0.5f, 1.5f};
  const std::vector<int32_t> labels{0, 1};
  std::vector<float> dlogits(4), dlogits_ref(4);
  int64_t correct = 0, correct_ref = 0;
  const float loss = timed.softmax_cross_entropy(2, 2, logits.data(), labels.data(), dlogits.data(), &correct);
  const float loss_ref = cpu.softmax_cross_entropy(2, 2, logits.data(), labels.data(), dlogits_ref.data(), &correct_ref);
  EXPECT_EQ(loss, loss_ref);
  EXPECT_EQ(dlogits, dlogits_ref);
  EXPECT_EQ(correct, correct_ref);
  EXPECT_EQ(timed.steps_counted(), 0);  // the first step is the warm-up one

  timed.softmax_cross_entropy(2, 2, logits.data(), labels.data(), dlogits.data(), &correct);  // step 2
  timed.add(3, a.data(), b.data(), y.data());
  timed.add(3, a.data(), b.data(), y.data());
  timed.relu_forward(3, a.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{1, 0, 3}));
  EXPECT_EQ(timed.steps_counted(), 1);

  const std::string report = timed.report();
  EXPECT_EQ(calls_of(report, "add"), 2) << report;  // not 3: the warm-up call is left out
  EXPECT_EQ(calls_of(report, "relu_forward"), 1) << report;
  EXPECT_EQ(calls_of(report, "softmax_cross_entropy"), 1) << report;
  EXPECT_EQ(calls_of(report, "sgd_step"), -1) << report;
  EXPECT_NE(report.find("1 training step(s) after 1 skipped"), std::string::npos) << report;
}

}  // namespace
}  // namespace dlaunch::kernels
