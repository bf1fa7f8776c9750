// The ResNet as a whole: parameter layout and init, end-to-end gradients by finite differences,
// the grad-ready callback contract, SyncBN across two ranks run as threads, eval mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kernels/ops.h"
#include "tests/kernels/grad_check.h"
#include "worker/model/batch_norm.h"
#include "worker/model/loss.h"
#include "worker/model/resnet.h"

namespace dlaunch {
namespace {

using namespace dlaunch::model;

using test::random_vector;

Tensor random_images(int64_t n, int64_t c, int64_t hw, uint32_t seed) {
  Tensor t({n, c, hw, hw});
  const auto v = random_vector(static_cast<size_t>(t.numel()), seed, -2.f, 2.f);
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

std::vector<int32_t> labels_for(int64_t n, int classes) {
  std::vector<int32_t> l(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) l[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % classes);
  return l;
}

TEST(ResNet, ParameterLayoutMatchesTorchvisionCifarResNet18) {
  ResNet net(ResNetConfig{}, 1);
  // torchvision resnet18(num_classes=10) has 11,181,642 parameters; the CIFAR stem's 3x3 conv
  // (64*3*3*3 = 1,728) replaces the 7x7 one (9,408).
  EXPECT_EQ(net.num_params(), 11181642u - 9408u + 1728u);
  const auto& info = net.param_info();
  ASSERT_FALSE(info.empty());
  EXPECT_EQ(info.front().name, "fc.bias");
  EXPECT_EQ(info.front().offset, 0u);
  EXPECT_EQ(info.back().name, "conv1.weight");
  EXPECT_EQ(info.back().offset + info.back().count, net.num_params());
  size_t next = 0;
  std::map<std::string, size_t> counts;
  for (const auto& p : info) {
    EXPECT_EQ(p.offset, next) << p.name;
    next += p.count;
    counts[p.name] = p.count;
    // torchvision's names tell the batch norms: bn1, layerN.M.bnK, layerN.0.downsample.1.
    const bool bn_name = p.name.rfind("bn", 0) == 0 || p.name.find(".bn") != std::string::npos ||
                         p.name.find("downsample.1.") != std::string::npos;
    EXPECT_EQ(p.batch_norm, bn_name) << p.name;
    EXPECT_EQ(p.no_weight_decay, bn_name || p.name == "fc.bias") << p.name;
  }
  EXPECT_EQ(counts["layer2.0.downsample.0.weight"], 128u * 64u);
  EXPECT_EQ(counts["layer4.1.conv2.weight"], 512u * 512u * 9u);
  EXPECT_EQ(counts.count("layer1.0.downsample.0.weight"), 0u);
  EXPECT_EQ(net.buffers().size(), net.buffer_names().size());
  EXPECT_EQ(net.buffer_names().front(), "bn1.running_mean");

  // The ImageNet stem: exactly torchvision's resnet18(num_classes=10), the same names.
  ResNetConfig imagenet;
  imagenet.stem = ResNetStem::kImageNet;
  ResNet tv(imagenet, 1);
  EXPECT_EQ(tv.num_params(), 11181642u);
  EXPECT_EQ(tv.param_info().back().name, "conv1.weight");
  EXPECT_EQ(tv.param_info().back().count, 64u * 3u * 7u * 7u);
  EXPECT_EQ(tv.buffer_names(), net.buffer_names());

  ResNet deep(ResNetConfig{34, 8, 3, 10, 32}, 1);
  size_t blocks = 0;
  for (const auto& p : deep.param_info())
    if (p.name.find(".conv1.weight") != std::string::npos) ++blocks;
  EXPECT_EQ(blocks, 3u + 4u + 6u + 3u);
}

TEST(ResNet, InitIsDeterministicAndKaimingScaled) {
  ResNetConfig cfg{18, 16, 3, 10, 32};
  ResNet a(cfg, 42), b(cfg, 42), c(cfg, 43);
  EXPECT_TRUE(std::equal(a.params(), a.params() + a.num_params(), b.params()));
  EXPECT_FALSE(std::equal(a.params(), a.params() + a.num_params(), c.params()));
  for (const auto& p : a.param_info()) {
    const float* v = a.params() + p.offset;
    if (p.name == "layer3.0.conv2.weight") {  // fan_out = 64 * 9
      double sq = 0;
      for (size_t i = 0; i < p.count; ++i) sq += double(v[i]) * v[i];
      EXPECT_NEAR(std::sqrt(sq / p.count), std::sqrt(2.0 / (64 * 9)), 0.005);
    }
    if (p.name == "layer1.1.bn2.weight") {
      EXPECT_EQ(*std::min_element(v, v + p.count), 1.0f);
    }
    if (p.name == "layer1.1.bn2.bias") {
      EXPECT_EQ(*std::max_element(v, v + p.count), 0.0f);
    }
    if (p.name == "fc.weight") {
      EXPECT_LE(*std::max_element(v, v + p.count), 1.0 / std::sqrt(128.0));
    }
  }
  EXPECT_THROW(ResNet(ResNetConfig{50, 16, 3, 10, 32}, 1), UsageError);
}

// Mean cross-entropy of a training forward, computed in double from the float logits so the
// finite differences are not limited by the float rounding of the loss itself.
double train_loss(ResNet& net, const Tensor& images, const std::vector<int32_t>& labels) {
  const Tensor& logits = net.forward(images, true);
  const int64_t n = logits.dim(0), k = logits.dim(1);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * k;
    double mx = row[0], z = 0;
    for (int64_t j = 1; j < k; ++j) mx = std::max(mx, double(row[j]));
    for (int64_t j = 0; j < k; ++j) z += std::exp(row[j] - mx);
    total += mx + std::log(z) - row[labels[static_cast<size_t>(i)]];
  }
  return total / n;
}

TEST(ResNet, EndToEndGradientMatchesFiniteDifferences) {
  // Width 4 runs NCHW everywhere, width 16 the nChw16c (AVX-512) or nChw8c path; one input
  // channel (MNIST) changes only the stem. The ImageNet stem (7x7 stride 2 + max-pool) on 32x32
  // images leaves layer1 8x8, like the CIFAR stem's 16x16 inputs at layer2.
  struct Case {
    int width, in_channels;
    ResNetStem stem;
    int64_t image_size;
  };
  for (const Case& cs : {Case{4, 3, ResNetStem::kCifar, 16}, Case{4, 1, ResNetStem::kCifar, 16},
                         Case{16, 3, ResNetStem::kCifar, 16}, Case{4, 3, ResNetStem::kImageNet, 32},
                         Case{16, 3, ResNetStem::kImageNet, 32}}) {
    const int in_channels = cs.in_channels;
    SCOPED_TRACE("width " + std::to_string(cs.width) + " in_channels " +
                 std::to_string(in_channels) +
                 (cs.stem == ResNetStem::kImageNet ? " imagenet stem" : " cifar stem"));
    ResNetConfig cfg{18, cs.width, in_channels, 5, static_cast<int>(cs.image_size),
                     kernels::Dtype::kF32, cs.stem};
    ResNet net(cfg, 7);
    const int64_t batch = 8;
    const Tensor images = random_images(batch, in_channels, cs.image_size, 8);
    const auto labels = labels_for(batch, 5);
    Tensor grad;
    net.forward(images, true);
    softmax_cross_entropy(net.forward(images, true), labels.data(), &grad, nullptr);
    net.backward(grad);
    std::vector<float> analytic(net.grads(), net.grads() + net.num_params());

    // Per parameter tensor, directional derivatives by central differences: along the tensor's
    // own gradient (must equal its norm) and along a random unit direction (must equal the dot
    // product). Single coordinates are useless here: float rounding through 20 layers and the
    // ReLU kinks swamp a one-coordinate difference, while a whole-tensor direction has a signal
    // of the size of the gradient norm. A wrong backward for any layer shows up in its tensor.
    std::mt19937 rng(3);
    int checked = 0, failures = 0;
    double total_error = 0;
    for (const auto& p : net.param_info()) {
      if (in_channels == 1 && p.name.rfind("conv1.", 0) != 0 && p.name.rfind("bn1.", 0) != 0) continue;
      const float* g = analytic.data() + p.offset;
      double norm = 0;
      for (size_t i = 0; i < p.count; ++i) norm += double(g[i]) * g[i];
      norm = std::sqrt(norm);
      if (norm < 1e-6) continue;
      std::vector<double> random(p.count);
      std::normal_distribution<double> normal;
      double rnorm = 0, gdotr = 0;
      for (auto& v : random) {
        v = normal(rng);
        rnorm += v * v;
      }
      rnorm = std::sqrt(rnorm);
      for (size_t i = 0; i < p.count; ++i) gdotr += g[i] * (random[i] /= rnorm);
      const std::vector<float> orig(net.params() + p.offset, net.params() + p.offset + p.count);
      auto directional = [&](auto dir) {
        const double eps = 3e-4;  // length of the step in parameter space
        float* w = net.params() + p.offset;
        for (size_t i = 0; i < p.count; ++i) w[i] = static_cast<float>(orig[i] + eps * dir(i));
        const double up = train_loss(net, images, labels);
        for (size_t i = 0; i < p.count; ++i) w[i] = static_cast<float>(orig[i] - eps * dir(i));
        const double down = train_loss(net, images, labels);
        std::copy(orig.begin(), orig.end(), w);
        return (up - down) / (2 * eps);
      };
      const double along = directional([&](size_t i) { return g[i] / norm; });
      const double across = directional([&](size_t i) { return random[i]; });
      checked += 2;
      // Even exact gradients differ from finite differences by a few percent on some tensors
      // of such a tiny net (ReLU kinks, batch statistics of 8 images); the mean error stays
      // well under 1%. A wrong backward is off by far more, in its tensor and every earlier one.
      total_error += std::fabs(along - norm) / norm + std::fabs(across - gdotr) / norm;
      if (std::fabs(along - norm) > 0.1 * norm + 1e-4) {
        ++failures;
        ADD_FAILURE() << p.name << ": gradient norm " << norm << ", finite difference along it " << along;
      }
      if (std::fabs(across - gdotr) > 0.1 * norm + 1e-4) {
        ++failures;
        ADD_FAILURE() << p.name << ": g.r " << gdotr << ", finite difference along r " << across
                      << " (|g| " << norm << ")";
      }
    }
    EXPECT_LT(total_error / checked, 0.01) << "mean relative error of the directional derivatives";
    EXPECT_EQ(failures, 0) << failures << " of " << checked;
  }
}

TEST(ResNet, GradReadyCallbackCoversBufferInOrderWithFinalValues) {
  ResNet net(ResNetConfig{18, 8, 3, 10, 16}, 5);
  const Tensor images = random_images(4, 3, 16, 11);
  const auto labels = labels_for(4, 10);
  Tensor grad;
  softmax_cross_entropy(net.forward(images, true), labels.data(), &grad, nullptr);
  std::vector<float> seen(net.num_params(), std::nanf(""));
  size_t next = 0;
  net.set_grad_ready_callback([&](size_t offset, size_t count) {
    EXPECT_EQ(offset, next);
    next = offset + count;
    std::copy(net.grads() + offset, net.grads() + offset + count, seen.begin() + offset);
  });
  net.backward(grad);
  EXPECT_EQ(next, net.num_params());
  EXPECT_TRUE(std::equal(seen.begin(), seen.end(), net.grads()));
}

// Sums buffers across `ranks` threads: each call blocks until every rank contributed.
class ThreadSync : public BatchNormSync {
 public:
  explicit ThreadSync(int ranks) : ranks_(ranks) {}
  class Rank : public BatchNormSync {
   public:
    explicit Rank(ThreadSync* group) : group_(group) {}
    void allreduce_sum(double* data, size_t count) override { group_->reduce(data, count); }

   private:
    ThreadSync* group_;
  };
  void allreduce_sum(double*, size_t) override { FAIL() << "use a Rank"; }
  int calls() const { return calls_; }

 private:
  void reduce(double* data, size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (arrived_ == 0) sum_.assign(count, 0.0);
    ASSERT_EQ(sum_.size(), count);
    for (size_t i = 0; i < count; ++i) sum_[i] += data[i];
    if (++arrived_ == ranks_) {
      result_.assign(sum_.begin(), sum_.end());
      arrived_ = 0;
      ++generation_;
      ++calls_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
    std::copy(result_.begin(), result_.end(), data);
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int ranks_;
  int arrived_ = 0;
  int calls_ = 0;
  uint64_t generation_ = 0;
  std::vector<double> sum_;
  std::vector<double> result_;
};

Tensor slice(const Tensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row = t.numel() / shape[0];
  shape[0] = end - begin;
  Tensor out(shape);
  std::copy(t.data() + begin * row, t.data() + end * row, out.data());
  return out;
}

TEST(SyncBatchNorm, TwoRanksEqualOneRankOnTheConcatenatedBatch) {
  const ResNetConfig cfg{18, 8, 3, 10, 16};
  const Tensor images = random_images(8, 3, 16, 21);
  const auto labels = labels_for(8, 10);

  ResNet full(cfg, 9);
  Tensor grad;
  const float full_loss = softmax_cross_entropy(full.forward(images, true), labels.data(), &grad, nullptr);
  const Tensor full_logits = full.forward(images, true);  // second step: running stats move twice
  softmax_cross_entropy(full_logits, labels.data(), &grad, nullptr);
  full.backward(grad);

  ThreadSync group(2);
  std::vector<std::unique_ptr<ResNet>> nets;
  std::vector<Tensor> logits(2);
  std::vector<float> losses(2);
  for (int r = 0; r < 2; ++r) nets.push_back(std::make_unique<ResNet>(cfg, 9));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      kernels::cpu::set_num_threads(1);
      ThreadSync::Rank sync(&group);
      ResNet& net = *nets[static_cast<size_t>(r)];
      net.set_batchnorm_sync(&sync);
      const Tensor local = slice(images, 4 * r, 4 * r + 4);
      const int32_t* local_labels = labels.data() + 4 * r;
      Tensor g;
      losses[static_cast<size_t>(r)] = softmax_cross_entropy(net.forward(local, true), local_labels, &g, nullptr);
      logits[static_cast<size_t>(r)] = net.forward(local, true);
      softmax_cross_entropy(logits[static_cast<size_t>(r)], local_labels, &g, nullptr);
      net.backward(g);
      net.set_batchnorm_sync(nullptr);
    });
  }
  for (auto& t : threads) t.join();

  EXPECT_NEAR((losses[0] + losses[1]) / 2, full_loss, 1e-5);
  for (int r = 0; r < 2; ++r)
    for (int64_t i = 0; i < logits[0].numel(); ++i)
      ASSERT_NEAR(logits[static_cast<size_t>(r)].data()[i], full_logits.data()[4 * 10 * r + i], 1e-4);
  // DDP averages the ranks' gradients; that must be the full batch's gradient.
  for (size_t i = 0; i < full.num_params(); ++i) {
    const float avg = (nets[0]->grads()[i] + nets[1]->grads()[i]) / 2;
    ASSERT_NEAR(avg, full.grads()[i], 1e-4 + 1e-3 * std::fabs(full.grads()[i])) << "at " << i;
  }
  const auto fb = full.buffers(), b0 = nets[0]->buffers(), b1 = nets[1]->buffers();
  for (size_t k = 0; k < fb.size(); ++k)
    for (int64_t i = 0; i < fb[k]->numel(); ++i) {
      ASSERT_NEAR(b0[k]->data()[i], fb[k]->data()[i], 1e-4) << "buffer " << k;
      ASSERT_EQ(b0[k]->data()[i], b1[k]->data()[i]);
    }
  // 20 BN layers, 2 forwards (one call each) and 1 backward (one call each).
  EXPECT_EQ(group.calls(), 20 * 3);
}

// A large mean against a tiny spread (mean 1000, std 0.01): the variance is E[x^2] - E[x]^2, the
// difference of two sums near 1.3e5 and 1.3e8. Summed as floats across ranks, those sums carry
// rounding errors (ulp 8 at 1.3e8) far larger than the variance (1e-4), and the normalised output
// is off by a factor of several; summed as doubles the two ranks match one rank on the whole batch.
TEST(SyncBatchNorm, LargeMeanSmallVarianceMatchesTheConcatenatedBatch) {
  const int64_t c = 16, per_rank = 2, hw = 8;
  const kernels::ActShape full_shape{2 * per_rank, c, hw, hw, 1};
  const kernels::ActShape half_shape{per_rank, c, hw, hw, 1};
  std::vector<float> x = random_vector(static_cast<size_t>(full_shape.numel()), 41, -0.017f, 0.017f);
  for (int64_t n = 0; n < full_shape.n; ++n)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw * hw; ++i) x[static_cast<size_t>((n * c + ch) * hw * hw + i)] += 1000.0f + ch;
  std::vector<float> gamma(c), beta(c), dgamma(c), dbeta(c);
  for (int64_t i = 0; i < c; ++i) {
    gamma[static_cast<size_t>(i)] = 1.0f + 0.1f * static_cast<float>(i);
    beta[static_cast<size_t>(i)] = 0.05f * static_cast<float>(i);
  }

  BatchNorm2d full(c);
  full.bind(gamma.data(), beta.data(), dgamma.data(), dbeta.data());
  std::vector<float> y_full(x.size());
  full.forward(full_shape, x.data(), nullptr, false, true, nullptr, y_full.data());

  ThreadSync group(2);
  std::vector<std::unique_ptr<BatchNorm2d>> layers;
  std::vector<std::vector<float>> dg(2, std::vector<float>(c)), db(2, std::vector<float>(c));
  std::vector<float> y_sync(x.size());
  const size_t half = x.size() / 2;
  for (int r = 0; r < 2; ++r) {
    layers.push_back(std::make_unique<BatchNorm2d>(c));
    layers.back()->bind(gamma.data(), beta.data(), dg[static_cast<size_t>(r)].data(),
                        db[static_cast<size_t>(r)].data());
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ThreadSync::Rank sync(&group);
      layers[static_cast<size_t>(r)]->forward(half_shape, x.data() + r * half, nullptr, false, true,
                                              &sync, y_sync.data() + r * half);
    });
  }
  for (auto& t : threads) t.join();

  // The output is O(1) (normalised); a lost variance shows as errors of order 1.
  double max_y = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_y = std::max(max_y, static_cast<double>(std::fabs(y_full[i])));
    ASSERT_NEAR(y_sync[i], y_full[i], 0.05) << "at " << i;
  }
  EXPECT_GT(max_y, 0.5) << "the test input must normalise to values of order 1";
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < c; ++i) {
      EXPECT_FLOAT_EQ(layers[static_cast<size_t>(r)]->running_mean().data()[i], full.running_mean().data()[i]);
      // running_var = 0.9 + 0.1 * unbiased batch variance (about 1e-4): compare the batch part.
      const double batch_var_sync = (layers[static_cast<size_t>(r)]->running_var().data()[i] - 0.9) / 0.1;
      const double batch_var_full = (full.running_var().data()[i] - 0.9) / 0.1;
      EXPECT_NEAR(batch_var_sync, batch_var_full, 2e-5) << "channel " << i;
      EXPECT_GT(batch_var_full, 5e-5) << "channel " << i;
    }
  }
}

TEST(ResNet, EvalUsesRunningStatisticsAndWorksForOneImage) {
  ResNet net(ResNetConfig{18, 8, 3, 10, 16}, 13);
  const Tensor images = random_images(6, 3, 16, 31);
  for (int i = 0; i < 3; ++i) net.forward(images, true);
  const Tensor eval_all = net.forward(images, false);
  const Tensor one = slice(images, 2, 3);
  const Tensor eval_one = net.forward(one, false);
  for (int64_t j = 0; j < 10; ++j) EXPECT_NEAR(eval_one.data()[j], eval_all.data()[20 + j], 1e-4);
  const Tensor train = net.forward(images, true);
  double diff = 0;
  for (int64_t i = 0; i < train.numel(); ++i) diff += std::fabs(train.data()[i] - eval_all.data()[i]);
  EXPECT_GT(diff, 1e-3);
  // backward after an eval forward is a bug of the caller.
  net.forward(images, false);
  Tensor g({6, 10});
  EXPECT_THROW(net.backward(g), InternalError);
}

}  // namespace
}  // namespace dlaunch

namespace dlaunch {
namespace {

using namespace dlaunch::model;

TEST(Tensor, AlignedZeroedResizeKeepsCapacityCopyAndMove) {
  Tensor t({2, 3, 5});
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(t.shape_string(), "[2, 3, 5]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data()[i], 0.f);
  t.fill(2.f);
  const float* before = t.data();
  t.resize({3, 10});  // same size: same allocation, contents kept
  EXPECT_EQ(t.data(), before);
  EXPECT_EQ(t.data()[29], 2.f);
  Tensor copy = t;
  EXPECT_NE(copy.data(), t.data());
  EXPECT_EQ(copy.data()[7], 2.f);
  Tensor moved = std::move(copy);
  EXPECT_EQ(moved.numel(), 30);
  EXPECT_EQ(copy.numel(), 0);  // NOLINT(bugprone-use-after-move): documented moved-from state
  t.resize({100});  // larger: new zeroed allocation
  EXPECT_EQ(t.data()[99], 0.f);
  EXPECT_THROW(t.dim(3), InternalError);
  // Memory comes from the tensor's backend (the CPU by default); host copies round-trip.
  EXPECT_EQ(&t.backend(), &kernels::cpu_backend());
  t.fill(3.f);
  const std::vector<float> host = t.to_host();
  ASSERT_EQ(host.size(), 100u);
  EXPECT_EQ(host[42], 3.f);
  Tensor other({5});
  other.copy_from(t);
  EXPECT_EQ(other.shape(), t.shape());
  EXPECT_EQ(other.data()[99], 3.f);
}

}  // namespace
}  // namespace dlaunch
