// Averages gradients across ranks while backward is still running (DDP's bucketed all-reduce).
//
// The model keeps every gradient in one flat buffer and finalises it as a growing prefix
// [0, k): the grad-ready callback reports (offset, count) in increasing offset order
// (worker/model/resnet.h). We cut the buffer into contiguous buckets of about `bucket_bytes`
// at parameter boundaries; as soon as the ready prefix covers a bucket, its allreduce (average)
// is started on the process group's communication thread, so communication of bucket i overlaps
// with the computation of the gradients in bucket i + 1. finish() starts what is left and waits
// for everything; only then may the optimizer read the gradients.
//
//   begin_step() -> on_grad_ready(...)* -> finish()      (repeat per step)
//
// Threading: every call comes from the training thread (the callback runs on the thread that
// runs backward). finish() blocks until every bucket's allreduce finished and rethrows the first
// communication failure (TimeoutError / ConnectionError). With a world of one nothing is sent.
//
// Gradients in memory the process group cannot read (a GPU's, reduced by a CPU process group)
// go through a host mirror (GradStaging): each bucket is copied to the host when it is ready
// (the copy waits for the device work that produced it) and the whole buffer is copied back in
// finish().
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "worker/comm/process_group.h"
#include "worker/model/param.h"

namespace dlaunch::ddp {

// Copies of `count` floats between the gradients' memory and the host. Both block until done.
struct GradStaging {
  std::function<void(float* host, const float* grads, size_t count)> to_host;
  std::function<void(float* grads, const float* host, size_t count)> from_host;
};

class GradReducer {
 public:
  // `params` must tile [0, total) in increasing offset order (the model's param_info()).
  // `grads` must stay valid for the reducer's lifetime. `staging`: see above; empty functions
  // mean the process group reads `grads` directly.
  GradReducer(comm::ProcessGroup& pg, float* grads, const std::vector<model::ParamInfo>& params,
              size_t bucket_bytes, GradStaging staging = {});

  void begin_step();
  // The gradient of [offset, offset + count) is final.
  void on_grad_ready(size_t offset, size_t count);
  void finish();
  // A step interrupted by a failure (the group is being re-formed): forgets its allreduces so the
  // step can be run again from begin_step(). Call after the group that ran them was destroyed
  // (ReformableProcessGroup::drop): none of them may still write into the gradients.
  void abandon_step();

  // [begin, end) element ranges of the buckets, in launch order.
  const std::vector<std::pair<size_t, size_t>>& buckets() const { return buckets_; }

 private:
  void launch_ready(size_t ready_end);

  comm::ProcessGroup& pg_;
  float* grads_;
  size_t total_ = 0;
  std::vector<std::pair<size_t, size_t>> buckets_;
  size_t next_bucket_ = 0;
  size_t ready_end_ = 0;
  std::vector<std::shared_ptr<comm::Work>> in_flight_;
  GradStaging staging_;
  std::vector<float> host_;  // the host mirror when staging
};

// Parameters and BN buffers from rank 0 to every rank (before the first step), so all replicas
// start identical whatever their seeds. Blocking.
void broadcast_from_rank0(comm::ProcessGroup& pg, float* data, size_t count);

}  // namespace dlaunch::ddp
