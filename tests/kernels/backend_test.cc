// kernels::Backend: the CPU backend is the kernels::cpu ops behind the op table (same results,
// bit for bit), and, where a CUDA device is usable, five training steps of the same ResNet on
// the CPU and on CUDA agree (losses and parameters within 1e-4 relative; issue 10, item 8).
// The CUDA part skips with a reason on machines without a GPU (every CI machine).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kernels/backend.h"
#include "kernels/device.h"
#include "worker/model/loss.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"

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

kernels::Backend* cuda_backend() {
#ifdef DLAUNCH_CUDA_PLUGIN_PATH
  // Not beside the plugin as dtrain is (in the build; a bundle sets DLAUNCH_CUDA_PLUGIN itself).
  if (std::filesystem::exists(DLAUNCH_CUDA_PLUGIN_PATH)) {
    ::setenv("DLAUNCH_CUDA_PLUGIN", DLAUNCH_CUDA_PLUGIN_PATH, 0);
  }
#endif
  kernels::Backend* be = kernels::open_device(kernels::DeviceRequest::kAuto, 0).backend;
  return be->host_accessible() ? nullptr : be;
}

struct Trace {
  std::vector<float> losses;
  std::vector<float> params;
};

Trace train_five_steps(kernels::Backend& be) {
  ResNetConfig c;
  c.width = 8;
  ResNet net(c, 3, be);
  OptimConfig oc;
  oc.momentum = 0.9;
  oc.weight_decay = 5e-4;
  Optimizer opt(oc, be);
  Tensor images({8, 3, 32, 32});  // on the host: forward copies it over
  std::vector<int32_t> labels(8);
  Trace t;
  Tensor grad(be);
  for (int step = 0; step < 5; ++step) {
    for (int64_t i = 0; i < images.numel(); ++i)
      images.data()[i] = std::sin(0.01f * static_cast<float>(i) + static_cast<float>(step));
    for (int i = 0; i < 8; ++i) labels[i] = (i + step) % 10;
    t.losses.push_back(softmax_cross_entropy(net.forward(images, true), labels.data(), &grad, nullptr));
    net.backward(grad);
    opt.step(net.params(), net.grads(), net.num_params(), 0.05f, net.param_info());
  }
  t.params = net.params_tensor().to_host();
  return t;
}

TEST(Backend, CudaTrainsLikeTheCpu) {
  kernels::Backend* cuda = cuda_backend();
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device (or no CUDA plugin) on this machine";
  const Trace cpu = train_five_steps(kernels::cpu_backend());
  const Trace gpu = train_five_steps(*cuda);
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * std::abs(cpu.losses[i])) << "step " << i;
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    worst = std::max(worst, std::abs(double(gpu.params[i]) - cpu.params[i]) /
                                std::max(1e-3, std::abs(double(cpu.params[i]))));
  }
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace dlaunch
