#include "worker/ddp/data_parallel.h"

#include <fmt/format.h>

#include "common/error.h"
#include "worker/model/loss.h"
#include "worker/model/tta.h"

namespace dlaunch::ddp {

namespace {

// How gradients on a device reach a process group that reads only host memory (grad_reducer.h).
// NCCL reads the device's memory itself.
GradStaging staging_for(kernels::Backend& be, const comm::ProcessGroup& pg) {
  if (be.host_accessible() || pg.backend() == "nccl") return {};
  return {[&be](float* host, const float* grads, size_t n) {
            be.copy_to_host(host, grads, n * sizeof(float));
          },
          [&be](float* grads, const float* host, size_t n) {
            be.copy_from_host(grads, host, n * sizeof(float));
          }};
}

}  // namespace

void broadcast_tensor(comm::ProcessGroup& pg, Tensor& t) {
  if (pg.size() == 1) return;
  if (t.backend().host_accessible() || pg.backend() == "nccl") {
    broadcast_from_rank0(pg, t.data(), static_cast<size_t>(t.numel()));
    return;
  }
  std::vector<float> host = t.to_host();
  broadcast_from_rank0(pg, host.data(), host.size());
  t.copy_from_host(host.data());
}

DataParallel::DataParallel(model::ResNet& model, comm::ProcessGroup& pg, bool sync_bn,
                           size_t bucket_bytes)
    : model_(model),
      pg_(pg),
      reducer_(pg, model.grads(), model.param_info(), bucket_bytes, staging_for(model.backend(), pg)) {
  if (sync_bn && pg.size() > 1) {
    bn_sync_ = std::make_unique<ProcessGroupBatchNormSync>(pg, model.backend());
    model_.set_batchnorm_sync(bn_sync_.get());
  }
  model_.set_grad_ready_callback([this](size_t offset, size_t count) {
    if (interrupt_check_) interrupt_check_();
    reducer_.on_grad_ready(offset, count);
  });
}

DataParallel::~DataParallel() {
  model_.set_batchnorm_sync(nullptr);
  model_.set_grad_ready_callback(nullptr);
  model_.set_layer_check(nullptr);
}

void DataParallel::set_interrupt_check(std::function<void()> check) {
  interrupt_check_ = check;
  model_.set_layer_check(std::move(check));
}

void DataParallel::broadcast_state() {
  broadcast_tensor(pg_, model_.params_tensor());
  broadcast_buffers();
}

void DataParallel::broadcast_buffers() {
  if (pg_.size() == 1) return;
  for (Tensor* t : model_.buffers()) broadcast_tensor(pg_, *t);
}

void DataParallel::set_label_smoothing(float eps) {
  if (!(eps >= 0.0f && eps < 1.0f))
    throw UsageError(fmt::format("label smoothing {} is outside [0, 1); expected e.g. 0.1", eps));
  label_smoothing_ = eps;
}

template <typename Loss>
void DataParallel::step(const Tensor& images, float loss_scale, Loss loss) {
  const Tensor& logits = model_.forward(images, /*training=*/true);
  loss(logits);
  if (loss_scale != 1.0f) {
    model_.backend().scale(grad_logits_.numel(), loss_scale, grad_logits_.data(), grad_logits_.data());
  }
  reducer_.begin_step();
  model_.backward(grad_logits_);
  reducer_.finish();
}

StepResult DataParallel::train_step(const Tensor& images, const int32_t* labels, float loss_scale) {
  StepResult r;
  step(images, loss_scale, [&](const Tensor& logits) {
    r.loss = model::softmax_cross_entropy(logits, labels, &grad_logits_, &r.correct, label_smoothing_);
  });
  return r;
}

void DataParallel::train_step_into(const Tensor& images, const int32_t* labels, float loss_scale,
                                   double* sums, int64_t k) {
  step(images, loss_scale, [&](const Tensor& logits) {
    model::softmax_cross_entropy_sums(logits, labels, grad_logits_, label_smoothing_, sums, k);
  });
}

StepResult DataParallel::eval_step(const Tensor& images, const int32_t* labels) {
  StepResult r;
  Tensor averaged;
  if (tta_flip_) averaged = model::flip_tta_logits(model_, images);
  const Tensor& logits = tta_flip_ ? averaged : model_.forward(images, /*training=*/false);
  r.loss = model::softmax_cross_entropy(logits, labels, nullptr, &r.correct) *
           static_cast<float>(images.dim(0));
  return r;
}

}  // namespace dlaunch::ddp
