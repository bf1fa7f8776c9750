// One data-parallel replica: a ResNet whose gradients are averaged across the process group
// while backward runs (GradReducer) and whose batch norms are optionally synchronised
// (SyncBN). Equivalent to PyTorch's DistributedDataParallel(model) with broadcast_buffers=True:
// replicas start from rank 0's parameters and buffers, and the BN running statistics used for
// eval and checkpoints are rank 0's (broadcast_buffers() before use; without SyncBN each rank's
// own statistics drift apart between broadcasts, exactly as rank 0's win in PyTorch).
//
// Blocking: every method is collective (all ranks call it in the same order) and blocks until
// the communication it needs is done; failures throw what the process group throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "worker/comm/process_group.h"
#include "worker/ddp/grad_reducer.h"
#include "worker/ddp/sync_batch_norm.h"
#include "worker/model/resnet.h"

namespace dlaunch::ddp {

struct StepResult {
  float loss = 0;   // this rank's mean loss over its batch
  int correct = 0;  // this rank's correctly classified images
};

// Rank 0's values of `t` on every rank (collective), through the host when the backend's memory
// is not host memory and the process group reads only host memory. Also for tensors the model
// does not hold (the trainer's --ema statistics).
void broadcast_tensor(comm::ProcessGroup& pg, Tensor& t);

class DataParallel {
 public:
  static constexpr size_t kDefaultBucketBytes = 1 << 20;

  DataParallel(model::ResNet& model, comm::ProcessGroup& pg, bool sync_bn,
               size_t bucket_bytes = kDefaultBucketBytes);
  ~DataParallel();

  // Parameters and BN buffers from rank 0.
  void broadcast_state();
  // BN running statistics from rank 0.
  void broadcast_buffers();
  // Forward, loss, backward with the bucketed allreduce; on return grads() hold the average
  // over ranks of each rank's mean-loss gradient, times loss_scale (fp16's loss scaling:
  // train/precision.h unscales them).
  StepResult train_step(const Tensor& images, const int32_t* labels, float loss_scale = 1.0f);
  // train_step with the step's figures kept in the backend's memory: [mean loss * n, correct, n]
  // added to each of the k triples at `sums` (kernels' softmax_cross_entropy_sums; the trainer's
  // train/step_sums.h), so nothing in the step waits for the device on the loss' account.
  void train_step_into(const Tensor& images, const int32_t* labels, float loss_scale,
                       double* sums, int64_t k);
  // Forward in eval mode; returns the summed loss over the batch. With flip TTA on, the loss
  // and accuracy are those of the averaged logits of the images and their mirror images.
  StepResult eval_step(const Tensor& images, const int32_t* labels);

  // Label smoothing for train_step's loss (softmax_cross_entropy's label_smoothing; eval_step
  // keeps the plain loss). Throws UsageError outside [0, 1).
  void set_label_smoothing(float eps);
  // --tta flip: eval_step classifies with flip_tta_logits (model/tta.h).
  void set_tta_flip(bool on) { tta_flip_ = on; }

  const GradReducer& reducer() const { return reducer_; }
  // A train step that threw (a peer died; the group was dropped): ready for the step again.
  void abandon_step() { reducer_.abandon_step(); }
  // check() is called during train steps, between the forward's residual blocks and before each
  // gradient is handed to the all-reduce; it may throw to abandon the step (the caller then
  // drops the group and calls abandon_step, as after a failed collective). Empty: none.
  void set_interrupt_check(std::function<void()> check);

 private:
  // Forward, `loss` (which fills grad_logits_), loss scaling, backward with the allreduce.
  template <typename Loss>
  void step(const Tensor& images, float loss_scale, Loss loss);

  model::ResNet& model_;
  comm::ProcessGroup& pg_;
  GradReducer reducer_;
  std::unique_ptr<ProcessGroupBatchNormSync> bn_sync_;
  Tensor grad_logits_;
  float label_smoothing_ = 0;
  bool tta_flip_ = false;
  std::function<void()> interrupt_check_;
};

}  // namespace dlaunch::ddp
