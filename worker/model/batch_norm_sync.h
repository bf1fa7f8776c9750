// The hook SyncBatchNorm uses to reach the other ranks. The trainer implements it on top of its
// process group; tests implement it with threads. nullptr means local (plain) batch norm.
//
// Per BN layer and step the model calls allreduce_sum exactly twice, in the same order on every
// rank (so ranks must run the same model on the same number of layers):
//   forward:  [sum(C), sum_of_squares(C), count(1)]            2C + 1 floats
//   backward: [sum_dy(C), sum_dy_xhat(C)]                       2C floats
// It must sum elementwise over all ranks, in place, and block until the result is there.
// Exceptions it throws propagate out of ResNet::forward/backward.
#pragma once

#include <cstddef>

namespace dlaunch {

class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  virtual void allreduce_sum(float* data, size_t count) = 0;
};

}  // namespace dlaunch
