// dtrain's ResNet and optimizers against PyTorch 1.13 (Debian's python3-torch via
// /usr/bin/python3, see torch_reference.py): the same parameters and batch must give the same
// loss, logits, gradients and running statistics; the same gradients the same optimizer steps.
// Skips when /usr/bin/python3 or torch is missing.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/kernels/grad_check.h"
#include "worker/model/loss.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"

#ifndef DLAUNCH_TORCH_REFERENCE
#error "DLAUNCH_TORCH_REFERENCE (path of torch_reference.py) must be defined"
#endif

namespace dlaunch {
namespace {

using namespace dlaunch::model;
using namespace dlaunch::optim;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dtrain_torch_ref_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

template <typename T>
void write_file(const std::string& path, const T* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

// Runs the reference; returns false (after GTEST_SKIP-worthy reasons) when torch is unavailable.
bool run_reference(const std::string& dir, const std::string& mode, std::string* why) {
  if (access("/usr/bin/python3", X_OK) != 0) {
    *why = "/usr/bin/python3 not found";
    return false;
  }
  const std::string cmd = "/usr/bin/python3 " DLAUNCH_TORCH_REFERENCE " '" + dir + "' " + mode;
  const int status = std::system(cmd.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    *why = "torch is not importable by /usr/bin/python3";
    return false;
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << " failed: " << status;
  return true;
}

void compare_resnet(const ResNetConfig& cfg, int64_t n, int64_t hw, uint32_t image_seed = 5) {
  SCOPED_TRACE("depth " + std::to_string(cfg.depth) + " width " + std::to_string(cfg.width) +
               " in_channels " + std::to_string(cfg.in_channels));
  TempDir dir;
  ResNet net(cfg, 17);
  Tensor images({n, cfg.in_channels, hw, hw});
  const auto v = test::random_vector(static_cast<size_t>(images.numel()), image_seed, -2.f, 2.f);
  std::copy(v.begin(), v.end(), images.data());
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % cfg.num_classes);

  std::ofstream(dir.path() + "/meta.txt") << cfg.depth << " " << cfg.width << " " << cfg.in_channels
                                          << " " << cfg.num_classes << " " << n << " " << hw << " " << hw;
  {
    std::ofstream layout(dir.path() + "/params.txt");
    for (const auto& p : net.param_info()) layout << p.name << " " << p.offset << " " << p.count << "\n";
  }
  write_file(dir.path() + "/params.bin", net.params(), net.num_params());
  write_file(dir.path() + "/images.bin", images.data(), static_cast<size_t>(images.numel()));
  write_file(dir.path() + "/labels.bin", labels.data(), labels.size());

  Tensor grad;
  const Tensor& logits = net.forward(images, true);
  const float loss = softmax_cross_entropy(logits, labels.data(), &grad, nullptr);
  net.backward(grad);

  std::string why;
  if (!run_reference(dir.path(), "resnet", &why)) GTEST_SKIP() << why;
  float ref_loss = 0;
  std::ifstream(dir.path() + "/out_loss.txt") >> ref_loss;
  EXPECT_NEAR(loss, ref_loss, 1e-4 * (1 + std::fabs(ref_loss)));
  const auto ref_logits = read_floats(dir.path() + "/out_logits.bin");
  ASSERT_EQ(ref_logits.size(), static_cast<size_t>(logits.numel()));
  for (size_t i = 0; i < ref_logits.size(); ++i)
    ASSERT_NEAR(logits.data()[i], ref_logits[i], 1e-4 * (1 + std::fabs(ref_logits[i]))) << "logit " << i;
  const auto ref_grads = read_floats(dir.path() + "/out_grads.bin");
  ASSERT_EQ(ref_grads.size(), net.num_params());
  double max_ref = 0;
  for (float g : ref_grads) max_ref = std::max(max_ref, double(std::fabs(g)));
  int bad = 0;
  for (const auto& p : net.param_info())
    for (size_t i = p.offset; i < p.offset + p.count; ++i) {
      if (std::fabs(net.grads()[i] - ref_grads[i]) > 1e-5 * max_ref + 1e-3 * std::fabs(ref_grads[i])) {
        if (++bad <= 5)
          ADD_FAILURE() << p.name << "[" << i - p.offset << "] ours " << net.grads()[i] << " torch "
                        << ref_grads[i];
      }
    }
  EXPECT_EQ(bad, 0) << "gradients differing from PyTorch";
  const auto ref_buffers = read_floats(dir.path() + "/out_buffers.bin");
  size_t k = 0;
  for (Tensor* t : net.buffers())
    for (int64_t i = 0; i < t->numel(); ++i, ++k) {
      ASSERT_LT(k, ref_buffers.size());
      ASSERT_NEAR(t->data()[i], ref_buffers[k], 1e-4 * (1 + std::fabs(ref_buffers[k]))) << "buffer value " << k;
    }
  EXPECT_EQ(k, ref_buffers.size());
}

// Width 4: NCHW everywhere (cblock 1); width 8: nChw8c; width 16: nChw16c (on AVX-512).
TEST(TorchReference, ResNet18PlainNchw) { compare_resnet(ResNetConfig{18, 4, 3, 5, 16}, 4, 16); }
// Image seed 5 put one pre-ReLU value of layer1.0 at 1.2e-7 from the kink: which side it fell on
// depended on float rounding (it flipped when the BN sums became double), so the gradients
// disagreed with PyTorch's by one ReLU unit. Seed 6 has no such knife-edge.
TEST(TorchReference, ResNet18Blocked) { compare_resnet(ResNetConfig{18, 16, 3, 10, 16}, 6, 16, 6); }
TEST(TorchReference, ResNet18Mnist) { compare_resnet(ResNetConfig{18, 8, 1, 10, 28}, 3, 28); }
TEST(TorchReference, ResNet34) { compare_resnet(ResNetConfig{34, 8, 3, 10, 16}, 4, 16); }

void compare_optim(const std::string& kind, bool nesterov, double wd) {
  SCOPED_TRACE(kind + " nesterov " + std::to_string(nesterov));
  TempDir dir;
  const size_t n = 64, steps = 5;
  const float lr = kind == "sgd" ? 0.1f : 0.01f;
  auto p = test::random_vector(n, 1);
  const auto g = test::random_vector(n * steps, 2);
  std::ofstream(dir.path() + "/optim.txt") << kind << " " << lr << " 0.9 " << (nesterov ? 1 : 0)
                                           << " " << wd << " " << steps << " " << n;
  write_file(dir.path() + "/p0.bin", p.data(), n);
  write_file(dir.path() + "/g.bin", g.data(), g.size());
  OptimConfig cfg;
  cfg.kind = parse_optim_kind(kind);
  cfg.momentum = 0.9;
  cfg.nesterov = nesterov;
  cfg.weight_decay = wd;
  Optimizer opt(cfg);
  for (size_t s = 0; s < steps; ++s) opt.step(p.data(), g.data() + s * n, n, lr, {});
  std::string why;
  if (!run_reference(dir.path(), "optim", &why)) GTEST_SKIP() << why;
  const auto ref = read_floats(dir.path() + "/out_p.bin");
  ASSERT_EQ(ref.size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], ref[i], 2e-6) << i;
}

TEST(TorchReference, Sgd) { compare_optim("sgd", false, 0.0); }
TEST(TorchReference, SgdNesterovWeightDecay) { compare_optim("sgd", true, 5e-4); }
TEST(TorchReference, AdamWeightDecay) { compare_optim("adam", false, 1e-2); }

}  // namespace
}  // namespace dlaunch
