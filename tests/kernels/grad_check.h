// Finite-difference helpers shared by the kernel and model tests.
//
// Every gradient test uses the scalar probe L(out) = sum_i r_i * out_i with fixed random r, so
// dL/d(out) = r is what the backward op receives, and compares the analytic dL/d(input) with
// central differences (L(x + eps) - L(x - eps)) / (2 eps) evaluated in double on a sample of
// input coordinates.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace dlaunch::test {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks analytic[i] against central differences of loss() w.r.t. x[i] for up to `samples`
// coordinates (all when x is small). loss() reads x. Tolerance: |fd - an| <= atol + rtol * |fd|.
inline void expect_gradient(const char* what, std::vector<float>& x,
                            const std::vector<float>& analytic, const std::function<double()>& loss,
                            double eps = 1e-2, double atol = 1e-3, double rtol = 1e-2,
                            size_t samples = 64, uint32_t seed = 7) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<size_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  if (idx.size() > samples) {
    std::mt19937 rng(seed);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(samples);
  }
  int failures = 0;
  for (size_t i : idx) {
    const float orig = x[i];
    x[i] = static_cast<float>(orig + eps);
    const double up = loss();
    x[i] = static_cast<float>(orig - eps);
    const double down = loss();
    x[i] = orig;
    const double fd = (up - down) / (2 * eps);
    const double an = analytic[i];
    if (std::fabs(fd - an) > atol + rtol * std::fabs(fd)) {
      if (++failures <= 5)
        ADD_FAILURE() << what << ": d/dx[" << i << "] analytic " << an << " finite difference " << fd;
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << idx.size() << " coordinates off";
}

}  // namespace dlaunch::test
