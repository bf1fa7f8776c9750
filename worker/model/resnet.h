// ResNet-18/34 with the CIFAR stem (3x3 conv stride 1, no max-pool: small images) or torchvision's
// ImageNet stem (7x7 conv stride 2 pad 3, BN, ReLU, 3x3 max-pool stride 2 pad 1), BasicBlocks with
// widths w, 2w, 4w, 8w, global average pooling and a linear classifier; initialised like
// torchvision (Kaiming-normal fan_out/relu convs, BN weight 1 bias 0, PyTorch's default Linear
// init), deterministically from the seed. MNIST works with in_channels 1 (any H, W >= 8 works:
// the net is fully convolutional up to the global pool).
//
// Parameters and gradients live in two flat float buffers (params(), grads()) so the trainer can
// broadcast, all-reduce and step them as single arrays. The layout is the REVERSE of PyTorch's
// named_parameters() order: offset 0 holds fc.bias, then fc.weight, ..., and the stem conv
// (conv1.weight) comes last. backward() finalises gradients in exactly that order, so the
// finished region is always a prefix [0, k) of grads() that grows as backward runs; the grad-ready
// callback is called once per parameter, in increasing offset order, as soon as its gradient is
// final (this is what lets DDP reduce bucket i while backward computes bucket i + 1).
// Conv weights are OIHW, linear weight (out, in): the same shapes as PyTorch, names as
// torchvision ("layer1.0.conv1.weight", "layer2.0.downsample.1.bias", "fc.weight", ...).
//
// Batch norm buffers (running_mean, running_var per BN layer, in forward order) are returned by
// buffers() for checkpoints and for the broadcast from rank 0; num_batches_tracked is not kept
// (momentum is fixed at 0.1, so PyTorch never reads it).
//
// Device: everything the model holds (parameters, gradients, BN buffers, activations) lives on
// the kernels::Backend given at construction, and forward/backward run its ops; params(),
// grads() and buffers() point into its memory (host memory on the CPU backend; on a GPU use
// Tensor::to_host/copy_from_host, e.g. params_tensor()). forward() accepts images on the host
// or on the model's backend.
//
// Threading: not thread-safe; on the CPU, forward/backward run on the calling thread plus the
// kernels' OpenMP team (kernels::set_host_threads); on a GPU they queue work and return (a
// backward's gradients are final for the host after a copy to it or Backend::synchronize). With
// SyncBN they also block in BatchNormSync::allreduce_sum and rethrow what it throws. Shape
// errors throw InternalError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "worker/model/batch_norm_sync.h"
#include "worker/model/param.h"
#include "worker/tensor.h"

namespace dlaunch::model {

// The first layer: kCifar keeps the input resolution (32x32 images), kImageNet divides it by 4
// before layer1 (torchvision's resnet18 for 224x224 images).
enum class ResNetStem { kCifar, kImageNet };
// "cifar" | "imagenet": --stem's values, and what checkpoints record.
inline const char* stem_name(ResNetStem s) {
  return s == ResNetStem::kImageNet ? "imagenet" : "cifar";
}

struct ResNetConfig {
  int depth = 18;  // 18 | 34
  int width = 64;  // channels of the stem and layer1; layers 2-4 use 2w, 4w, 8w
  int in_channels = 3;
  int num_classes = 10;
  int image_size = 32;  // informational (checkpoint metadata); any H, W >= 8 is accepted
  // --precision: bf16/fp16 round the conv/GEMM inputs and outputs, the activations and their
  // gradients to that type where a low-precision trainer stores them (kernels/dtype.h); master
  // weights, BN statistics and parameters, and the loss stay fp32.
  kernels::Dtype precision = kernels::Dtype::kF32;
  ResNetStem stem = ResNetStem::kCifar;
};

class ResNet {
 public:
  // Throws UsageError for a depth other than 18 or 34 or a non-positive width/channels/classes.
  ResNet(const ResNetConfig& config, uint64_t seed,
         kernels::Backend& backend = kernels::cpu_backend());
  ~ResNet();
  ResNet(const ResNet&) = delete;
  ResNet& operator=(const ResNet&) = delete;

  // images: (N, in_channels, H, W), NCHW. Returns the logits (N, num_classes), valid until the
  // next forward. training = true uses batch statistics (synced when a BatchNormSync is set),
  // updates the running statistics and keeps what backward needs; false uses running statistics.
  const Tensor& forward(const Tensor& images, bool training);
  // grad_logits: (N, num_classes), d(loss)/d(logits) for the batch of the last training forward.
  // OVERWRITES grads() (no accumulation) and calls the grad-ready callback per parameter.
  void backward(const Tensor& grad_logits);

  float* params();
  const float* params() const;
  float* grads();
  const float* grads() const;
  // The flat parameter buffer as a tensor (for copies to and from the host).
  Tensor& params_tensor();
  const Tensor& params_tensor() const;
  size_t num_params() const;
  const std::vector<ParamInfo>& param_info() const;
  // BN running statistics in forward order: bn.running_mean, bn.running_var, ...
  std::vector<Tensor*> buffers();
  std::vector<std::string> buffer_names() const;

  // nullptr = local batch norm. The object must outlive its use by forward/backward.
  void set_batchnorm_sync(BatchNormSync* sync);
  // fn(offset, count) is called on the thread running backward(); keep it short (enqueue work).
  void set_grad_ready_callback(std::function<void(size_t offset, size_t count)> fn);
  // fn() is called before each residual block of a training forward (not in evaluation); it may
  // throw to abandon the pass (the BN running statistics are then partly updated, and the
  // caller restores them). The training thread's way to stop a step another thread learned is
  // lost (a peer rank being replaced) without waiting for the step's end.
  void set_layer_check(std::function<void()> fn);
  void zero_grad();

  const ResNetConfig& config() const;
  kernels::Backend& backend() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch::model
