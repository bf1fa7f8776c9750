// Fully connected layer on OpenBLAS sgemm (row-major, PyTorch's (out, in) weight). bf16/fp16
// (op_signatures.inc): fp32 arithmetic on the already rounded inputs, then the outputs rounded.
#include <cblas.h>

#include "common/error.h"
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {

void linear_forward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                    const float* b, float* y, Dtype dtype) {
  ScopedOpTimer timer("linear");
  DL_CHECK(n > 0 && in > 0 && out > 0) << "n=" << n << " in=" << in << " out=" << out;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < out; ++j) y[i * out + j] = b ? b[j] : 0.f;
  // y (n, out) += x (n, in) * w^T (in, out)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, 1.0f, y,
              out);
  if (dtype != Dtype::kF32) round_to_dtype(n * out, dtype, y, y);
}

void linear_backward(int64_t n, int64_t in, int64_t out, const float* x, const float* w,
                     const float* dy, float* dx, float* dw, float* db, Dtype dtype) {
  ScopedOpTimer timer("linear_backward");
  DL_CHECK(n > 0 && in > 0 && out > 0) << "n=" << n << " in=" << in << " out=" << out;
  // dw (out, in) = dy^T (out, n) * x (n, in)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in, 0.0f, dw,
              in);
  if (db) {
    for (int64_t j = 0; j < out; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += dy[i * out + j];
      db[j] = static_cast<float>(acc);
    }
  }
  // dx (n, in) = dy (n, out) * w (out, in)
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in, 0.0f,
                dx, in);
  if (dtype == Dtype::kF32) return;
  round_to_dtype(out * in, dtype, dw, dw);
  if (db) round_to_dtype(out, dtype, db, db);
  if (dx) round_to_dtype(n * in, dtype, dx, dx);
}

}  // namespace dlaunch::kernels::cpu
