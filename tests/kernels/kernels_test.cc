// Every CPU op: forward against a naive double-precision reference where one is short to write,
// gradients by central finite differences (grad_check.h), in every activation layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/conv_choice_cache.h"
#include "kernels/ops.h"
#include "tests/kernels/grad_check.h"

namespace dlaunch {
namespace {

namespace cpu = kernels::cpu;
using kernels::ActShape;
using kernels::cpu::ConvChoiceCache;
using kernels::ConvShape;
using test::dot;
using test::expect_gradient;
using test::random_vector;

// Index of (n, c, h, w) in a layout.
int64_t at(const ActShape& s, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t b = s.cblock;
  return (((n * (s.c / b) + c / b) * s.h + h) * s.w + w) * b + c % b;
}

// The convolutions' choice cache goes to a file of this test process (set before any test runs,
// since the cache is opened once per process), not to the user's ~/.cache; removed at the end.
std::string test_file(const std::string& tag) {
  return "/tmp/dlaunch_kernels_test_" + std::to_string(::getpid()) + "_" + tag;
}
class ChoiceCacheFile : public ::testing::Environment {
 public:
  ChoiceCacheFile() { ::setenv("DLAUNCH_CONV_CACHE", path().c_str(), 1); }
  static std::string path() { return test_file("conv_choices.txt"); }
  void TearDown() override {
    std::remove(path().c_str());
    std::remove((path() + ".lock").c_str());
  }
};
::testing::Environment* const kChoiceCacheFile = ::testing::AddGlobalTestEnvironment(new ChoiceCacheFile);

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- layout ----------------------------------------------------------------------------------

TEST(Reorder, RoundTripsAndPlacesElements) {
  const ActShape s{2, 32, 3, 5, 1};
  const auto x = random_vector(s.numel(), 1);
  for (int b : {8, 16}) {
    std::vector<float> blocked(x.size()), back(x.size());
    cpu::reorder(s, x.data(), b, blocked.data());
    ActShape bs = s;
    bs.cblock = b;
    EXPECT_EQ(blocked[at(bs, 1, 19, 2, 4)], x[at(s, 1, 19, 2, 4)]);
    cpu::reorder(bs, blocked.data(), 1, back.data());
    EXPECT_EQ(back, x);
  }
}

// ---- convolution -----------------------------------------------------------------------------

struct ConvCase {
  int64_t c_in, c_out, kernel, stride;
  int in_block, out_block;
};

std::vector<ConvCase> conv_cases() {
  return {{3, 16, 3, 1, 1, 16},  {8, 16, 3, 2, 8, 16}, {16, 16, 3, 1, 16, 16},
          {16, 32, 1, 2, 16, 16}, {4, 8, 3, 1, 1, 8},   {4, 4, 3, 2, 1, 1}};
}

// Every implementation variant (see kernels/cpu/conv2d.cc) is tested: the variant is chosen
// when a shape is first used, from DLAUNCH_CONV_ALGO, so each variant gets its own batch size.
const char* const kConvAlgos[] = {"direct", "auto", "twin", "autotune"};

ConvShape make_conv(const ConvCase& c, int algo) {
  setenv("DLAUNCH_CONV_ALGO", kConvAlgos[algo], 1);
  return ConvShape{2 + algo, c.c_in, 7, 6, c.c_out, c.kernel, c.stride, c.kernel / 2, c.in_block, c.out_block};
}

// Naive direct convolution in double, layout-aware.
std::vector<double> naive_conv(const ConvShape& s, const std::vector<float>& x,
                               const std::vector<float>& w) {
  const ActShape in = s.in(), out = s.out();
  std::vector<double> y(out.numel(), 0.0);
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t o = 0; o < s.c_out; ++o)
      for (int64_t oh = 0; oh < out.h; ++oh)
        for (int64_t ow = 0; ow < out.w; ++ow) {
          double acc = 0;
          for (int64_t i = 0; i < s.c_in; ++i)
            for (int64_t kh = 0; kh < s.kernel; ++kh)
              for (int64_t kw = 0; kw < s.kernel; ++kw) {
                const int64_t ih = oh * s.stride - s.pad + kh, iw = ow * s.stride - s.pad + kw;
                if (ih < 0 || iw < 0 || ih >= s.h_in || iw >= s.w_in) continue;
                acc += static_cast<double>(x[at(in, n, i, ih, iw)]) *
                       w[((o * s.c_in + i) * s.kernel + kh) * s.kernel + kw];
              }
          y[at(out, n, o, oh, ow)] = acc;
        }
  return y;
}

TEST(Conv2d, ForwardMatchesNaiveInEveryLayout) {
  for (int algo = 0; algo < 4; ++algo)
  for (const auto& c : conv_cases()) {
    SCOPED_TRACE(kConvAlgos[algo]);
    const ConvShape s = make_conv(c, algo);
    const auto x = random_vector(s.in().numel(), 2), w = random_vector(s.weight_numel(), 3);
    std::vector<float> y(s.out().numel());
    cpu::conv2d_forward(s, x.data(), w.data(), y.data());
    const auto ref = naive_conv(s, x, w);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::fabs(ref[i])))
          << "c_in " << c.c_in << " c_out " << c.c_out << " k " << c.kernel << " at " << i;
  }
}

TEST(Conv2d, BackwardDataMatchesFiniteDifferences) {
  for (int algo = 0; algo < 4; ++algo)
  for (const auto& c : conv_cases()) {
    SCOPED_TRACE(kConvAlgos[algo]);
    const ConvShape s = make_conv(c, algo);
    auto x = random_vector(s.in().numel(), 4);
    const auto w = random_vector(s.weight_numel(), 5), r = random_vector(s.out().numel(), 6);
    std::vector<float> dx(x.size()), y(r.size());
    cpu::conv2d_backward_data(s, r.data(), w.data(), dx.data());
    expect_gradient("conv dx", x, dx, [&] {
      cpu::conv2d_forward(s, x.data(), w.data(), y.data());
      return dot(r, y);
    }, 0.05, 1e-3, 1e-3);
  }
}

TEST(Conv2d, BackwardDataAccumulateAddsToOutput) {
  for (int algo = 0; algo < 4; ++algo)
    for (const auto& c : conv_cases()) {
      SCOPED_TRACE(kConvAlgos[algo]);
      ConvShape s = make_conv(c, algo);
      s.n += 10;  // shapes of their own: the variant is chosen per (shape, pass)
      const auto w = random_vector(s.weight_numel(), 15), dy = random_vector(s.out().numel(), 16);
      const auto base = random_vector(s.in().numel(), 17);
      std::vector<float> plain(base.size()), acc = base;
      cpu::conv2d_backward_data(s, dy.data(), w.data(), plain.data());
      cpu::conv2d_backward_data(s, dy.data(), w.data(), acc.data(), /*accumulate=*/true);
      for (size_t i = 0; i < acc.size(); ++i)
        ASSERT_NEAR(acc[i], base[i] + plain[i], 1e-4 * (1 + std::fabs(plain[i]))) << i;
    }
}

// A shape is tuned once: another batch size of the same shape reuses the choice (the last batch
// of an epoch, evaluation), the choice lands in the cache file, and the results stay correct.
TEST(Conv2d, AutotuneChoiceIsReusedForOtherBatchSizesAndRecorded) {
  setenv("DLAUNCH_CONV_ALGO", "autotune", 1);
  const auto before = cpu::conv_autotune_stats();
  EXPECT_EQ(before.cache_path, ChoiceCacheFile::path());
  int64_t tuned = before.tuned, reused = before.reused;
  for (int64_t n : {3, 7, 1}) {
    const ConvShape s{n, 24, 9, 9, 24, 3, 1, 1, 8, 8};
    const auto x = random_vector(s.in().numel(), 40), w = random_vector(s.weight_numel(), 41);
    std::vector<float> y(s.out().numel());
    cpu::conv2d_forward(s, x.data(), w.data(), y.data());
    const auto ref = naive_conv(s, x, w);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
    const auto now = cpu::conv_autotune_stats();
    EXPECT_EQ(now.tuned, tuned + (n == 3 ? 1 : 0)) << "n=" << n;
    EXPECT_EQ(now.reused, reused + (n == 3 ? 0 : 1)) << "n=" << n;
    tuned = now.tuned;
    reused = now.reused;
  }
  const std::string file = slurp(ChoiceCacheFile::path());
  EXPECT_NE(file.find("/forward/24x9x9-24-k3s1p1-b8x8 "), std::string::npos) << file;
  EXPECT_NO_THROW(ConvChoiceCache::parse(file));
}

TEST(ConvChoiceCache, FormatRoundTripsAndRejectsDamage) {
  const std::map<std::string, std::string> entries = {{"ctx/forward/16x8x8-16-k3s1p1-b8x8", "twin"},
                                                      {"ctx/backward_data/3x32x32-16-k3s1p1-b1x16", "auto"}};
  const std::string text = ConvChoiceCache::serialize(entries);
  EXPECT_EQ(ConvChoiceCache::parse(text), entries);
  EXPECT_TRUE(ConvChoiceCache::parse(ConvChoiceCache::serialize({})).empty());
  // Every truncation and every changed byte is refused.
  for (size_t cut = 0; cut < text.size(); ++cut)
    EXPECT_THROW(ConvChoiceCache::parse(text.substr(0, cut)), std::runtime_error) << "cut at " << cut;
  for (size_t i = 0; i < text.size(); ++i) {
    std::string bad = text;
    bad[i] = bad[i] == 'x' ? 'y' : 'x';
    EXPECT_THROW(ConvChoiceCache::parse(bad), std::runtime_error) << "byte " << i;
  }
  EXPECT_THROW(ConvChoiceCache::parse("dlaunch-conv-choices 2\nend 0 0\n"), std::runtime_error);
}

TEST(ConvChoiceCache, FileIsSharedAndACorruptOneIsIgnoredWithAWarning) {
  const std::string path = test_file("dir/choices.txt");  // the directory is created on write
  {
    ConvChoiceCache a(path), b(path);
    EXPECT_FALSE(a.lookup("k1").has_value());
    a.record("k1", "twin");
    // b read the (absent) file before; a miss makes it look again, as a second rank on the host.
    ASSERT_TRUE(b.lookup("k1").has_value());
    EXPECT_EQ(*b.lookup("k1"), "twin");
    b.record("k2", "auto");  // merges: a's entry survives b's write
    const auto both = ConvChoiceCache::parse(slurp(path));
    EXPECT_EQ(both.size(), 2u);
  }
  {
    std::ofstream(path, std::ios::trunc) << "dlaunch-conv-choices 1\nk1 twin\n";  // no end line
    ConvChoiceCache c(path);
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(c.lookup("k1").has_value());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("ignoring the convolution choice cache " + path), std::string::npos) << err;
    EXPECT_NE(err.find("no 'end' line"), std::string::npos) << err;
    c.record("k3", "direct");  // rewritten whole and valid
    EXPECT_EQ(ConvChoiceCache::parse(slurp(path)).size(), 1u);
  }
  ConvChoiceCache memory_only("");
  memory_only.record("k", "auto");
  EXPECT_EQ(*memory_only.lookup("k"), "auto");
  std::remove(path.c_str());
  std::remove((path + ".lock").c_str());
  ::rmdir(test_file("dir").c_str());
}

TEST(Conv2d, BackwardWeightsMatchesFiniteDifferences) {
  for (int algo = 0; algo < 4; ++algo)
  for (const auto& c : conv_cases()) {
    SCOPED_TRACE(kConvAlgos[algo]);
    const ConvShape s = make_conv(c, algo);
    const auto x = random_vector(s.in().numel(), 7), r = random_vector(s.out().numel(), 8);
    auto w = random_vector(s.weight_numel(), 9);
    std::vector<float> dw(w.size()), y(r.size());
    cpu::conv2d_backward_weights(s, x.data(), r.data(), dw.data());
    expect_gradient("conv dw", w, dw, [&] {
      cpu::conv2d_forward(s, x.data(), w.data(), y.data());
      return dot(r, y);
    }, 0.05, 1e-3, 1e-3);
  }
}

// ---- batch norm ------------------------------------------------------------------------------

// The whole training forward (sums -> scale/shift -> apply) as one function.
struct BnRun {
  ActShape s;
  std::vector<float> gamma, beta, mean, invstd, scale, shift, rm, rv;
  std::vector<double> sum, sumsq;
  double count = 0;
  explicit BnRun(ActShape shape)
      : s(shape),
        gamma(random_vector(s.c, 11, 0.5f, 1.5f)),
        beta(random_vector(s.c, 12)),
        mean(s.c), invstd(s.c), scale(s.c), shift(s.c), rm(s.c, 0.f), rv(s.c, 1.f),
        sum(s.c), sumsq(s.c) {}
  void forward(const float* x, const float* residual, bool relu, float* y, bool update = false) {
    cpu::batch_norm_sums(s, x, sum.data(), sumsq.data(), &count);
    cpu::batch_norm_scale_shift(s.c, sum.data(), sumsq.data(), &count, gamma.data(),
                                beta.data(), 1e-5f, 0.1f, mean.data(), invstd.data(),
                                scale.data(), shift.data(), update ? rm.data() : nullptr,
                                update ? rv.data() : nullptr);
    cpu::batch_norm_apply(s, x, scale.data(), shift.data(), residual, relu, y);
  }
};

std::vector<ActShape> bn_shapes() {
  return {{3, 5, 4, 3, 1}, {2, 16, 3, 3, 8}, {2, 32, 3, 2, 16}};
}

TEST(BatchNorm, ForwardAndRunningStatsMatchNaive) {
  for (const ActShape& s : bn_shapes()) {
    BnRun bn(s);
    const auto x = random_vector(s.numel(), 13, -2.f, 3.f);
    std::vector<float> y(x.size());
    bn.forward(x.data(), nullptr, false, y.data(), /*update=*/true);
    const double m = double(s.n * s.hw());
    EXPECT_EQ(bn.count, m) << "batch_norm_sums writes the count per channel";
    for (int64_t c = 0; c < s.c; ++c) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t h = 0; h < s.h; ++h)
          for (int64_t w = 0; w < s.w; ++w) sum += x[at(s, n, c, h, w)];
      const double mean = sum / m;
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t h = 0; h < s.h; ++h)
          for (int64_t w = 0; w < s.w; ++w) sq += std::pow(x[at(s, n, c, h, w)] - mean, 2);
      const double var = sq / m;
      EXPECT_NEAR(bn.rm[c], 0.1 * mean, 1e-5);
      EXPECT_NEAR(bn.rv[c], 0.9 + 0.1 * sq / (m - 1), 1e-5);  // unbiased, like PyTorch
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t h = 0; h < s.h; ++h)
          for (int64_t w = 0; w < s.w; ++w) {
            const int64_t i = at(s, n, c, h, w);
            const double ref = (x[i] - mean) / std::sqrt(var + 1e-5) * bn.gamma[c] + bn.beta[c];
            ASSERT_NEAR(y[i], ref, 1e-4);
          }
    }
    // Eval uses the running statistics.
    std::vector<float> scale(s.c), shift(s.c), ye(x.size());
    cpu::batch_norm_eval_scale_shift(s.c, bn.rm.data(), bn.rv.data(), bn.gamma.data(),
                                     bn.beta.data(), 1e-5f, scale.data(), shift.data());
    cpu::batch_norm_apply(s, x.data(), scale.data(), shift.data(), nullptr, false, ye.data());
    const int64_t i = at(s, 1, s.c - 1, 1, 1);
    const int64_t c = s.c - 1;
    EXPECT_NEAR(ye[i], (x[i] - bn.rm[c]) / std::sqrt(bn.rv[c] + 1e-5) * bn.gamma[c] + bn.beta[c], 1e-4);
  }
}

// Gradients of y = relu?(bn(x) + residual?) w.r.t. x, gamma, beta and the residual.
void check_bn_gradients(bool relu, bool residual) {
  for (const ActShape& s : bn_shapes()) {
    SCOPED_TRACE("c=" + std::to_string(s.c) + " block=" + std::to_string(s.cblock) +
                 " relu=" + std::to_string(relu) + " residual=" + std::to_string(residual));
    BnRun bn(s);
    auto x = random_vector(s.numel(), 21, -2.f, 2.f);
    auto res = random_vector(s.numel(), 22);
    const auto r = random_vector(s.numel(), 23);
    std::vector<float> y(x.size()), dx(x.size());
    const float* rp = residual ? res.data() : nullptr;
    bn.forward(x.data(), rp, relu, y.data());
    std::vector<double> sdy(s.c), sdyx(s.c);
    const float* yp = relu ? y.data() : nullptr;
    cpu::batch_norm_backward_reduce(s, x.data(), r.data(), yp, bn.mean.data(), bn.invstd.data(),
                                    sdy.data(), sdyx.data());
    cpu::batch_norm_backward_apply(s, x.data(), r.data(), yp, bn.mean.data(), bn.invstd.data(),
                                   bn.gamma.data(), sdy.data(), sdyx.data(), &bn.count,
                                   dx.data());
    std::vector<float> dgamma(sdyx.begin(), sdyx.end()), dbeta(sdy.begin(), sdy.end());
    // g_out: the gradient reaching the residual input, written by the same pass.
    std::vector<float> dres(x.size()), dx2(x.size());
    cpu::batch_norm_backward_apply(s, x.data(), r.data(), yp, bn.mean.data(), bn.invstd.data(),
                                   bn.gamma.data(), sdy.data(), sdyx.data(), &bn.count,
                                   dx2.data(), dres.data());
    EXPECT_EQ(dx2, dx);
    std::vector<float> out(x.size());
    auto loss = [&] {
      bn.forward(x.data(), rp, relu, out.data());
      return dot(r, out);
    };
    expect_gradient("bn dx", x, dx, loss, 1e-3, 2e-3, 2e-2);
    expect_gradient("bn dgamma", bn.gamma, dgamma, loss, 1e-3, 2e-3, 2e-2);
    expect_gradient("bn dbeta", bn.beta, dbeta, loss, 1e-3, 2e-3, 2e-2);
    if (residual) expect_gradient("bn dresidual", res, dres, loss, 1e-3, 2e-3, 2e-2);
  }
}

TEST(BatchNorm, GradientsPlain) { check_bn_gradients(false, false); }
TEST(BatchNorm, GradientsFusedRelu) { check_bn_gradients(true, false); }
TEST(BatchNorm, GradientsFusedAddRelu) { check_bn_gradients(true, true); }

TEST(BatchNorm, BackwardApplyMayAliasDy) {
  const ActShape s{2, 16, 3, 3, 16};
  BnRun bn(s);
  const auto x = random_vector(s.numel(), 31);
  auto dy = random_vector(s.numel(), 32);
  std::vector<float> y(x.size()), dx(x.size());
  bn.forward(x.data(), nullptr, true, y.data());
  std::vector<double> a(s.c), b(s.c);
  cpu::batch_norm_backward_reduce(s, x.data(), dy.data(), y.data(), bn.mean.data(),
                                  bn.invstd.data(), a.data(), b.data());
  cpu::batch_norm_backward_apply(s, x.data(), dy.data(), y.data(), bn.mean.data(), bn.invstd.data(),
                                 bn.gamma.data(), a.data(), b.data(), &bn.count, dx.data());
  cpu::batch_norm_backward_apply(s, x.data(), dy.data(), y.data(), bn.mean.data(), bn.invstd.data(),
                                 bn.gamma.data(), a.data(), b.data(), &bn.count, dy.data());
  EXPECT_EQ(dx, dy);
}

// ---- elementwise -----------------------------------------------------------------------------

TEST(Elementwise, ReluGradient) {
  // Values away from the kink so central differences do not straddle it.
  auto x = random_vector(300, 41);
  for (auto& v : x) v += v > 0 ? 0.1f : -0.1f;
  const auto r = random_vector(300, 42);
  std::vector<float> y(300), dx(300), out(300);
  cpu::relu_forward(300, x.data(), y.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] > 0 ? x[i] : 0.f);
  cpu::relu_backward(300, y.data(), r.data(), dx.data());
  expect_gradient("relu", x, dx, [&] {
    cpu::relu_forward(300, x.data(), out.data());
    return dot(r, out);
  }, 1e-2, 1e-4, 1e-3, 300);
}

TEST(Elementwise, AddGradientAndResidualReluBackward) {
  auto a = random_vector(100, 43), b = random_vector(100, 44);
  const auto r = random_vector(100, 45);
  std::vector<float> y(100);
  cpu::add(100, a.data(), b.data(), y.data());
  auto loss = [&] {
    cpu::add(100, a.data(), b.data(), y.data());
    return dot(r, y);
  };
  expect_gradient("add da", a, r, loss, 1e-2, 1e-4, 1e-3, 100);
  expect_gradient("add db", b, r, loss, 1e-2, 1e-4, 1e-3, 100);
  // acc += relu'(y) * dy: the gradient of relu(z) reaching an identity shortcut z.
  auto z = random_vector(100, 46);
  for (auto& v : z) v += v > 0 ? 0.1f : -0.1f;
  std::vector<float> relu_out(100), acc(100, 0.5f), grad(100);
  cpu::relu_forward(100, z.data(), relu_out.data());
  cpu::add_relu_backward(100, relu_out.data(), r.data(), acc.data());
  for (size_t i = 0; i < acc.size(); ++i) grad[i] = acc[i] - 0.5f;
  expect_gradient("add_relu_backward", z, grad, [&] {
    cpu::relu_forward(100, z.data(), relu_out.data());
    return dot(r, relu_out);
  }, 1e-2, 1e-4, 1e-3, 100);
}

// ---- pooling, linear, loss -------------------------------------------------------------------

TEST(GlobalAvgPool, ForwardAndGradient) {
  for (const ActShape& s : {ActShape{2, 3, 4, 4, 1}, ActShape{3, 32, 2, 3, 16}, ActShape{2, 8, 3, 3, 8}}) {
    auto x = random_vector(s.numel(), 51);
    const auto r = random_vector(s.n * s.c, 52);
    std::vector<float> y(s.n * s.c), dx(x.size());
    cpu::global_avg_pool_forward(s, x.data(), y.data());
    double ref = 0;
    for (int64_t h = 0; h < s.h; ++h)
      for (int64_t w = 0; w < s.w; ++w) ref += x[at(s, 1, s.c - 1, h, w)];
    EXPECT_NEAR(y[1 * s.c + s.c - 1], ref / s.hw(), 1e-5);
    cpu::global_avg_pool_backward(s, r.data(), dx.data());
    expect_gradient("avgpool", x, dx, [&] {
      cpu::global_avg_pool_forward(s, x.data(), y.data());
      return dot(r, y);
    }, 1e-2, 1e-4, 1e-3);
  }
}

// torch.nn.MaxPool2d(3, 2, 1) (the ImageNet stem's) and other windows, in every layout: values
// against a naive loop over NCHW indices, the gradient by finite differences, ties to the first.
TEST(MaxPool, ForwardMatchesNaiveAndGradientMatchesFiniteDifferences) {
  struct Case {
    ActShape in;
    int64_t kernel, stride, pad;
  };
  for (const Case& cs : {Case{{2, 3, 7, 6, 1}, 3, 2, 1}, Case{{2, 16, 5, 5, 8}, 3, 2, 1},
                         Case{{1, 32, 8, 9, 16}, 3, 2, 1}, Case{{2, 4, 6, 6, 1}, 2, 2, 0},
                         Case{{1, 2, 5, 4, 1}, 3, 1, 1}}) {
    const kernels::PoolShape s{cs.in, cs.kernel, cs.stride, cs.pad};
    const ActShape o = s.out();
    SCOPED_TRACE(::testing::Message() << "in " << s.in.n << "x" << s.in.c << "x" << s.in.h << "x"
                                      << s.in.w << " block " << s.in.cblock << " k " << s.kernel
                                      << " s " << s.stride << " p " << s.pad);
    EXPECT_EQ(o.h, (s.in.h + 2 * s.pad - s.kernel) / s.stride + 1);
    auto x = random_vector(s.in.numel(), 61);
    const auto r = random_vector(o.numel(), 62);
    std::vector<float> y(o.numel()), dx(x.size());
    cpu::max_pool_forward(s, x.data(), y.data());
    for (int64_t n = 0; n < o.n; ++n)
      for (int64_t c = 0; c < o.c; ++c)
        for (int64_t oy = 0; oy < o.h; ++oy)
          for (int64_t ox = 0; ox < o.w; ++ox) {
            float best = -INFINITY;
            for (int64_t ky = 0; ky < s.kernel; ++ky)
              for (int64_t kx = 0; kx < s.kernel; ++kx) {
                const int64_t iy = oy * s.stride - s.pad + ky, ix = ox * s.stride - s.pad + kx;
                if (iy >= 0 && iy < s.in.h && ix >= 0 && ix < s.in.w)
                  best = std::max(best, x[at(s.in, n, c, iy, ix)]);
              }
            ASSERT_EQ(y[at(o, n, c, oy, ox)], best) << n << " " << c << " " << oy << " " << ox;
          }
    cpu::max_pool_backward(s, x.data(), r.data(), dx.data());
    // A small step: the winner of a window must not change between x - eps and x + eps.
    expect_gradient("maxpool", x, dx, [&] {
      cpu::max_pool_forward(s, x.data(), y.data());
      return dot(r, y);
    }, 1e-4, 1e-3, 1e-3, 256);
  }
  // Equal values: the first pixel of each window inside the image (row-major) takes the whole
  // gradient, like PyTorch. The 2x2 windows of a 4x4 image start at rows/columns -1 and 1.
  const kernels::PoolShape s{{1, 1, 4, 4, 1}, 3, 2, 1};
  const std::vector<float> x(16, 1.0f), dy = {1, 2, 3, 4};
  std::vector<float> dx(16);
  cpu::max_pool_backward(s, x.data(), dy.data(), dx.data());
  const std::vector<float> first_of_each_window = {1, 2, 0, 0, 3, 4, 0, 0,
                                                   0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(dx, first_of_each_window);
}

TEST(Linear, Gradients) {
  const int64_t n = 5, in = 7, out = 3;
  auto x = random_vector(n * in, 61), w = random_vector(out * in, 62), b = random_vector(out, 63);
  const auto r = random_vector(n * out, 64);
  std::vector<float> y(n * out), dx(x.size()), dw(w.size()), db(b.size());
  cpu::linear_forward(n, in, out, x.data(), w.data(), b.data(), y.data());
  double ref = b[2];
  for (int64_t k = 0; k < in; ++k) ref += double(x[4 * in + k]) * w[2 * in + k];
  EXPECT_NEAR(y[4 * out + 2], ref, 1e-5);
  cpu::linear_backward(n, in, out, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
  auto loss = [&] {
    cpu::linear_forward(n, in, out, x.data(), w.data(), b.data(), y.data());
    return dot(r, y);
  };
  expect_gradient("linear dx", x, dx, loss, 1e-2, 1e-4, 1e-3);
  expect_gradient("linear dw", w, dw, loss, 1e-2, 1e-4, 1e-3);
  expect_gradient("linear db", b, db, loss, 1e-2, 1e-4, 1e-3);
}

TEST(SoftmaxCrossEntropy, ValueAccuracyAndGradient) {
  const int64_t n = 4, k = 5;
  auto logits = random_vector(n * k, 71, -3.f, 3.f);
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  std::vector<float> grad(logits.size());
  int64_t correct = -1;
  const float loss = cpu::softmax_cross_entropy(n, k, logits.data(), labels.data(), grad.data(), &correct);
  double ref = 0;
  int64_t ref_correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;
    int64_t arg = 0;
    for (int64_t j = 0; j < k; ++j) {
      z += std::exp(double(logits[i * k + j]));
      if (logits[i * k + j] > logits[i * k + arg]) arg = j;
    }
    ref += std::log(z) - logits[i * k + labels[i]];
    ref_correct += arg == labels[i];
  }
  EXPECT_NEAR(loss, ref / n, 1e-5);
  EXPECT_EQ(correct, ref_correct);
  expect_gradient("cross entropy", logits, grad, [&] {
    return double(cpu::softmax_cross_entropy(n, k, logits.data(), labels.data(), nullptr, nullptr));
  }, 1e-2, 1e-4, 1e-2);
  // Large logits stay finite (log-sum-exp).
  std::vector<float> big = {1000.f, -1000.f};
  const int32_t label = 1;
  EXPECT_NEAR(cpu::softmax_cross_entropy(1, 2, big.data(), &label, nullptr, nullptr), 2000.f, 1e-2);
}

TEST(SoftmaxCrossEntropy, RejectsLabelOutOfRange) {
  std::vector<float> logits(3, 0.f);
  const int32_t label = 3;
  EXPECT_THROW(cpu::softmax_cross_entropy(1, 3, logits.data(), &label, nullptr, nullptr), Error);
}

// ---- optimizers: the torch.optim formulas written out in double --------------------------------

TEST(Optim, SgdMatchesTorchFormulas) {
  for (bool nesterov : {false, true}) {
    const float lr = 0.1f, mom = 0.9f, wd = 5e-4f;
    auto p = random_vector(50, 81);
    std::vector<float> buf(50);
    std::vector<double> ref_p(p.begin(), p.end()), ref_buf(50);
    for (int step = 0; step < 3; ++step) {
      const auto g = random_vector(50, 82 + step);
      cpu::sgd_step(50, p.data(), g.data(), buf.data(), lr, mom, nesterov, wd, step == 0);
      for (size_t i = 0; i < 50; ++i) {
        double d = g[i] + double(wd) * ref_p[i];
        ref_buf[i] = step == 0 ? d : mom * ref_buf[i] + d;
        d = nesterov ? d + mom * ref_buf[i] : ref_buf[i];
        ref_p[i] -= lr * d;
      }
    }
    for (size_t i = 0; i < 50; ++i) ASSERT_NEAR(p[i], ref_p[i], 1e-5) << "nesterov " << nesterov;
  }
  // Plain SGD needs no buffer.
  std::vector<float> p = {1.f}, g = {2.f};
  cpu::sgd_step(1, p.data(), g.data(), nullptr, 0.5f, 0.f, false, 0.f, true);
  EXPECT_FLOAT_EQ(p[0], 0.f);
}

TEST(Optim, AdamMatchesTorchFormulas) {
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 1e-2f;
  auto p = random_vector(40, 91);
  std::vector<float> m(40), v(40);
  std::vector<double> rp(p.begin(), p.end()), rm(40), rv(40);
  for (int step = 1; step <= 4; ++step) {
    const auto g = random_vector(40, 92 + step);
    cpu::adam_step(40, p.data(), g.data(), m.data(), v.data(), lr, b1, b2, eps, wd, step);
    for (size_t i = 0; i < 40; ++i) {
      const double gi = g[i] + double(wd) * rp[i];
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      const double denom = std::sqrt(rv[i]) / std::sqrt(1 - std::pow(double(b2), step)) + eps;
      rp[i] -= lr / (1 - std::pow(double(b1), step)) * rm[i] / denom;
    }
  }
  for (size_t i = 0; i < 40; ++i) ASSERT_NEAR(p[i], rp[i], 1e-6);
}

TEST(Threads, SetAndGet) {
  const int before = cpu::num_threads();
  cpu::set_num_threads(1);
  EXPECT_EQ(cpu::num_threads(), 1);
  cpu::set_num_threads(before);
  EXPECT_EQ(cpu::preferred_cblock(3), 1);
  EXPECT_EQ(cpu::preferred_cblock(24), 8);
  EXPECT_EQ(cpu::preferred_cblock(64) % 8, 0);
}

}  // namespace
}  // namespace dlaunch
