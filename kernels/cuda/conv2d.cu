// Convolutions on cuDNN (NCHW). Descriptors and the algorithm choice (cuDNN's heuristics, first
// algorithm whose workspace fits kMaxWorkspace) are cached per shape and dtype; the workspace is
// the calling thread's grow-only buffer.
//
// fp32: float tensors with FMA math (no TF32), so results match the CPU ops. bf16/fp16 (the
// mixed-precision dtype, op_signatures.inc): cuDNN's "pseudo" 16-bit configuration, 16-bit x, w
// and y with a float compute type, on tensor cores (CUDNN_TENSOR_OP_MATH); the operands are
// narrowed into scratch and the 16-bit output, rounded by cuDNN from its fp32 accumulator, is
// widened back (low_precision.cuh).
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/shape_key.h"

namespace dlaunch::kernels::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;

using Key = ShapeKey<9>;

struct Conv {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

std::unique_ptr<Conv> create(const ConvShape& s, Dtype dtype) {
  DL_CHECK(s.in_cblock == 1 && s.out_cblock == 1)
      << "CUDA convolutions need NCHW activations (cblock 1), got " << s.in_cblock << "/" << s.out_cblock;
  const cudnnDataType_t data = detail::cudnn_type(dtype);
  auto c = std::make_unique<Conv>();
  DL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->x));
  DL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->y));
  DL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&c->w));
  DL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c->conv));
  DL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, data, int(s.n),
                                            int(s.c_in), int(s.h_in), int(s.w_in)));
  DL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, data, int(s.n),
                                            int(s.c_out), int(s.h_out()), int(s.w_out())));
  DL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(c->w, data, CUDNN_TENSOR_NCHW, int(s.c_out),
                                            int(s.c_in), int(s.kernel), int(s.kernel)));
  // Cross-correlation, like PyTorch and oneDNN, accumulated in float for every dtype. fp32: TF32
  // off so results match the CPU ops; bf16/fp16: tensor cores.
  DL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c->conv, int(s.pad), int(s.pad), int(s.stride),
                                                 int(s.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  DL_CUDNN_CHECK(cudnnSetConvolutionMathType(
      c->conv, dtype == Dtype::kF32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  cudnnHandle_t h = detail::cudnn();
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[8];
  DL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c->x, c->w, c->conv, c->y, 8, &found, fwd));
  bool ok = false;
  for (int i = 0; i < found && !ok; ++i)
    if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].memory <= kMaxWorkspace)
      c->fwd = fwd[i].algo, c->fwd_ws = fwd[i].memory, ok = true;
  DL_CHECK(ok) << "no cuDNN forward algorithm for this convolution in " << dtype_name(dtype);
  cudnnConvolutionBwdDataAlgoPerf_t bd[8];
  DL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c->w, c->y, c->conv, c->x, 8, &found, bd));
  ok = false;
  for (int i = 0; i < found && !ok; ++i)
    if (bd[i].status == CUDNN_STATUS_SUCCESS && bd[i].memory <= kMaxWorkspace)
      c->bwd_data = bd[i].algo, c->bwd_data_ws = bd[i].memory, ok = true;
  DL_CHECK(ok) << "no cuDNN backward-data algorithm for this convolution in " << dtype_name(dtype);
  cudnnConvolutionBwdFilterAlgoPerf_t bf[8];
  DL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c->x, c->y, c->conv, c->w, 8, &found, bf));
  ok = false;
  for (int i = 0; i < found && !ok; ++i)
    if (bf[i].status == CUDNN_STATUS_SUCCESS && bf[i].memory <= kMaxWorkspace)
      c->bwd_filter = bf[i].algo, c->bwd_filter_ws = bf[i].memory, ok = true;
  DL_CHECK(ok) << "no cuDNN backward-filter algorithm for this convolution in "
               << dtype_name(dtype);
  return c;
}

Conv& get(const ConvShape& s, Dtype dtype) {
  static std::mutex mu;
  static std::unordered_map<Key, std::unique_ptr<Conv>, ShapeKeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[Key{{s.n, s.c_in, s.h_in, s.w_in, s.c_out, s.kernel, s.stride, s.pad,
                          static_cast<int64_t>(dtype)}}];
  if (!slot) slot = create(s, dtype);
  return *slot;
}

}  // namespace

// Each pass: its operands in the dtype (fp32: the pointers as they are), the cuDNN call, then the
// 16-bit output widened back (fp32: nothing).
void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y, Dtype dtype) {
  Conv& c = get(s, dtype);
  const float one = 1.f, zero = 0.f;
  detail::CallOperands io(dtype);
  const void* x_in = io.in(x, s.in().numel());
  const void* w_in = io.in(w, s.weight_numel());
  void* y_out = io.out(y, s.out().numel());
  void* ws = c.fwd_ws ? detail::workspace(c.fwd_ws) : nullptr;
  DL_CUDNN_CHECK(cudnnConvolutionForward(detail::cudnn(), &one, c.x, x_in, c.w, w_in, c.conv, c.fwd,
                                         ws, c.fwd_ws, &zero, c.y, y_out));
  io.finish();
}

void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx,
                          bool accumulate, Dtype dtype) {
  Conv& c = get(s, dtype);
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  detail::CallOperands io(dtype);
  const void* w_in = io.in(w, s.weight_numel());
  const void* dy_in = io.in(dy, s.out().numel());
  // Accumulating, cuDNN adds to dx's own (narrowed) values and rounds the sum once.
  void* dx_out = io.out(dx, s.in().numel(), /*reads_y=*/accumulate);
  void* ws = c.bwd_data_ws ? detail::workspace(c.bwd_data_ws) : nullptr;
  DL_CUDNN_CHECK(cudnnConvolutionBackwardData(detail::cudnn(), &one, c.w, w_in, c.y, dy_in, c.conv,
                                              c.bwd_data, ws, c.bwd_data_ws, &beta, c.x, dx_out));
  io.finish();
}

void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                             Dtype dtype) {
  Conv& c = get(s, dtype);
  const float one = 1.f, zero = 0.f;
  detail::CallOperands io(dtype);
  const void* x_in = io.in(x, s.in().numel());
  const void* dy_in = io.in(dy, s.out().numel());
  void* dw_out = io.out(dw, s.weight_numel());
  void* ws = c.bwd_filter_ws ? detail::workspace(c.bwd_filter_ws) : nullptr;
  DL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(detail::cudnn(), &one, c.x, x_in, c.y, dy_in,
                                                c.conv, c.bwd_filter, ws, c.bwd_filter_ws, &zero,
                                                c.w, dw_out));
  io.finish();
}

}  // namespace dlaunch::kernels::cuda
