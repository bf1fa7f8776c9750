// SyncBN's channel to the other ranks: the model's BatchNormSync hook implemented on a process
// group. The buffer is in the backend's memory; the path depends on who can read it:
//   - CPU backend: the group's blocking host allreduce, in place (gloo; the training thread's
//     channel, so it runs while gradient buckets are reduced on the communication thread);
//   - a GPU under a group that reduces device memory (NCCL, distinct GPUs): allreduce_device,
//     queued on the compute stream, no host synchronisation;
//   - a GPU under a CPU group (ranks sharing one GPU, which NCCL refuses: bootstrap falls back to
//     gloo): copy to the host, reduce there, copy back. The copies synchronise with the device;
//     that transport exists to check multi-rank runs on a one-GPU machine, not for speed.
// Blocking follows the path: the first and third block until the sums are there; the second
// returns once the collective is queued. Throws what the process group throws.
#pragma once

#include <vector>

#include "kernels/backend.h"
#include "worker/comm/process_group.h"
#include "worker/model/batch_norm_sync.h"

namespace dlaunch::ddp {

class ProcessGroupBatchNormSync : public model::BatchNormSync {
 public:
  explicit ProcessGroupBatchNormSync(comm::ProcessGroup& pg,
                                     kernels::Backend& backend = kernels::cpu_backend())
      : pg_(pg), backend_(backend) {}

  void allreduce_sum(double* data, size_t count) override {
    if (backend_.host_accessible()) {
      pg_.allreduce(data, count, comm::ReduceOp::kSum);
    } else if (pg_.device_allreduce()) {
      pg_.allreduce_device(data, count, comm::ReduceOp::kSum);
    } else {
      host_.resize(count);
      backend_.copy_to_host(host_.data(), data, count * sizeof(double));
      pg_.allreduce(host_.data(), count, comm::ReduceOp::kSum);
      backend_.copy_from_host(data, host_.data(), count * sizeof(double));
    }
  }

 private:
  comm::ProcessGroup& pg_;
  kernels::Backend& backend_;
  std::vector<double> host_;  // the staged path's copy
};

}  // namespace dlaunch::ddp
