// Batch norm on NCHW and channel-blocked layouts. Work is split over (image, channel block)
// planes of hw * cblock contiguous floats; per-channel sums are accumulated per plane in float
// (at most a few thousand terms) and across planes in double, per thread, then combined, so the
// result does not depend on the batch size's effect on float rounding.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {
namespace {

void check_shape(const ActShape& s) {
  DL_CHECK(s.n > 0 && s.c > 0 && s.h > 0 && s.w > 0 && s.cblock >= 1 && s.c % s.cblock == 0)
      << "bad activation shape n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w
      << " cblock=" << s.cblock;
}

// Runs body(plane_index, first_channel, plane_pointer_offset) over all planes with per-thread
// double accumulators of 2 * C entries, then sums them into out0/out1 (C entries each).
template <typename PlaneFn>
void reduce_planes(const ActShape& s, double* out0, double* out1, PlaneFn&& plane_fn) {
  const int64_t cb = s.cblock, blocks = s.c / cb, planes = s.n * blocks;
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(planes)));
  std::vector<double> partial(static_cast<size_t>(threads) * 2 * s.c, 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    double* acc0 = partial.data() + static_cast<size_t>(t) * 2 * s.c;
    double* acc1 = acc0 + s.c;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t c0 = (p % blocks) * cb;
      plane_fn(p, acc0 + c0, acc1 + c0);
    }
  }
  for (int64_t c = 0; c < s.c; ++c) {
    double a = 0, b = 0;
    for (int t = 0; t < threads; ++t) {
      a += partial[static_cast<size_t>(t) * 2 * s.c + c];
      b += partial[static_cast<size_t>(t) * 2 * s.c + s.c + c];
    }
    out0[c] = a;
    out1[c] = b;
  }
}

// Sums of one plane: hw pixels of CB channels each (CB = 1: one channel, contiguous).
// Double accumulators even within a plane: the variance is E[x^2] - E[x]^2, and with a mean large
// against the spread (mean 1000, std 0.01) float partial sums of x^2 (ulp 4 at 6e7) lose it
// entirely. Memory-bound either way; doubles cost little.
template <int CB>
void plane_sums(const float* x, int64_t hw, double* sum, double* sumsq) {
  double s[CB] = {}, q[CB] = {};
  for (int64_t i = 0; i < hw; ++i) {
    const float* px = x + i * CB;
#pragma omp simd
    for (int j = 0; j < CB; ++j) {
      const double v = px[j];
      s[j] += v;
      q[j] += v * v;
    }
  }
  for (int j = 0; j < CB; ++j) {
    sum[j] += s[j];
    sumsq[j] += q[j];
  }
}

void plane_sums_flat(const float* x, int64_t hw, double* sum, double* sumsq) {
  double s = 0, q = 0;
#pragma omp simd reduction(+ : s, q)
  for (int64_t i = 0; i < hw; ++i) {
    const double v = x[i];
    s += v;
    q += v * v;
  }
  *sum += s;
  *sumsq += q;
}

template <int CB, bool kRes, bool kRelu>
void plane_apply_t(const float* x, int64_t hw, const float* scale, const float* shift,
                   const float* res, float* y) {
  float sc[CB], sh[CB];
  for (int j = 0; j < CB; ++j) sc[j] = scale[j], sh[j] = shift[j];
  for (int64_t i = 0; i < hw; ++i) {
    const int64_t o = i * CB;
#pragma omp simd
    for (int j = 0; j < CB; ++j) {
      float v = x[o + j] * sc[j] + sh[j];
      if (kRes) v += res[o + j];
      if (kRelu) v = v > 0.f ? v : 0.f;
      y[o + j] = v;
    }
  }
}

// The flags become template arguments so the inner loops carry no branches.
template <int CB>
void plane_apply(const float* x, int64_t hw, const float* scale, const float* shift,
                 const float* res, bool relu, float* y) {
  if (res) {
    if (relu) return plane_apply_t<CB, true, true>(x, hw, scale, shift, res, y);
    return plane_apply_t<CB, true, false>(x, hw, scale, shift, res, y);
  }
  if (relu) return plane_apply_t<CB, false, true>(x, hw, scale, shift, res, y);
  return plane_apply_t<CB, false, false>(x, hw, scale, shift, res, y);
}

void plane_apply_flat(const float* x, int64_t hw, float sc, float sh, const float* res, bool relu,
                      float* y) {
  if (res) {
#pragma omp simd
    for (int64_t i = 0; i < hw; ++i) {
      float v = x[i] * sc + sh + res[i];
      y[i] = relu ? (v > 0.f ? v : 0.f) : v;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < hw; ++i) {
      float v = x[i] * sc + sh;
      y[i] = relu ? (v > 0.f ? v : 0.f) : v;
    }
  }
}

// Backward sums of one plane (CB channels per pixel; CB = 1 is the flat case too).
template <int CB, bool kMask>
void plane_bwd_sums_t(const float* x, const float* dy, const float* r, int64_t hw,
                      const float* mean, double* sdy, double* sdyx) {
  float a[CB] = {}, b[CB] = {}, m[CB];
  for (int j = 0; j < CB; ++j) m[j] = mean[j];
  for (int64_t i = 0; i < hw; ++i) {
    const int64_t o = i * CB;
#pragma omp simd
    for (int j = 0; j < CB; ++j) {
      float g = dy[o + j];
      if (kMask) g = r[o + j] > 0.f ? g : 0.f;
      a[j] += g;
      b[j] += g * (x[o + j] - m[j]);
    }
  }
  for (int j = 0; j < CB; ++j) sdy[j] += a[j], sdyx[j] += b[j];
}

template <int CB>
void plane_bwd_sums(const float* x, const float* dy, const float* r, int64_t hw, const float* mean,
                    double* sdy, double* sdyx) {
  if (r) return plane_bwd_sums_t<CB, true>(x, dy, r, hw, mean, sdy, sdyx);
  return plane_bwd_sums_t<CB, false>(x, dy, r, hw, mean, sdy, sdyx);
}

template <int CB, bool kMask, bool kOut>
void plane_bwd_apply_t(const float* x, const float* dy, const float* r, int64_t hw,
                       const float* k0, const float* k1, const float* k2, const float* mean,
                       float* dx, float* g_out) {
  // dx = k0 * g - k1 - k2 * (x - mean), with k0 = gamma invstd, k1 = k0 sum_dy / M,
  // k2 = k0 invstd sum_dy_xhat / M.
  float a[CB], b[CB], c[CB], m[CB];
  for (int j = 0; j < CB; ++j) a[j] = k0[j], b[j] = k1[j], c[j] = k2[j], m[j] = mean[j];
  for (int64_t i = 0; i < hw; ++i) {
    const int64_t o = i * CB;
#pragma omp simd
    for (int j = 0; j < CB; ++j) {
      float g = dy[o + j];
      if (kMask) g = r[o + j] > 0.f ? g : 0.f;
      if (kOut) g_out[o + j] = g;
      dx[o + j] = a[j] * g - b[j] - c[j] * (x[o + j] - m[j]);
    }
  }
}

template <int CB>
void plane_bwd_apply(const float* x, const float* dy, const float* r, int64_t hw, const float* k0,
                     const float* k1, const float* k2, const float* mean, float* dx, float* g_out) {
  if (r) {
    if (g_out) return plane_bwd_apply_t<CB, true, true>(x, dy, r, hw, k0, k1, k2, mean, dx, g_out);
    return plane_bwd_apply_t<CB, true, false>(x, dy, r, hw, k0, k1, k2, mean, dx, g_out);
  }
  if (g_out) return plane_bwd_apply_t<CB, false, true>(x, dy, r, hw, k0, k1, k2, mean, dx, g_out);
  return plane_bwd_apply_t<CB, false, false>(x, dy, r, hw, k0, k1, k2, mean, dx, g_out);
}

}  // namespace

void batch_norm_sums(const ActShape& s, const float* x, double* sum, double* sumsq,
                     double* count) {
  ScopedOpTimer timer("bn_sums");
  check_shape(s);
  *count = static_cast<double>(s.n * s.hw());
  const int64_t hw = s.hw(), plane = hw * s.cblock;
  reduce_planes(s, sum, sumsq, [&](int64_t p, double* a, double* b) {
    const float* px = x + p * plane;
    switch (s.cblock) {
      case 16:
        return plane_sums<16>(px, hw, a, b);
      case 8:
        return plane_sums<8>(px, hw, a, b);
      case 1:
        return plane_sums_flat(px, hw, a, b);
    }
    DL_CHECK(false) << "unsupported cblock " << s.cblock;
  });
}

void batch_norm_scale_shift(int64_t c, const double* sum, const double* sumsq,
                            const double* count_ptr, const float* gamma, const float* beta,
                            float eps, float momentum, float* mean, float* invstd, float* scale,
                            float* shift, float* running_mean, float* running_var) {
  const double count = *count_ptr;
  DL_CHECK(count > 1) << "batch norm needs more than one value per channel, got " << count;
  for (int64_t i = 0; i < c; ++i) {
    const double m = sum[i] / count;
    const double var = std::max(0.0, sumsq[i] / count - m * m);
    const double is = 1.0 / std::sqrt(var + eps);
    mean[i] = static_cast<float>(m);
    invstd[i] = static_cast<float>(is);
    scale[i] = static_cast<float>(gamma[i] * is);
    shift[i] = static_cast<float>(beta[i] - m * gamma[i] * is);
    if (running_mean) {
      running_mean[i] = static_cast<float>((1.0 - momentum) * running_mean[i] + momentum * m);
      running_var[i] = static_cast<float>((1.0 - momentum) * running_var[i] +
                                          momentum * var * count / (count - 1));
    }
  }
}

void batch_norm_eval_scale_shift(int64_t c, const float* running_mean, const float* running_var,
                                 const float* gamma, const float* beta, float eps, float* scale,
                                 float* shift) {
  for (int64_t i = 0; i < c; ++i) {
    const double is = 1.0 / std::sqrt(static_cast<double>(running_var[i]) + eps);
    scale[i] = static_cast<float>(gamma[i] * is);
    shift[i] = static_cast<float>(beta[i] - running_mean[i] * gamma[i] * is);
  }
}

void batch_norm_apply(const ActShape& s, const float* x, const float* scale, const float* shift,
                      const float* residual, bool relu, float* y) {
  ScopedOpTimer timer("bn_apply");
  check_shape(s);
  const int64_t cb = s.cblock, blocks = s.c / cb, hw = s.hw(), plane = hw * cb;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < s.n * blocks; ++p) {
    const int64_t c0 = (p % blocks) * cb, o = p * plane;
    const float* res = residual ? residual + o : nullptr;
    switch (cb) {
      case 16:
        plane_apply<16>(x + o, hw, scale + c0, shift + c0, res, relu, y + o);
        break;
      case 8:
        plane_apply<8>(x + o, hw, scale + c0, shift + c0, res, relu, y + o);
        break;
      default:
        plane_apply_flat(x + o, hw, scale[c0], shift[c0], res, relu, y + o);
    }
  }
}

void batch_norm_backward_reduce(const ActShape& s, const float* x, const float* dy,
                                const float* relu_out, const float* mean, const float* invstd,
                                double* sum_dy, double* sum_dy_xhat) {
  ScopedOpTimer timer("bn_backward_reduce");
  check_shape(s);
  DL_CHECK(s.cblock == 1 || s.cblock == 8 || s.cblock == 16) << "cblock " << s.cblock;
  const int64_t hw = s.hw(), plane = hw * s.cblock;
  // Accumulate sum g * (x - mean) and scale by invstd once per channel at the end.
  reduce_planes(s, sum_dy, sum_dy_xhat, [&](int64_t p, double* a, double* b) {
    const int64_t o = p * plane, c0 = (p % (s.c / s.cblock)) * s.cblock;
    const float* r = relu_out ? relu_out + o : nullptr;
    switch (s.cblock) {
      case 16:
        return plane_bwd_sums<16>(x + o, dy + o, r, hw, mean + c0, a, b);
      case 8:
        return plane_bwd_sums<8>(x + o, dy + o, r, hw, mean + c0, a, b);
      default:
        return plane_bwd_sums<1>(x + o, dy + o, r, hw, mean + c0, a, b);
    }
  });
  for (int64_t c = 0; c < s.c; ++c) sum_dy_xhat[c] *= invstd[c];
}

void batch_norm_backward_apply(const ActShape& s, const float* x, const float* dy,
                               const float* relu_out, const float* mean, const float* invstd,
                               const float* gamma, const double* sum_dy,
                               const double* sum_dy_xhat, const double* count_ptr, float* dx,
                               float* g_out) {
  ScopedOpTimer timer("bn_backward_apply");
  check_shape(s);
  const double count = *count_ptr;
  std::vector<float> k(3 * s.c);
  for (int64_t c = 0; c < s.c; ++c) {
    const double k0 = static_cast<double>(gamma[c]) * invstd[c];
    k[c] = static_cast<float>(k0);
    k[s.c + c] = static_cast<float>(k0 * sum_dy[c] / count);
    k[2 * s.c + c] = static_cast<float>(k0 * invstd[c] * sum_dy_xhat[c] / count);
  }
  const float *k0 = k.data(), *k1 = k0 + s.c, *k2 = k1 + s.c;
  const int64_t cb = s.cblock, blocks = s.c / cb, hw = s.hw(), plane = hw * cb;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < s.n * blocks; ++p) {
    const int64_t c0 = (p % blocks) * cb, o = p * plane;
    const float* r = relu_out ? relu_out + o : nullptr;
    float* go = g_out ? g_out + o : nullptr;
    switch (cb) {
      case 16:
        plane_bwd_apply<16>(x + o, dy + o, r, hw, k0 + c0, k1 + c0, k2 + c0, mean + c0, dx + o, go);
        break;
      case 8:
        plane_bwd_apply<8>(x + o, dy + o, r, hw, k0 + c0, k1 + c0, k2 + c0, mean + c0, dx + o, go);
        break;
      default:
        plane_bwd_apply<1>(x + o, dy + o, r, hw, k0 + c0, k1 + c0, k2 + c0, mean + c0, dx + o, go);
    }
  }
}

void batch_norm_param_grads(int64_t c, const double* sum_dy, const double* sum_dy_xhat,
                            float* dgamma, float* dbeta) {
  for (int64_t i = 0; i < c; ++i) {
    dbeta[i] = static_cast<float>(sum_dy[i]);
    dgamma[i] = static_cast<float>(sum_dy_xhat[i]);
  }
}

}  // namespace dlaunch::kernels::cpu
