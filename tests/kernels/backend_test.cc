// kernels::Backend: the CPU backend is the kernels::cpu ops behind the op table (same results,
// bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend.h"

namespace dlaunch {
namespace {

TEST(Backend, CpuBackendIsTheCpuOps) {
  kernels::Backend& be = kernels::cpu_backend();
  EXPECT_EQ(be.name(), "cpu");
  EXPECT_TRUE(be.host_accessible());
  EXPECT_EQ(be.preferred_cblock(64), kernels::cpu::preferred_cblock(64));
  std::vector<float> a(100), b(100), y1(100), y2(100);
  for (int i = 0; i < 100; ++i) a[i] = std::sin(i * 0.3f), b[i] = std::cos(i * 0.7f);
  be.add(100, a.data(), b.data(), y1.data());
  kernels::cpu::add(100, a.data(), b.data(), y2.data());
  EXPECT_EQ(y1, y2);
  be.fill(100, 2.5f, y1.data());
  EXPECT_EQ(y1[99], 2.5f);
  // Memory: zeroed, aligned, copies both ways.
  auto* p = static_cast<float*>(be.alloc(40));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(p[9], 0.f);
  be.copy_from_host(p, a.data(), 40);
  std::vector<float> back(10);
  be.copy_to_host(back.data(), p, 40);
  EXPECT_EQ(back[3], a[3]);
  be.free(p);
}

}  // namespace
}  // namespace dlaunch
