// Mixed precision's pure parts: the bf16/fp16 rounding of kernels/dtype.h (known values, ties,
// overflow, subnormals, NaN), the CPU ops built on it, and the loss scaler's rules as a table
// (PyTorch's GradScaler: init 65536, x2 after 2000 clean steps, x0.5 and skip on inf/NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "worker/optim/grad_scaler.h"

namespace dlaunch {
namespace {

using namespace dlaunch::optim;

using kernels::Dtype;
const float kInf = std::numeric_limits<float>::infinity();

struct RoundCase {
  Dtype dtype;
  float in, out;
};

TEST(PrecisionRounding, KnownValuesTiesOverflowAndSubnormals) {
  const RoundCase cases[] = {
      // bf16: 7 mantissa bits, ulp at 1 is 2^-7.
      {Dtype::kBF16, 1.0f, 1.0f},
      {Dtype::kBF16, 1.0f + 0x1p-8f, 1.0f},                    // tie -> even (1.0)
      {Dtype::kBF16, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},      // tie -> even (up)
      {Dtype::kBF16, 1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f},  // above the tie -> up
      {Dtype::kBF16, -3.14159265f, -3.140625f},
      {Dtype::kBF16, 0x1.c3p100f, 0x1.c4p100f},  // fp32's range; the tie goes to even (up)
      {Dtype::kBF16, std::numeric_limits<float>::max(), kInf},  // rounds past the largest bf16
      {Dtype::kBF16, 1e-40f, 0x1p-133f},  // an fp32 subnormal keeps its top bits
      // fp16: 10 mantissa bits, ulp at 1 is 2^-10; largest 65504; smallest subnormal 2^-24.
      {Dtype::kF16, 1.0f + 0x1p-11f, 1.0f},                    // tie -> even
      {Dtype::kF16, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f},
      {Dtype::kF16, 0.1f, 0.0999755859375f},
      {Dtype::kF16, 65504.0f, 65504.0f},
      {Dtype::kF16, 65519.99f, 65504.0f},
      {Dtype::kF16, 65520.0f, kInf},                           // halfway to 65536: overflow
      {Dtype::kF16, -70000.0f, -kInf},
      {Dtype::kF16, 0x1p-14f, 0x1p-14f},                       // smallest normal
      {Dtype::kF16, 0x1p-24f, 0x1p-24f},                       // smallest subnormal
      {Dtype::kF16, 0x1p-25f, 0.0f},                           // tie -> even (zero)
      {Dtype::kF16, 3 * 0x1p-25f, 0x1p-23f},                   // tie -> even (2 * 2^-24)
      {Dtype::kF16, 1e-9f, 0.0f},
      {Dtype::kF16, -1e-9f, -0.0f},
      {Dtype::kF32, 0.1f, 0.1f},
  };
  for (const RoundCase& c : cases) {
    const float got = kernels::round_to_dtype(c.dtype, c.in);
    if (std::isinf(c.out)) {
      EXPECT_EQ(got, c.out) << kernels::dtype_name(c.dtype) << " of " << c.in;
    } else {
      EXPECT_FLOAT_EQ(got, c.out) << kernels::dtype_name(c.dtype) << " of " << c.in;
      EXPECT_EQ(std::signbit(got), std::signbit(c.out)) << c.in;
    }
  }
  for (Dtype d : {Dtype::kBF16, Dtype::kF16}) {
    EXPECT_TRUE(std::isnan(kernels::round_to_dtype(d, std::nanf(""))));
    EXPECT_EQ(kernels::round_to_dtype(d, kInf), kInf);
  }
}

// Every float that is already a bf16/fp16 value stays itself, and rounding moves a value by at
// most half an ulp of the type: checked over a sweep of magnitudes against exact arithmetic.
TEST(PrecisionRounding, HalfUlpBoundAndIdempotence) {
  for (Dtype d : {Dtype::kBF16, Dtype::kF16}) {
    const int mantissa = d == Dtype::kBF16 ? 7 : 10;
    for (double x = 1e-4; x < 6e4; x *= 1.0007) {
      const float f = static_cast<float>(x);
      const float r = kernels::round_to_dtype(d, f);
      const double ulp = std::ldexp(1.0, std::ilogb(f) - mantissa);
      ASSERT_LE(std::fabs(static_cast<double>(r) - f), ulp / 2 * (1 + 1e-12))
          << kernels::dtype_name(d) << " " << f;
      ASSERT_EQ(kernels::round_to_dtype(d, r), r) << kernels::dtype_name(d) << " " << f;
    }
  }
}

// The 16-bit codes the CUDA tensor-core paths narrow to and widen from (kernels/dtype.h): known
// encodings, then every one of the 65536 codes of each type widens to a float that rounds to
// itself and narrows back to the same code (NaNs: to a NaN), and narrowing any float gives the
// code of its rounding, so the CUDA paths round exactly as the emulation does.
TEST(PrecisionRounding, SixteenBitCodesRoundTripAndNarrowAsTheRoundingDoes) {
  EXPECT_EQ(kernels::f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(kernels::f16_bits(-2.0f), 0xc000);
  EXPECT_EQ(kernels::f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(kernels::f16_bits(65520.0f), 0x7c00);  // overflow: inf
  EXPECT_EQ(kernels::f16_bits(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(kernels::f16_bits(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(kernels::f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(kernels::f16_bits(0.1f), 0x2e66);
  EXPECT_EQ(kernels::bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(kernels::bf16_bits(-3.14159265f), 0xc049);
  EXPECT_EQ(kernels::bf16_bits(std::nanf("")) & 0x7fc0, 0x7fc0);
  // A NaN whose payload sits in fp32's low half only stays a NaN (its top half alone is inf).
  uint32_t low_payload_nan = 0x7f800001u;
  float nan_low;
  std::memcpy(&nan_low, &low_payload_nan, sizeof nan_low);
  EXPECT_TRUE(std::isnan(kernels::bf16_value(kernels::bf16_bits(nan_low))));
  for (Dtype d : {Dtype::kBF16, Dtype::kF16}) {
    for (uint32_t code = 0; code < 0x10000u; ++code) {
      const auto bits = static_cast<uint16_t>(code);
      const float v = kernels::dtype_value(d, bits);
      if (std::isnan(v)) {
        ASSERT_TRUE(std::isnan(kernels::dtype_value(d, kernels::dtype_bits(d, v)))) << code;
        continue;
      }
      ASSERT_EQ(kernels::round_to_dtype(d, v), v) << kernels::dtype_name(d) << " code " << code;
      ASSERT_EQ(kernels::dtype_bits(d, v), bits) << kernels::dtype_name(d) << " code " << code;
    }
    for (double x = 1e-9; x < 1e6; x *= 1.00013) {
      for (float f : {static_cast<float>(x), -static_cast<float>(x)}) {
        const float r = kernels::round_to_dtype(d, f);
        ASSERT_EQ(kernels::dtype_value(d, kernels::dtype_bits(d, f)), r)
            << kernels::dtype_name(d) << " " << f;
      }
    }
  }
}

TEST(PrecisionRounding, CpuOpsRoundScaleAndUnscale) {
  kernels::Backend& be = kernels::cpu_backend();
  std::vector<float> x = {1.0f + 0x1p-8f, 65520.0f, 0.1f, -2.5f};
  std::vector<float> y(4);
  be.round_to_dtype(4, Dtype::kF16, x.data(), y.data());
  EXPECT_EQ(y[0], 1.0f + 0x1p-8f);  // exactly an fp16 value
  EXPECT_EQ(y[1], kInf);
  EXPECT_EQ(y[2], kernels::round_to_f16(0.1f));
  be.round_to_dtype(4, Dtype::kBF16, x.data(), x.data());  // in place
  EXPECT_EQ(x[0], 1.0f);
  be.scale(4, 4.0f, y.data(), y.data());
  EXPECT_EQ(y[3], -10.0f);
  std::vector<float> g = {2.0f, 4.0f, 8.0f};
  EXPECT_EQ(be.unscale_count_non_finite(3, 0.5f, g.data()), 0);
  EXPECT_EQ(g, (std::vector<float>{1.0f, 2.0f, 4.0f}));
  g = {2.0f, kInf, std::nanf(""), -kInf};
  EXPECT_EQ(be.unscale_count_non_finite(4, 0.5f, g.data()), 3);
  EXPECT_EQ(g[0], 1.0f);
}

// One row per step: whether its gradients overflowed, then the scale and tracker after it.
struct ScalerStep {
  bool found_inf;
  float scale;
  int64_t tracker;
};

void run_table(GradScaler& s, const std::vector<ScalerStep>& steps) {
  int i = 0;
  for (const ScalerStep& st : steps) {
    s.update(st.found_inf);
    EXPECT_EQ(s.scale(), st.scale) << "after step " << i;
    EXPECT_EQ(s.state().growth_tracker, st.tracker) << "after step " << i;
    ++i;
  }
}

TEST(GradScalerTable, PyTorchDefaultsBackoffAndGrowth) {
  GradScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  run_table(s, {{true, 32768, 0},     // overflow: halve, tracker reset
                {true, 16384, 0},     // again
                {false, 16384, 1},    // clean steps count
                {false, 16384, 2},
                {true, 8192, 0}});    // an overflow resets the count
  // 2000 clean steps grow the scale once, on the 2000th.
  for (int i = 1; i < 2000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 8192.0f);
  EXPECT_EQ(s.state().growth_tracker, 1999);
  run_table(s, {{false, 16384, 0}, {false, 16384, 1}});
}

TEST(GradScalerTable, SmallIntervalAndNoGrowthPastTheFloatRange) {
  GradScalerConfig c;
  c.growth_interval = 2;
  c.init_scale = 1.0f;
  GradScaler s(c);
  run_table(s, {{false, 1, 1}, {false, 2, 0}, {false, 2, 1}, {false, 4, 0}, {true, 2, 0}});
  // Growing past the largest float keeps the scale (PyTorch checks the new scale is finite).
  c.init_scale = std::numeric_limits<float>::max();
  GradScaler big(c);
  run_table(big, {{false, std::numeric_limits<float>::max(), 1},
                  {false, std::numeric_limits<float>::max(), 0}});
}

TEST(GradScalerTable, StateRoundTripsAndBadStateIsRefused) {
  GradScaler s;
  s.load_state({1024.0f, 17});
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  EXPECT_EQ(s.state().growth_tracker, 18);
  EXPECT_THROW(s.load_state({0.0f, 0}), UsageError);
  EXPECT_THROW(s.load_state({kInf, 0}), UsageError);
  EXPECT_THROW(s.load_state({8.0f, -1}), UsageError);
}

}  // namespace
}  // namespace dlaunch
