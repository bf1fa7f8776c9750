// One element of the exponential moving average of the weights (dtrain --ema), shared by the CPU
// loop (cpu/ema.cc) and the CUDA kernel (cuda/ema.cu), so both devices average identically.
#pragma once

#include "kernels/dtype.h"  // DL_HOST_DEVICE

namespace dlaunch::kernels {

// avg = decay * avg + (1 - decay) * x: timm's ModelEmaV2 update, in this operation order.
DL_HOST_DEVICE void ema_update_element(float& avg, float x, float decay) {
  avg = decay * avg + (1.f - decay) * x;
}

}  // namespace dlaunch::kernels
