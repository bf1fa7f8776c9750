// Every CUDA op against its CPU twin on the same inputs (label gpu), and the CUDA backend object. Skips without a GPU:
// cudaGetDeviceCount failing (no driver/device) counts as zero devices.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "tests/kernels/grad_check.h"

namespace dlaunch {
namespace {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;
using kernels::ActShape;
using kernels::ConvShape;
using test::random_vector;

// A device copy of a host vector, freed on destruction.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    ptr_ = static_cast<T*>(alloc(n_));
    gpu::copy_to_device(ptr_, host.data(), static_cast<int64_t>(n_ * sizeof(T)));
  }
  explicit Dev(size_t n) : Dev(std::vector<T>(n)) {}
  ~Dev() { gpu::free_device(ptr_); }
  T* get() { return ptr_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    gpu::synchronize();
    gpu::copy_to_host(h.data(), ptr_, static_cast<int64_t>(n_ * sizeof(T)));
    return h;
  }

 private:
  static void* alloc(size_t n) {
    if (sizeof(T) == sizeof(double)) return gpu::alloc_doubles(static_cast<int64_t>(n));
    return gpu::alloc_floats(static_cast<int64_t>((n * sizeof(T) + 3) / 4));
  }
  size_t n_;
  T* ptr_;
};

template <typename T>
void expect_close(const std::vector<T>& gpu_out, const std::vector<T>& cpu_out, double tol,
                  const char* what) {
  ASSERT_EQ(gpu_out.size(), cpu_out.size()) << what;
  for (size_t i = 0; i < cpu_out.size(); ++i)
    ASSERT_NEAR(gpu_out[i], cpu_out[i], tol * (1 + std::fabs(double(cpu_out[i])))) << what << " at " << i;
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  }
};

TEST_F(Cuda, Convolutions) {
  for (auto c : std::vector<ConvShape>{{4, 3, 16, 16, 16, 3, 1, 1, 1, 1}, {4, 16, 16, 16, 32, 3, 2, 1, 1, 1},
                                       {4, 16, 16, 16, 32, 1, 2, 0, 1, 1}}) {
    const auto x = random_vector(c.in().numel(), 1), w = random_vector(c.weight_numel(), 2),
               dy = random_vector(c.out().numel(), 3);
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
    cpu::conv2d_forward(c, x.data(), w.data(), y.data());
    cpu::conv2d_backward_data(c, dy.data(), w.data(), dx.data());
    cpu::conv2d_backward_weights(c, x.data(), dy.data(), dw.data());
    Dev<float> gx(x), gw(w), gdy(dy), gy(y.size()), gdx(x.size()), gdw(w.size());
    gpu::conv2d_forward(c, gx.get(), gw.get(), gy.get());
    gpu::conv2d_backward_data(c, gdy.get(), gw.get(), gdx.get());
    gpu::conv2d_backward_weights(c, gx.get(), gdy.get(), gdw.get());
    // Accumulating backward-data adds to what dx held.
    std::vector<float> acc = x;
    cpu::conv2d_backward_data(c, dy.data(), w.data(), acc.data(), /*accumulate=*/true);
    Dev<float> gacc(x);
    gpu::conv2d_backward_data(c, gdy.get(), gw.get(), gacc.get(), /*accumulate=*/true);
    expect_close(gacc.host(), acc, 1e-4, "conv backward data accumulate");
    expect_close(gy.host(), y, 1e-4, "conv forward");
    expect_close(gdx.host(), dx, 1e-4, "conv backward data");
    expect_close(gdw.host(), dw, 1e-3, "conv backward weights");
  }
}

TEST_F(Cuda, BatchNormTrainingEvalAndBackward) {
  for (const ActShape& s : {ActShape{4, 6, 5, 5, 1}, ActShape{3, 32, 4, 4, 16}}) {
    const auto x = random_vector(s.numel(), 4, -2.f, 3.f), res = random_vector(s.numel(), 5),
               dy = random_vector(s.numel(), 6), gamma = random_vector(s.c, 7, 0.5f, 1.5f),
               beta = random_vector(s.c, 8);
    // CPU
    std::vector<double> sum(s.c), sq(s.c), sdy(s.c), sdyx(s.c);
    std::vector<float> mean(s.c), is(s.c), scale(s.c), shift(s.c), rm(s.c, 0.f), rv(s.c, 1.f),
        y(x.size()), dx(x.size()), escale(s.c), eshift(s.c);
    double count = 0;
    cpu::batch_norm_sums(s, x.data(), sum.data(), sq.data(), &count);
    cpu::batch_norm_scale_shift(s.c, sum.data(), sq.data(), &count, gamma.data(), beta.data(), 1e-5f,
                                0.1f, mean.data(), is.data(), scale.data(), shift.data(), rm.data(), rv.data());
    cpu::batch_norm_apply(s, x.data(), scale.data(), shift.data(), res.data(), true, y.data());
    cpu::batch_norm_backward_reduce(s, x.data(), dy.data(), y.data(), mean.data(), is.data(),
                                    sdy.data(), sdyx.data());
    std::vector<float> g(x.size());
    cpu::batch_norm_backward_apply(s, x.data(), dy.data(), y.data(), mean.data(), is.data(),
                                   gamma.data(), sdy.data(), sdyx.data(), &count, dx.data(), g.data());
    cpu::batch_norm_eval_scale_shift(s.c, rm.data(), rv.data(), gamma.data(), beta.data(), 1e-5f,
                                     escale.data(), eshift.data());
    // GPU
    Dev<float> gx(x), gres(res), gdy(dy), ggamma(gamma), gbeta(beta), gmean(s.c), gis(s.c),
        gscale(s.c), gshift(s.c), grm(std::vector<float>(s.c, 0.f)), grv(std::vector<float>(s.c, 1.f)),
        gy(x.size()), gdx(x.size()), gescale(s.c), geshift(s.c);
    Dev<double> gsum(s.c), gsq(s.c), gsdy(s.c), gsdyx(s.c), gcount(1);
    gpu::batch_norm_sums(s, gx.get(), gsum.get(), gsq.get(), gcount.get());
    gpu::batch_norm_scale_shift(s.c, gsum.get(), gsq.get(), gcount.get(), ggamma.get(), gbeta.get(), 1e-5f,
                                0.1f, gmean.get(), gis.get(), gscale.get(), gshift.get(), grm.get(), grv.get());
    gpu::batch_norm_apply(s, gx.get(), gscale.get(), gshift.get(), gres.get(), true, gy.get());
    gpu::batch_norm_backward_reduce(s, gx.get(), gdy.get(), gy.get(), gmean.get(), gis.get(),
                                    gsdy.get(), gsdyx.get());
    Dev<float> gg(x.size());
    gpu::batch_norm_backward_apply(s, gx.get(), gdy.get(), gy.get(), gmean.get(), gis.get(),
                                   ggamma.get(), gsdy.get(), gsdyx.get(), gcount.get(), gdx.get(), gg.get());
    expect_close(gg.host(), g, 0, "bn masked gradient");
    gpu::batch_norm_eval_scale_shift(s.c, grm.get(), grv.get(), ggamma.get(), gbeta.get(), 1e-5f,
                                     gescale.get(), geshift.get());
    expect_close(gcount.host(), std::vector<double>{count}, 0, "bn count");
    expect_close(gsum.host(), sum, 1e-6, "bn sum");
    expect_close(gsq.host(), sq, 1e-6, "bn sumsq");
    expect_close(grm.host(), rm, 1e-5, "bn running mean");
    expect_close(grv.host(), rv, 1e-5, "bn running var");
    expect_close(gy.host(), y, 1e-5, "bn apply");
    expect_close(gsdy.host(), sdy, 1e-5, "bn sum dy");
    expect_close(gsdyx.host(), sdyx, 1e-5, "bn sum dy xhat");
    expect_close(gdx.host(), dx, 1e-4, "bn dx");
    expect_close(gescale.host(), escale, 1e-6, "bn eval scale");
    expect_close(geshift.host(), eshift, 1e-6, "bn eval shift");
  }
}

TEST_F(Cuda, ElementwisePoolLayout) {
  const ActShape s{3, 32, 4, 5, 16};
  const int64_t n = s.numel();
  const auto a = random_vector(n, 9), b = random_vector(n, 10), d = random_vector(s.n * s.c, 11);
  std::vector<float> relu(n), relub(n), sum(n), acc(b), pooled(s.n * s.c), unpooled(n), plain(n);
  cpu::relu_forward(n, a.data(), relu.data());
  cpu::relu_backward(n, relu.data(), b.data(), relub.data());
  cpu::add(n, a.data(), b.data(), sum.data());
  cpu::add_relu_backward(n, relu.data(), a.data(), acc.data());
  cpu::global_avg_pool_forward(s, a.data(), pooled.data());
  cpu::global_avg_pool_backward(s, d.data(), unpooled.data());
  cpu::reorder(s, a.data(), 1, plain.data());
  Dev<float> ga(a), gb(b), gd(d), grelu(n), grelub(n), gsum(n), gacc(b), gpooled(pooled.size()),
      gunpooled(n), gplain(n);
  gpu::relu_forward(n, ga.get(), grelu.get());
  gpu::relu_backward(n, grelu.get(), gb.get(), grelub.get());
  gpu::add(n, ga.get(), gb.get(), gsum.get());
  gpu::add_relu_backward(n, grelu.get(), ga.get(), gacc.get());
  gpu::global_avg_pool_forward(s, ga.get(), gpooled.get());
  gpu::global_avg_pool_backward(s, gd.get(), gunpooled.get());
  gpu::reorder(s, ga.get(), 1, gplain.get());
  expect_close(grelu.host(), relu, 0, "relu");
  expect_close(grelub.host(), relub, 0, "relu backward");
  expect_close(gsum.host(), sum, 0, "add");
  expect_close(gacc.host(), acc, 0, "add_relu_backward");
  expect_close(gpooled.host(), pooled, 1e-5, "avg pool");
  expect_close(gunpooled.host(), unpooled, 1e-6, "avg pool backward");
  expect_close(gplain.host(), plain, 0, "reorder");
}

// The max-pool of the ImageNet stem, in the plain and a blocked layout: the same winners.
TEST_F(Cuda, MaxPoolForwardAndBackward) {
  for (const ActShape& in : {ActShape{2, 3, 9, 7, 1}, ActShape{2, 32, 8, 8, 16}}) {
    const kernels::PoolShape s{in, 3, 2, 1};
    const auto x = random_vector(in.numel(), 63), dy = random_vector(s.out().numel(), 64);
    std::vector<float> y(s.out().numel()), dx(in.numel());
    cpu::max_pool_forward(s, x.data(), y.data());
    cpu::max_pool_backward(s, x.data(), dy.data(), dx.data());
    Dev<float> gx(x), gdy(dy), gy(y.size()), gdx(dx.size());
    gpu::max_pool_forward(s, gx.get(), gy.get());
    gpu::max_pool_backward(s, gx.get(), gdy.get(), gdx.get());
    expect_close(gy.host(), y, 0, "max pool");
    expect_close(gdx.host(), dx, 1e-6, "max pool backward");
  }
}

TEST_F(Cuda, LinearLossOptimizers) {
  const int64_t n = 6, in = 9, out = 4;
  const auto x = random_vector(n * in, 12), w = random_vector(out * in, 13), bias = random_vector(out, 14),
             dy = random_vector(n * out, 15);
  std::vector<float> y(n * out), dx(x.size()), dw(w.size()), db(out);
  cpu::linear_forward(n, in, out, x.data(), w.data(), bias.data(), y.data());
  cpu::linear_backward(n, in, out, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
  Dev<float> gx(x), gw(w), gbias(bias), gdy(dy), gy(y.size()), gdx(x.size()), gdw(w.size()), gdb(out);
  gpu::linear_forward(n, in, out, gx.get(), gw.get(), gbias.get(), gy.get());
  gpu::linear_backward(n, in, out, gx.get(), gw.get(), gdy.get(), gdx.get(), gdw.get(), gdb.get());
  expect_close(gy.host(), y, 1e-5, "linear");
  expect_close(gdx.host(), dx, 1e-5, "linear dx");
  expect_close(gdw.host(), dw, 1e-5, "linear dw");
  expect_close(gdb.host(), db, 1e-5, "linear db");

  const std::vector<int32_t> labels = {0, 1, 2, 3, 0, 1};
  std::vector<float> grad(y.size());
  int64_t hits = 0, ghits = 0;
  const float loss = cpu::softmax_cross_entropy(n, out, y.data(), labels.data(), grad.data(), &hits);
  Dev<float> ggrad(y.size());
  const float gloss = gpu::softmax_cross_entropy(n, out, gy.get(), labels.data(), ggrad.get(), &ghits);
  EXPECT_NEAR(gloss, loss, 1e-5);
  EXPECT_EQ(ghits, hits);
  expect_close(ggrad.host(), grad, 1e-6, "cross entropy grad");

  const auto p0 = random_vector(100, 16), g = random_vector(100, 17);
  std::vector<float> p = p0, buf(100), m(100), v(100), pa = p0;
  Dev<float> gp(p0), gg(g), gbuf(100), gpa(p0), gm(100), gv(100);
  for (int step = 1; step <= 3; ++step) {
    cpu::sgd_step(100, p.data(), g.data(), buf.data(), 0.1f, 0.9f, true, 5e-4f, step == 1);
    gpu::sgd_step(100, gp.get(), gg.get(), gbuf.get(), 0.1f, 0.9f, true, 5e-4f, step == 1);
    cpu::adam_step(100, pa.data(), g.data(), m.data(), v.data(), 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, step);
    gpu::adam_step(100, gpa.get(), gg.get(), gm.get(), gv.get(), 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, step);
  }
  expect_close(gp.host(), p, 1e-6, "sgd");
  expect_close(gpa.host(), pa, 1e-6, "adam");

  // The grouped (multi-tensor) steps: one kernel over segments with their own lr and decay.
  const std::vector<kernels::OptimSegment> segs = {{0, 30, 1.0, 5e-4f}, {30, 31, 3.0, 0.f}, {31, 99, 1.0, 5e-4f},
                                          {99, 100, 3.0, 0.f}};
  Dev<kernels::OptimSegment> gsegs(segs);
  std::vector<float> q = p0, qbuf(100), qa = p0, qm(100), qv(100);
  Dev<float> gq(p0), gqbuf(100), gqa(p0), gqm(100), gqv(100);
  for (int step = 1; step <= 3; ++step) {
    cpu::sgd_step_grouped(4, segs.data(), 100, q.data(), g.data(), qbuf.data(), 0.1f, 0.9f, true, step == 1);
    gpu::sgd_step_grouped(4, gsegs.get(), 100, gq.get(), gg.get(), gqbuf.get(), 0.1f, 0.9f, true, step == 1);
    cpu::adam_step_grouped(4, segs.data(), 100, qa.data(), g.data(), qm.data(), qv.data(), 1e-3f, 0.9f, 0.999f,
                           1e-8f, step);
    gpu::adam_step_grouped(4, gsegs.get(), 100, gqa.get(), gg.get(), gqm.get(), gqv.get(), 1e-3f, 0.9f, 0.999f,
                           1e-8f, step);
  }
  expect_close(gq.host(), q, 1e-6, "sgd grouped");
  expect_close(gqa.host(), qa, 1e-6, "adam grouped");
}

// Past 65535 * 4 blocks of 256 threads (67,107,840 items) the grid stops growing: every kernel
// must cover its items with a grid-stride loop. Ops that used one thread per item left the tail
// untouched; these check the last items of ops with more than that many outputs.
TEST_F(Cuda, KernelsCoverMoreItemsThanTheGridCap) {
  const int64_t big = 65535LL * 4 * 256 + 1000;
  {  // global average pool: one output per (image, channel)
    const ActShape s{big, 1, 1, 1, 1};
    std::vector<float> x(static_cast<size_t>(big));
    for (int64_t i = 0; i < big; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 1000);
    Dev<float> dx(x), dy(static_cast<size_t>(big));
    gpu::global_avg_pool_forward(s, dx.get(), dy.get());
    const auto y = dy.host();
    for (int64_t i = big - 2000; i < big; ++i)
      ASSERT_EQ(y[static_cast<size_t>(i)], static_cast<float>(i % 1000)) << "pool output " << i;
  }
  {  // eval scale/shift: one item per channel
    std::vector<float> ones(static_cast<size_t>(big), 1.0f), zeros(static_cast<size_t>(big), 0.0f);
    Dev<float> rm(zeros), rv(ones), gamma(ones), beta(ones), scale(zeros), shift(zeros);
    gpu::batch_norm_eval_scale_shift(big, rm.get(), rv.get(), gamma.get(), beta.get(), 0.0f, scale.get(),
                                     shift.get());
    const auto sc = scale.host(), sh = shift.host();
    for (int64_t i = big - 2000; i < big; ++i) {
      ASSERT_EQ(sc[static_cast<size_t>(i)], 1.0f) << "scale " << i;
      ASSERT_EQ(sh[static_cast<size_t>(i)], 1.0f) << "shift " << i;
    }
  }
}

// The two ops the backend's op table added for the trainer (fill, the BN parameter gradients
// from the double sums), and the CUDA backend object itself: memory zeroed, copies both ways.
TEST_F(Cuda, FillParamGradsAndTheBackendObject) {
  const int64_t c = 37;
  std::vector<double> sdy(c), sdyx(c);
  for (int64_t i = 0; i < c; ++i) sdy[i] = 0.25 * i - 3, sdyx[i] = 1e-3 * i * i;
  std::vector<float> dgamma(c), dbeta(c), filled(1000);
  cpu::batch_norm_param_grads(c, sdy.data(), sdyx.data(), dgamma.data(), dbeta.data());
  cpu::fill(1000, 1.5f, filled.data());
  Dev<double> gsdy(sdy), gsdyx(sdyx);
  Dev<float> gdgamma(c), gdbeta(c), gfilled(1000);
  gpu::batch_norm_param_grads(c, gsdy.get(), gsdyx.get(), gdgamma.get(), gdbeta.get());
  gpu::fill(1000, 1.5f, gfilled.get());
  expect_close(gdgamma.host(), dgamma, 0, "dgamma");
  expect_close(gdbeta.host(), dbeta, 0, "dbeta");
  expect_close(gfilled.host(), filled, 0, "fill");

  kernels::Backend& be = gpu::open_backend(0);
  EXPECT_FALSE(be.host_accessible());
  EXPECT_EQ(be.preferred_cblock(64), 1);
  auto* p = static_cast<float*>(be.alloc(4000));
  std::vector<float> back(1000, -1.f);
  be.copy_to_host(back.data(), p, 4000);
  EXPECT_EQ(back[999], 0.f);  // zeroed
  be.copy_from_host(p, filled.data(), 4000);
  be.add(1000, p, p, p);
  be.copy_to_host(back.data(), p, 4000);
  EXPECT_EQ(back[500], 3.f);
  be.free(p);
}

// The fast recipe's ops (issue 11): the loss op with label smoothing, on the device.
TEST_F(Cuda, RecipeLossWithLabelSmoothing) {
  const int64_t n = 7, k = 10;
  const auto z = random_vector(n * k, 81, -4.f, 4.f);
  const std::vector<int32_t> labels = {0, 9, 3, 3, 5, 1, 7};
  std::vector<float> grad(z.size());
  int64_t hits = 0, ghits = 0;
  const float loss = cpu::softmax_cross_entropy(n, k, z.data(), labels.data(), grad.data(), &hits, 0.2f);
  Dev<float> gz(z), ggrad(z.size());
  const float gloss = gpu::softmax_cross_entropy(n, k, gz.get(), labels.data(), ggrad.get(), &ghits, 0.2f);
  EXPECT_NEAR(gloss, loss, 1e-6);
  EXPECT_EQ(ghits, hits);
  expect_close(ggrad.host(), grad, 1e-6, "smoothed cross entropy grad");
}

// The training step's loss op keeps its sums on the device: the same bits as the CPU op (one
// thread adds the rows in order there too), the labels staged without a wait.
TEST_F(Cuda, LossSumsStayOnTheDeviceAndEqualTheCpuBitForBit) {
  const int64_t n = 7, k = 10;
  const std::vector<int32_t> labels = {0, 9, 3, 3, 5, 1, 7};
  std::vector<double> sums = {1.5, 2, 7, 0, 0, 0};
  Dev<double> gsums(sums);
  for (int step = 0; step < 3; ++step) {
    const auto z = random_vector(n * k, 85 + step, -4.f, 4.f);
    std::vector<float> grad(z.size());
    cpu::softmax_cross_entropy_sums(n, k, z.data(), labels.data(), grad.data(), 0.1f, sums.data(),
                                    2);
    Dev<float> gz(z), ggrad(z.size());
    gpu::softmax_cross_entropy_sums(n, k, gz.get(), labels.data(), ggrad.get(), 0.1f,
                                    gsums.get(), 2);
    expect_close(ggrad.host(), grad, 1e-6, "cross entropy grad");
  }
  const std::vector<double> got = gsums.host();
  for (size_t i = 0; i < sums.size(); ++i) EXPECT_EQ(got[i], sums[i]) << "entry " << i;
}

// Backend::stage_to_device: the host buffer may change at once; the device gets what it held.
TEST_F(Cuda, StagedCopiesArriveInOrderAndTheHostBufferIsFreeAtOnce) {
  kernels::Backend& be = gpu::open_backend(0);
  std::vector<int64_t> host(1000);
  int64_t* dev = static_cast<int64_t*>(be.alloc(host.size() * sizeof(int64_t) * 8));
  for (int round = 0; round < 8; ++round) {
    for (size_t i = 0; i < host.size(); ++i) host[i] = round * 100000 + static_cast<int64_t>(i);
    be.stage_to_device(dev + round * host.size(), host.data(), host.size() * sizeof(int64_t));
    std::fill(host.begin(), host.end(), -1);  // must not reach the device
  }
  std::vector<int64_t> back(host.size() * 8);
  be.copy_to_host(back.data(), dev, back.size() * sizeof(int64_t));
  for (int round = 0; round < 8; ++round) {
    EXPECT_EQ(back[round * host.size() + 7], round * 100000 + 7) << "round " << round;
  }
  be.free(dev);
}

TEST_F(Cuda, RecipeFlipHorizontal) {
  for (const ActShape& s : {ActShape{3, 3, 32, 32, 1}, ActShape{2, 32, 5, 7, 16}}) {
    const auto x = random_vector(s.numel(), 82);
    std::vector<float> y(x.size());
    cpu::flip_horizontal(s, x.data(), y.data());
    Dev<float> gx(x), gy(x.size());
    gpu::flip_horizontal(s, gx.get(), gy.get());
    expect_close(gy.host(), y, 0, "flip");
  }
}

TEST_F(Cuda, RecipeEmaUpdate) {
  const int64_t n = 1000;
  const auto x = random_vector(n, 83), avg0 = random_vector(n, 84);
  std::vector<float> avg = avg0;
  cpu::ema_update(n, 0.99f, x.data(), avg.data());
  cpu::ema_update(n, 0.9f, x.data(), avg.data());
  Dev<float> gx(x), gavg(avg0);
  gpu::ema_update(n, 0.99f, gx.get(), gavg.get());
  gpu::ema_update(n, 0.9f, gx.get(), gavg.get());
  expect_close(gavg.host(), avg, 0, "ema");
}

}  // namespace
}  // namespace dlaunch
