// Convolutions on cuDNN (NCHW float). Descriptors and the algorithm choice (cuDNN's heuristics,
// first algorithm whose workspace fits kMaxWorkspace) are cached per shape; the workspace is the
// calling thread's grow-only buffer.
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/shape_key.h"

namespace dlaunch::kernels::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;

using Key = ShapeKey<8>;

struct Conv {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

std::unique_ptr<Conv> create(const ConvShape& s) {
  DL_CHECK(s.in_cblock == 1 && s.out_cblock == 1)
      << "CUDA convolutions need NCHW activations (cblock 1), got " << s.in_cblock << "/" << s.out_cblock;
  auto c = std::make_unique<Conv>();
  DL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->x));
  DL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->y));
  DL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&c->w));
  DL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c->conv));
  DL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n),
                                            int(s.c_in), int(s.h_in), int(s.w_in)));
  DL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n),
                                            int(s.c_out), int(s.h_out()), int(s.w_out())));
  DL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(c->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(s.c_out),
                                            int(s.c_in), int(s.kernel), int(s.kernel)));
  // Cross-correlation, like PyTorch and oneDNN; TF32 off so results match the CPU ops.
  DL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c->conv, int(s.pad), int(s.pad), int(s.stride),
                                                 int(s.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  DL_CUDNN_CHECK(cudnnSetConvolutionMathType(c->conv, CUDNN_FMA_MATH));
  cudnnHandle_t h = detail::cudnn();
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[8];
  DL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c->x, c->w, c->conv, c->y, 8, &found, fwd));
  bool ok = false;
  for (int i = 0; i < found && !ok; ++i)
    if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].memory <= kMaxWorkspace)
      c->fwd = fwd[i].algo, c->fwd_ws = fwd[i].memory, ok = true;
  DL_CHECK(ok) << "no cuDNN forward algorithm for this convolution";
  cudnnConvolutionBwdDataAlgoPerf_t bd[8];
  DL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c->w, c->y, c->conv, c->x, 8, &found, bd));
  ok = false;
  for (int i = 0; i < found && !ok; ++i)
    if (bd[i].status == CUDNN_STATUS_SUCCESS && bd[i].memory <= kMaxWorkspace)
      c->bwd_data = bd[i].algo, c->bwd_data_ws = bd[i].memory, ok = true;
  DL_CHECK(ok) << "no cuDNN backward-data algorithm for this convolution";
  cudnnConvolutionBwdFilterAlgoPerf_t bf[8];
  DL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c->x, c->y, c->conv, c->w, 8, &found, bf));
  ok = false;
  for (int i = 0; i < found && !ok; ++i)
    if (bf[i].status == CUDNN_STATUS_SUCCESS && bf[i].memory <= kMaxWorkspace)
      c->bwd_filter = bf[i].algo, c->bwd_filter_ws = bf[i].memory, ok = true;
  DL_CHECK(ok) << "no cuDNN backward-filter algorithm for this convolution";
  return c;
}

Conv& get(const ConvShape& s) {
  static std::mutex mu;
  static std::unordered_map<Key, std::unique_ptr<Conv>, ShapeKeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[Key{{s.n, s.c_in, s.h_in, s.w_in, s.c_out, s.kernel, s.stride, s.pad}}];
  if (!slot) slot = create(s);
  return *slot;
}

}  // namespace

void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y) {
  Conv& c = get(s);
  const float one = 1.f, zero = 0.f;
  void* ws = c.fwd_ws ? detail::workspace(c.fwd_ws) : nullptr;
  DL_CUDNN_CHECK(cudnnConvolutionForward(detail::cudnn(), &one, c.x, x, c.w, w, c.conv, c.fwd, ws,
                                         c.fwd_ws, &zero, c.y, y));
}

void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx,
                          bool accumulate) {
  Conv& c = get(s);
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  void* ws = c.bwd_data_ws ? detail::workspace(c.bwd_data_ws) : nullptr;
  DL_CUDNN_CHECK(cudnnConvolutionBackwardData(detail::cudnn(), &one, c.w, w, c.y, dy, c.conv,
                                              c.bwd_data, ws, c.bwd_data_ws, &beta, c.x, dx));
}

void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw) {
  Conv& c = get(s);
  const float one = 1.f, zero = 0.f;
  void* ws = c.bwd_filter_ws ? detail::workspace(c.bwd_filter_ws) : nullptr;
  DL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(detail::cudnn(), &one, c.x, x, c.y, dy, c.conv,
                                                c.bwd_filter, ws, c.bwd_filter_ws, &zero, c.w, dw));
}

}  // namespace dlaunch::kernels::cuda
