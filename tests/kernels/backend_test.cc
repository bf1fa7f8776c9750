// kernels::Backend: the CPU backend is the kernels::cpu ops behind the op table (same results,
// bit for bit), and, where a CUDA device is usable, five training steps of the same ResNet on
// the CPU and on CUDA agree (losses and parameters within 1e-4 relative; issue 10, item 8).
// The CUDA part skips with a reason on machines without a GPU (every CI machine). And the op x
// backend x precision table: each op with its inputs rounded to bf16/fp16 by the backend, and
// its outputs rounded by the op (convolutions, linear) or the backend (the rest), agrees with the
// CPU fp32 op within that precision's tolerance (ggml's test-backend-ops is the model); on the
// CPU that checks the emulation, on a GPU also the CUDA rounding and the tensor-core paths of the
// convolutions and the linear layer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/device.h"
#include "worker/model/loss.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"
#include "tests/support/cuda_device.h"

namespace dlaunch {
namespace {

using namespace dlaunch::model;
using namespace dlaunch::optim;

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
  kernels::Backend* cuda = testing::cuda_backend_or_null();
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

// One op of the precision table: its inputs (sizes), its output size and how to run it in a
// precision. The convolutions and the linear layer take the precision (`native`): they round
// their own outputs, and CUDA runs them on tensor cores with 16-bit operands
// (op_signatures.inc); the other ops compute on fp32 storage and the table rounds their outputs
// as the model's store() does.
struct PrecisionOp {
  std::string name;
  std::vector<int64_t> input_sizes;
  int64_t output_size;
  bool native;
  using Inputs = const std::vector<const float*>&;
  std::function<void(kernels::Backend&, kernels::Dtype, Inputs, float*)> run;
};

// Forward, backward-data (overwriting and accumulating) and backward-weights of one convolution.
void add_conv_ops(std::vector<PrecisionOp>& ops, const std::string& label,
                  const kernels::ConvShape& s) {
  const int64_t x = s.in().numel(), w = s.weight_numel(), y = s.out().numel();
  using In = PrecisionOp::Inputs;
  ops.push_back({"conv2d_forward " + label, {x, w}, y, true,
                 [s](kernels::Backend& be, kernels::Dtype d, In in, float* out) {
                   be.conv2d_forward(s, in[0], in[1], out, d);
                 }});
  ops.push_back({"conv2d_backward_data " + label, {y, w}, x, true,
                 [s](kernels::Backend& be, kernels::Dtype d, In in, float* out) {
                   be.conv2d_backward_data(s, in[0], in[1], out, /*accumulate=*/false, d);
                 }});
  ops.push_back({"conv2d_backward_data+accumulate " + label, {y, w, x}, x, true,
                 [s, x](kernels::Backend& be, kernels::Dtype d, In in, float* out) {
                   be.copy(out, in[2], static_cast<size_t>(x) * sizeof(float));
                   be.conv2d_backward_data(s, in[0], in[1], out, /*accumulate=*/true, d);
                 }});
  ops.push_back({"conv2d_backward_weights " + label, {x, y}, w, true,
                 [s](kernels::Backend& be, kernels::Dtype d, In in, float* out) {
                   be.conv2d_backward_weights(s, in[0], in[1], out, d);
                 }});
}

std::vector<PrecisionOp> precision_ops() {
  using In = PrecisionOp::Inputs;
  std::vector<PrecisionOp> ops;
  add_conv_ops(ops, "3x3", {4, 16, 8, 8, 16, 3, 1, 1, 1, 1});
  add_conv_ops(ops, "3x3 from 3 channels (the stem)", {4, 3, 8, 8, 16, 3, 1, 1, 1, 1});
  add_conv_ops(ops, "1x1 stride 2 (downsample)", {4, 16, 8, 8, 32, 1, 2, 0, 1, 1});
  const kernels::ActShape act{4, 16, 8, 8, 1};
  ops.push_back({"linear_forward", {8 * 64, 10 * 64, 10}, 8 * 10, true,
                 [](kernels::Backend& be, kernels::Dtype d, In in, float* y) {
                   be.linear_forward(8, 64, 10, in[0], in[1], in[2], y, d);
                 }});
  // Its three outputs side by side: dx (8 x 64), dw (10 x 64), db (10).
  ops.push_back({"linear_backward", {8 * 64, 10 * 64, 8 * 10}, 8 * 64 + 10 * 64 + 10, true,
                 [](kernels::Backend& be, kernels::Dtype d, In in, float* y) {
                   be.linear_backward(8, 64, 10, in[0], in[1], in[2], y, y + 8 * 64,
                                      y + 8 * 64 + 10 * 64, d);
                 }});
  ops.push_back({"batch_norm_apply+add+relu", {act.numel(), 16, 16, act.numel()}, act.numel(),
                 false,
                 [act](kernels::Backend& be, kernels::Dtype, In in, float* y) {
                   be.batch_norm_apply(act, in[0], in[1], in[2], in[3], true, y);
                 }});
  ops.push_back({"global_avg_pool_forward", {act.numel()}, 4 * 16, false,
                 [act](kernels::Backend& be, kernels::Dtype, In in, float* y) {
                   be.global_avg_pool_forward(act, in[0], y);
                 }});
  ops.push_back({"add", {1000, 1000}, 1000, false,
                 [](kernels::Backend& be, kernels::Dtype, In in, float* y) {
                   be.add(1000, in[0], in[1], y);
                 }});
  return ops;
}

// A value in [-1, 1) from a hash of i: test inputs without the long-range order of a sine, whose
// correlations make some convolution sums cancel to far below their terms (then a rounding error
// of the terms is large against the result, whatever the precision's accuracy).
float uniform_value(uint64_t i) {
  uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<float>(static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-52 - 1.0);
}

// The largest |a - b| relative to the largest |b| (at least 1).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst / scale;
}

// `values` on `be`, in its memory; freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(kernels::Backend& be, const std::vector<float>& values)
      : be_(be), p_(static_cast<float*>(be.alloc(values.size() * sizeof(float)))) {
    be.copy_from_host(p_, values.data(), values.size() * sizeof(float));
  }
  ~DeviceBuffer() { be_.free(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return p_; }

 private:
  kernels::Backend& be_;
  float* p_;
};

std::vector<float> to_host(kernels::Backend& be, const float* p, size_t n) {
  std::vector<float> out(n);
  be.copy_to_host(out.data(), p, n * sizeof(float));
  return out;
}

TEST(Backend, OpsInEveryPrecisionAgreeWithCpuFp32) {
  std::vector<kernels::Backend*> backends = {&kernels::cpu_backend()};
  if (kernels::Backend* cuda = testing::cuda_backend_or_null()) backends.push_back(cuda);
  // fp32: summation order only (CPU vs GPU); bf16: 8 significant bits; fp16: 11.
  const std::pair<kernels::Dtype, double> precisions[] = {
      {kernels::Dtype::kF32, 1e-5}, {kernels::Dtype::kBF16, 3e-2}, {kernels::Dtype::kF16, 4e-3}};
  for (const PrecisionOp& op : precision_ops()) {
    std::vector<std::vector<float>> inputs;
    for (size_t k = 0; k < op.input_sizes.size(); ++k) {
      std::vector<float> v(static_cast<size_t>(op.input_sizes[k]));
      for (size_t i = 0; i < v.size(); ++i) v[i] = uniform_value(k * 1000003 + i) * (k + 1.5f);
      inputs.push_back(std::move(v));
    }
    std::vector<float> ref(static_cast<size_t>(op.output_size));
    std::vector<const float*> host_in;
    for (const auto& v : inputs) host_in.push_back(v.data());
    op.run(kernels::cpu_backend(), kernels::Dtype::kF32, host_in, ref.data());
    for (kernels::Backend* be : backends) {
      for (const auto& [dtype, tol] : precisions) {
        SCOPED_TRACE(op.name + " on " + be->name() + " in " + kernels::dtype_name(dtype));
        std::vector<std::unique_ptr<DeviceBuffer>> mem;
        std::vector<const float*> dev_in;
        for (const auto& v : inputs) {
          mem.push_back(std::make_unique<DeviceBuffer>(*be, v));
          float* p = mem.back()->get();
          if (dtype != kernels::Dtype::kF32) be->round_to_dtype(int64_t(v.size()), dtype, p, p);
          dev_in.push_back(p);
        }
        DeviceBuffer y(*be, std::vector<float>(ref.size()));
        op.run(*be, dtype, dev_in, y.get());
        if (dtype != kernels::Dtype::kF32 && !op.native)
          be->round_to_dtype(int64_t(ref.size()), dtype, y.get(), y.get());
        const std::vector<float> got = to_host(*be, y.get(), ref.size());
        const double diff = max_rel_diff(got, ref);
        EXPECT_LE(diff, tol);
        // The low precisions really rounded (else the tolerance check says nothing) and every
        // output is a value of the type, rounded as kernels/dtype.h rounds on the host: for the
        // native ops, by the op itself.
        if (dtype != kernels::Dtype::kF32) {
          EXPECT_GT(diff, 0.0);
          for (float v : got) ASSERT_EQ(kernels::round_to_dtype(dtype, v), v);
        }
        // On the CPU a native op in bf16/fp16 is the emulation, bit for bit: the fp32 op on the
        // same rounded inputs, its outputs rounded (what the model did before the ops took a
        // dtype).
        if (be->host_accessible() && op.native && dtype != kernels::Dtype::kF32) {
          std::vector<float> emulated(ref.size());
          op.run(*be, kernels::Dtype::kF32, dev_in, emulated.data());
          be->round_to_dtype(int64_t(emulated.size()), dtype, emulated.data(), emulated.data());
          ASSERT_EQ(got, emulated);
        }
      }
    }
  }
}

// fp16's overflow reaches the loss scaler only if a result past 65504 is stored as inf (as
// round_to_f16 and a real fp16 tensor do), not clamped: the convolution (cuDNN's 16-bit output on
// CUDA) and the linear layer (cuBLAS's fp32 output, rounded) on every backend.
TEST(Backend, Fp16ResultsPastTheRangeBecomeInfOnEveryBackend) {
  std::vector<kernels::Backend*> backends = {&kernels::cpu_backend()};
  if (kernels::Backend* cuda = testing::cuda_backend_or_null()) backends.push_back(cuda);
  const kernels::ConvShape conv{2, 16, 4, 4, 8, 3, 1, 1, 1, 1};
  const float inf = std::numeric_limits<float>::infinity();
  for (kernels::Backend* be : backends) {
    SCOPED_TRACE(be->name());
    // Each conv output sums at least 4 taps x 16 channels of 64 * -64: -262144 or less.
    DeviceBuffer x(*be, std::vector<float>(size_t(conv.in().numel()), 64.0f));
    DeviceBuffer w(*be, std::vector<float>(size_t(conv.weight_numel()), -64.0f));
    DeviceBuffer y(*be, std::vector<float>(size_t(conv.out().numel())));
    be->conv2d_forward(conv, x.get(), w.get(), y.get(), kernels::Dtype::kF16);
    for (float v : to_host(*be, y.get(), size_t(conv.out().numel()))) ASSERT_EQ(v, -inf);
    // Linear: 16 inputs of 64 * 64 plus a bias of 0.5: 65536.5, past 65504.
    DeviceBuffer b(*be, std::vector<float>(8, 0.5f));
    DeviceBuffer logits(*be, std::vector<float>(2 * 8));
    be->linear_forward(2, 16, 8, x.get(), /*w: 64 as well*/ x.get(), b.get(), logits.get(),
                       kernels::Dtype::kF16);
    for (float v : to_host(*be, logits.get(), 2 * 8)) ASSERT_EQ(v, inf);
    // bf16 has fp32's range: the same sums stay finite, rounded.
    be->conv2d_forward(conv, x.get(), w.get(), y.get(), kernels::Dtype::kBF16);
    for (float v : to_host(*be, y.get(), size_t(conv.out().numel()))) {
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_LE(v, -262144.0f);
    }
  }
}

// The mixed-precision helpers of every backend give the CPU's results bit for bit: rounding (the
// shared kernels/dtype.h code), the loss-scale multiply and the unscale with its inf/NaN count.
TEST(Backend, PrecisionHelpersAgreeWithTheCpu) {
  kernels::Backend* cuda = testing::cuda_backend_or_null();
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device (or no CUDA plugin) on this machine";
  const size_t n = 100000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::ldexp(std::sin(0.1f * float(i)), int(i % 60) - 30);
  x[7] = std::numeric_limits<float>::infinity();
  x[8] = std::nanf("");
  x[9] = 65520.0f;
  auto on = [&](kernels::Backend& be, kernels::Dtype d, int64_t* bad) {
    auto* p = static_cast<float*>(be.alloc(n * sizeof(float)));
    be.copy_from_host(p, x.data(), n * sizeof(float));
    be.round_to_dtype(int64_t(n), d, p, p);
    be.scale(int64_t(n), 3.0f, p, p);
    *bad = be.unscale_count_non_finite(int64_t(n), 0.25f, p);
    std::vector<float> out(n);
    be.copy_to_host(out.data(), p, n * sizeof(float));
    be.free(p);
    return out;
  };
  for (kernels::Dtype d : {kernels::Dtype::kBF16, kernels::Dtype::kF16}) {
    int64_t bad_cpu = 0, bad_gpu = 0;
    const auto cpu = on(kernels::cpu_backend(), d, &bad_cpu);
    const auto gpu = on(*cuda, d, &bad_gpu);
    EXPECT_EQ(bad_gpu, bad_cpu) << kernels::dtype_name(d);
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(cpu[i])) {
        ASSERT_TRUE(std::isnan(gpu[i])) << i;
      } else {
        ASSERT_EQ(gpu[i], cpu[i]) << kernels::dtype_name(d) << " element " << i << " of " << x[i];
      }
    }
  }
}

}  // namespace
}  // namespace dlaunch
