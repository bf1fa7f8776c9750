// One parameter of a model inside its flat parameter and gradient buffers.
#pragma once

#include <cstddef>
#include <string>

namespace dlaunch::model {

struct ParamInfo {
  std::string name;     // PyTorch-style, e.g. "layer2.0.downsample.1.weight"
  size_t offset = 0;    // first element in the flat buffers (params() / grads())
  size_t count = 0;     // number of elements
  bool no_weight_decay = false;  // batch norm weight/bias and linear bias: optional exemption
  bool batch_norm = false;       // a batch norm weight or bias (--bn_lr_scale applies)
};

}  // namespace dlaunch::model
