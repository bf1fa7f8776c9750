// The compute precision of dtrain (--precision) and the rounding that defines it, shared by the
// CPU and the CUDA code (this header compiles as C++ and as CUDA: the CUDA rounding kernel and
// the CPU loop call the same functions, so both devices round every value identically).
//
// Mixed precision here is "fp32 storage, low-precision values": tensors stay float, and at the
// points where a low-precision trainer stores a value (conv/GEMM inputs and outputs, activations
// and their gradients; see worker/model/resnet.cc) the value is rounded to the nearest bf16 or
// fp16 number. Rounding is IEEE round-to-nearest-even, like a hardware float -> bf16/fp16
// conversion (__float2bfloat16_rn, __float2half_rn, PyTorch's .to(dtype)); fp16 overflows to
// +-inf (so the loss scaler sees the overflow a real fp16 tensor would have), keeps subnormals
// (down to 2^-24), and NaN stays NaN. Master weights, BN statistics, the loss and the optimizer
// stay fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#if defined(__CUDACC__)
#define DL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DL_HOST_DEVICE inline
#endif

namespace dlaunch::kernels {

enum class Dtype : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// "fp32", "bf16", "fp16": the --precision spellings.
inline const char* dtype_name(Dtype d) {
  return d == Dtype::kBF16 ? "bf16" : d == Dtype::kF16 ? "fp16" : "fp32";
}
// The Dtype of a --precision spelling; false when `name` is none of them.
inline bool parse_dtype(const std::string& name, Dtype* out) {
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    if (name == dtype_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

namespace detail {
DL_HOST_DEVICE uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
DL_HOST_DEVICE float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

// x rounded to the nearest bfloat16 (8 exponent bits, 7 mantissa bits), ties to even. Values
// past bf16's largest finite number round to +-inf like the hardware conversion.
DL_HOST_DEVICE float round_to_bf16(float x) {
  uint32_t u = detail::float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN: keep it (adding would change its class)
  u += 0x7fffu + ((u >> 16) & 1u);  // carries into the exponent when rounding up
  return detail::bits_float(u & 0xffff0000u);
}

// x rounded to the nearest IEEE binary16 (5 exponent bits, 10 mantissa bits), ties to even:
// |x| >= 65520 (halfway between 65504 and 65536) becomes +-inf; below 2^-14 the result is a
// subnormal, a multiple of 2^-24.
DL_HOST_DEVICE float round_to_f16(float x) {
  const uint32_t u = detail::float_bits(x);
  const uint32_t sign = u & 0x80000000u;
  uint32_t a = u ^ sign;
  if (a >= 0x7f800000u) return x;                    // inf or NaN
  if (a >= 0x477ff000u) return detail::bits_float(sign | 0x7f800000u);  // overflow -> inf
  if (a < 0x38800000u) {
    // Subnormal range: 0.5f has an ulp of 2^-24, the fp16 subnormal step, so the float addition
    // rounds |x| to that step with the FPU's round-to-nearest-even; the subtraction is exact.
    // (IEEE arithmetic: nothing here is built with -ffast-math, which could fold the two.)
    a = detail::float_bits((detail::bits_float(a) + 0.5f) - 0.5f);
  } else {
    a += 0xfffu + ((a >> 13) & 1u);  // 23 -> 10 mantissa bits, ties to even
    a &= 0xffffe000u;
  }
  return detail::bits_float(sign | a);
}

// x as `d` would store it (fp32: x itself).
DL_HOST_DEVICE float round_to_dtype(Dtype d, float x) {
  return d == Dtype::kBF16 ? round_to_bf16(x) : d == Dtype::kF16 ? round_to_f16(x) : x;
}

// The 16-bit encodings, for the CUDA tensor-core paths that hand real bf16/fp16 buffers to
// cuDNN and cuBLAS (kernels/cuda/precision.cu). Written here rather than with the CUDA
// conversion intrinsics so that the CPU tests check them (every one of the 65536 codes): the
// bits of x are those of round_to_*(x), so narrowing rounds exactly as the emulation does, and
// widening is exact.

// The bfloat16 code of x: the top half of round_to_bf16(x). NaN becomes the quiet NaN 0x7fc0
// (a NaN whose payload sits in the low half only would otherwise turn into inf).
DL_HOST_DEVICE uint16_t bf16_bits(float x) {
  const uint32_t u = detail::float_bits(round_to_bf16(x));
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  return static_cast<uint16_t>(u >> 16);
}
DL_HOST_DEVICE float bf16_value(uint16_t b) { return detail::bits_float(uint32_t(b) << 16); }

// The IEEE binary16 code of x (of round_to_f16(x)): sign, 5 exponent bits biased by 15, 10
// mantissa bits; exponent 0 holds the subnormals (multiples of 2^-24), 31 inf and NaN.
DL_HOST_DEVICE uint16_t f16_bits(float x) {
  const uint32_t u = detail::float_bits(round_to_f16(x));
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // inf
  const int exponent = int(a >> 23) - 127;
  if (exponent >= -14)  // normal: rounding left at most 10 mantissa bits
    return static_cast<uint16_t>(sign | uint32_t(exponent + 15) << 10 | (a >> 13 & 0x3ffu));
  // Subnormal or zero: an exact multiple of 2^-24 below 2^-14, so the product is an integer < 1024.
  return static_cast<uint16_t>(sign | uint32_t(detail::bits_float(a) * 16777216.0f));
}
DL_HOST_DEVICE float f16_value(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return detail::bits_float(sign | 0x7f800000u | mantissa << 13);
  if (exponent == 0) {  // subnormal or zero: mantissa * 2^-24, exact in float
    const float magnitude = float(mantissa) * (1.0f / 16777216.0f);
    return detail::bits_float(sign | detail::float_bits(magnitude));
  }
  return detail::bits_float(sign | (exponent + 112) << 23 | mantissa << 13);  // 112 = 127 - 15
}

// The code of x in `d` (bf16 or fp16) and back.
DL_HOST_DEVICE uint16_t dtype_bits(Dtype d, float x) {
  return d == Dtype::kBF16 ? bf16_bits(x) : f16_bits(x);
}
DL_HOST_DEVICE float dtype_value(Dtype d, uint16_t bits) {
  return d == Dtype::kBF16 ? bf16_value(bits) : f16_value(bits);
}

}  // namespace dlaunch::kernels
