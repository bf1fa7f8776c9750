// The hook SyncBatchNorm uses to reach the other ranks. The trainer implements it on top of its
// process group (worker/ddp/sync_batch_norm.h); tests implement it with threads. nullptr means
// local (plain) batch norm.
//
// Per BN layer and step the model calls allreduce_sum exactly twice, in the same order on every
// rank (so ranks must run the same model on the same number of layers):
//   forward:  [sum(C), sum_of_squares(C), count(1)]            2C + 1 doubles
//   backward: [sum_dy(C), sum_dy_xhat(C)]                       2C doubles
// `data` is in the memory of the layer's backend (device memory on a GPU), written by the ops
// queued before the call and read by those queued after it. It must sum elementwise over all
// ranks, in place, so that those later ops see the sums: a CPU implementation blocks until they
// are there; a device one may only queue the collective in the backend's order and return.
// The count travels with the sums, so ranks may hold different numbers of images.
// Doubles, not floats: the variance is E[x^2] - E[x]^2, a difference of two large sums when the
// mean is large against the spread; rounding either sum to float first (24-bit mantissa) loses
// the variance entirely (e.g. mean 1000, std 0.01), and a float count is inexact past 2^24.
// Exceptions it throws propagate out of ResNet::forward/backward.
#pragma once

#include <cstddef>

namespace dlaunch::model {

class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  virtual void allreduce_sum(double* data, size_t count) = 0;
};

}  // namespace dlaunch::model
