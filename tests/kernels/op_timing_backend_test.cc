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

  // The training step's loss op marks the steps.
  const std::vector<float> logits{2, -1, 0.5f, 1.5f};
  const std::vector<int32_t> labels{0, 1};
  std::vector<float> dlogits(4), dlogits_ref(4);
  double sums[3] = {0, 0, 0}, sums_ref[3] = {0, 0, 0};
  timed.softmax_cross_entropy_sums(2, 2, logits.data(), labels.data(), dlogits.data(), 0.f, sums, 1);
  cpu.softmax_cross_entropy_sums(2, 2, logits.data(), labels.data(), dlogits_ref.data(), 0.f, sums_ref, 1);
  EXPECT_EQ(std::vector<double>(sums, sums + 3), std::vector<double>(sums_ref, sums_ref + 3));
  EXPECT_EQ(dlogits, dlogits_ref);
  EXPECT_EQ(timed.steps_counted(), 0);  // the first step is the warm-up one

  timed.softmax_cross_entropy_sums(2, 2, logits.data(), labels.data(), dlogits.data(), 0.f, sums, 1);  // step 2
  // An evaluation batch's loss returns its value on the host: a host read, and not a step.
  int64_t correct = 0;
  const float loss = timed.softmax_cross_entropy(2, 2, logits.data(), labels.data(), nullptr, &correct);
  EXPECT_EQ(loss, cpu.softmax_cross_entropy(2, 2, logits.data(), labels.data(), nullptr, nullptr));
  double back[3];
  timed.copy_to_host(back, sums, sizeof(back));  // a host read too
  timed.add(3, a.data(), b.data(), y.data());
  timed.add(3, a.data(), b.data(), y.data());
  timed.relu_forward(3, a.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{1, 0, 3}));
  EXPECT_EQ(timed.steps_counted(), 1);

  const std::string report = timed.report();
  EXPECT_EQ(calls_of(report, "add"), 2) << report;  // not 3: the warm-up call is left out
  EXPECT_EQ(calls_of(report, "relu_forward"), 1) << report;
  EXPECT_EQ(calls_of(report, "softmax_cross_entropy_sums"), 1) << report;
  EXPECT_EQ(calls_of(report, "softmax_cross_entropy"), 1) << report;
  EXPECT_EQ(timed.host_reads(), 2) << report;
  EXPECT_NE(report.find("host reads after the warm-up: 2 "), std::string::npos) << report;
  EXPECT_EQ(calls_of(report, "sgd_step"), -1) << report;
  EXPECT_NE(report.find("1 training step(s) after 1 skipped"), std::string::npos) << report;
}

}  // namespace
}  // namespace dlaunch::kernels
