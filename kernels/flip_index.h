// Where an element of a left-right mirrored activation comes from, shared by the CPU loop
// (cpu/flip.cc) and the CUDA kernel (cuda/flip.cu) of the flip_horizontal op.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"  // DL_HOST_DEVICE

namespace dlaunch::kernels {

// Flat index i of an activation of width w in layout cblock (ops.h: cblock channels innermost,
// then the pixel's column): the flat index of the same channel in the mirrored column, same row.
DL_HOST_DEVICE int64_t mirrored_index(int64_t i, int64_t w, int64_t cblock) {
  const int64_t pixel = i / cblock, col = pixel % w;
  return (pixel - col + (w - 1 - col)) * cblock + i % cblock;
}

}  // namespace dlaunch::kernels
