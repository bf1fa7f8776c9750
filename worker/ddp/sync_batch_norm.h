// SyncBN's channel to the other ranks: the model's BatchNormSync hook implemented on a process
// group. Each call is a blocking sum-allreduce on the training thread's channel, so it can run
// while gradient buckets are being reduced on the communication thread.
#pragma once

#include "worker/comm/process_group.h"
#include "worker/model/batch_norm_sync.h"

namespace dlaunch::ddp {

class ProcessGroupBatchNormSync : public model::BatchNormSync {
 public:
  explicit ProcessGroupBatchNormSync(comm::ProcessGroup& pg) : pg_(pg) {}
  void allreduce_sum(double* data, size_t count) override {
    pg_.allreduce(data, count, comm::ReduceOp::kSum);
  }

 private:
  comm::ProcessGroup& pg_;
};

}  // namespace dlaunch::ddp
