// ResNet forward/backward over the ops of its kernels::Backend. Activations stay in the layout
// the backend's convolutions prefer (Backend::preferred_cblock of the width, the same block for
// every layer: oneDNN's channel-blocked layout on the CPU, NCHW on CUDA) from the stem's output
// to the global pool, so no activation is ever reordered; only the input images are NCHW.
//
// Per residual block (BasicBlock):
//   z1 = conv1(x); a1 = relu(bn1(z1)); z2 = conv2(a1)
//   s  = downsample ? bnd(convd(x)) : x;  y = relu(bn2(z2) + s)     (bn2+add+relu in one pass)
// Backward walks the blocks in reverse and, inside a block, finishes the downsample branch
// before the main one, so gradients complete in the reverse of named_parameters() order, which
// is the flat buffer's layout (see resnet.h).
//
// Mixed precision (ResNetConfig::precision bf16|fp16) is torch.autocast's recipe on fp32 storage:
// the convolutions and the classifier read a rounded copy of the weights (low_params) and
// rounded inputs, and every value a low-precision trainer would store is rounded where it is
// written: the conv and linear ops are given the precision and round their own outputs (conv
// outputs, logits; the gradients of activations and of conv/linear weights), which lets CUDA
// run them on tensor cores (op_signatures.inc); store() rounds the rest (BN/ReLU outputs, the
// pooled features, the BN and pooling gradients). BN runs on those values with fp32 parameters
// and double sums, and its parameter gradients stay fp32, as in autocast. fp32 skips all of it
// (no extra op, no copy).
#include "worker/model/resnet.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/backend.h"
#include "worker/model/batch_norm.h"

namespace dlaunch::model {

using kernels::ActShape;
using kernels::ConvShape;

namespace {

// Deterministic, platform-independent random numbers for initialisation (std::normal_distribution
// differs between standard libraries; checkpoints and tests need the same init everywhere).
class InitRng {
 public:
  explicit InitRng(uint64_t seed) : state_(seed ^ 0x9E3779B97F4A7C15ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace

struct ResNet::Impl {
  struct Param {
    std::string name;
    size_t count = 0;
    size_t offset = 0;
    bool no_decay = false;
    bool batch_norm = false;
  };
  struct Conv {
    int64_t c_in = 0, c_out = 0, kernel = 3, stride = 1, pad = 1;
    int in_cblock = 1, out_cblock = 1;
    int param = -1;
    Tensor out;  // z
    ConvShape shape(const ActShape& in) const {
      DL_CHECK(in.c == c_in && in.cblock == in_cblock)
          << "conv expects " << c_in << " channels (block " << in_cblock << "), got " << in.c
          << " (block " << in.cblock << ")";
      return ConvShape{in.n, c_in, in.h, in.w, c_out, kernel, stride, pad, in_cblock, out_cblock};
    }
  };
  struct Bn {
    Bn(int64_t c, kernels::Backend& backend) : layer(c, backend), out(backend) {}
    BatchNorm2d layer;
    int weight = -1, bias = -1;
    Tensor out;  // y (post-ReLU where fused)
  };
  struct Block {
    Conv conv1, conv2, convd;
    std::unique_ptr<Bn> bn1, bn2, bnd;
    bool downsample = false;
    ActShape in_shape, mid_shape, out_shape;
    const Tensor* in = nullptr;  // the previous layer's output
  };

  explicit Impl(kernels::Backend& b)
      : be(b), flat_params(b), flat_grads(b), images(b), pooled_stem(b), pooled(b), logits(b),
        dpooled(b), grad{Tensor(b), Tensor(b)}, tmp{Tensor(b), Tensor(b)}, low_params(b),
        low_dlogits(b) {}

  kernels::Backend& be;
  ResNetConfig config;
  // One channel block for every activation after the stem (all channel counts are multiples of
  // the width): oneDNN has fast kernels for nChw16c -> nChw16c or 8c -> 8c, but converting
  // between 8 and 16 inside a convolution falls back to its slow reference code.
  int cblock = 1;
  std::vector<Param> params;
  std::vector<ParamInfo> infos;
  Tensor flat_params, flat_grads;
  std::function<void(size_t, size_t)> ready;
  std::function<void()> layer_check;
  BatchNormSync* sync = nullptr;
  size_t next_ready = 0;  // checks that gradients complete in offset order

  Tensor images;  // the input, copied (NCHW)
  Conv stem;
  std::unique_ptr<Bn> stem_bn;
  ActShape stem_shape;
  // ImageNet stem only: the max-pool after stem_bn and its output (layer1's input).
  kernels::PoolShape stem_pool;
  Tensor pooled_stem;
  std::vector<Block> blocks;
  int fc_weight = -1, fc_bias = -1;
  int64_t fc_in = 0;
  Tensor pooled, logits, dpooled;
  Tensor grad[2], tmp[2];  // backward scratch, sized to the largest activation
  bool have_training_forward = false;
  Tensor low_params;  // bf16/fp16: the weights the convolutions and the classifier read
  Tensor low_dlogits;  // bf16/fp16: the loss gradient as the classifier's backward reads it

  bool low_precision() const { return config.precision != kernels::Dtype::kF32; }
  // Rounds n values in place to the compute precision: what storing them in it would do.
  void store(float* x, int64_t n) {
    if (low_precision()) be.round_to_dtype(n, config.precision, x, x);
  }
  void store(Tensor& t) { store(t.data(), t.numel()); }
  // The weights a convolution or GEMM multiplies with.
  const float* w(int id) {
    return (low_precision() ? low_params.data() : flat_params.data()) +
           params[static_cast<size_t>(id)].offset;
  }

  int add_param(std::string name, size_t count, bool no_decay, bool batch_norm = false) {
    params.push_back({std::move(name), count, 0, no_decay, batch_norm});
    return static_cast<int>(params.size()) - 1;
  }
  float* p(int id) { return flat_params.data() + params[static_cast<size_t>(id)].offset; }
  float* g(int id) { return flat_grads.data() + params[static_cast<size_t>(id)].offset; }

  void make_conv(Conv& c, const std::string& name, int64_t c_in, int64_t c_out, int64_t kernel,
                 int64_t stride, int in_cblock) {
    c.c_in = c_in;
    c.c_out = c_out;
    c.kernel = kernel;
    c.stride = stride;
    c.pad = kernel / 2;
    c.in_cblock = in_cblock;
    c.out_cblock = cblock;
    c.out = Tensor(be);
    c.param = add_param(name + ".weight", static_cast<size_t>(c_out * c_in * kernel * kernel), false);
  }
  std::unique_ptr<Bn> make_bn(const std::string& name, int64_t c) {
    auto bn = std::make_unique<Bn>(c, be);
    bn->weight = add_param(name + ".weight", static_cast<size_t>(c), true, /*batch_norm=*/true);
    bn->bias = add_param(name + ".bias", static_cast<size_t>(c), true, /*batch_norm=*/true);
    return bn;
  }

  // Offsets in reverse registration order: the order backward completes them.
  void lay_out_params() {
    size_t offset = 0;
    for (size_t i = params.size(); i-- > 0;) {
      params[i].offset = offset;
      offset += params[i].count;
    }
    for (size_t i = params.size(); i-- > 0;)
      infos.push_back({params[i].name, params[i].offset, params[i].count, params[i].no_decay,
                       params[i].batch_norm});
    flat_params.resize({static_cast<int64_t>(offset)});
    flat_grads.resize({static_cast<int64_t>(offset)});
  }

  // Initialisation in registration order, like torchvision's ResNet.__init__ loop, computed on
  // the host and copied to the backend once.
  void initialise(uint64_t seed) {
    const size_t offset = static_cast<size_t>(flat_params.numel());
    std::vector<float> init(offset, 0.0f);
    auto host = [&](int id) { return init.data() + params[static_cast<size_t>(id)].offset; };
    InitRng rng(seed);
    auto init_conv = [&](const Conv& c) {
      const double std = std::sqrt(2.0 / static_cast<double>(c.c_out * c.kernel * c.kernel));
      float* wp = host(c.param);
      for (size_t i = 0; i < params[static_cast<size_t>(c.param)].count; ++i)
        wp[i] = static_cast<float>(rng.normal() * std);
    };
    auto init_bn = [&](const Bn& bn) {
      const size_t c = params[static_cast<size_t>(bn.weight)].count;
      std::fill(host(bn.weight), host(bn.weight) + c, 1.0f);
      std::fill(host(bn.bias), host(bn.bias) + c, 0.0f);
    };
    init_conv(stem);
    init_bn(*stem_bn);
    for (auto& blk : blocks) {
      init_conv(blk.conv1);
      init_bn(*blk.bn1);
      init_conv(blk.conv2);
      init_bn(*blk.bn2);
      if (blk.downsample) {
        init_conv(blk.convd);
        init_bn(*blk.bnd);
      }
    }
    // nn.Linear default: weight ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)),
    // bias ~ U(-1/sqrt(in), 1/sqrt(in)).
    const double bound = 1.0 / std::sqrt(static_cast<double>(fc_in));
    float* fw = host(fc_weight);
    for (size_t i = 0; i < params[static_cast<size_t>(fc_weight)].count; ++i)
      fw[i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
    float* fb = host(fc_bias);
    for (int i = 0; i < config.num_classes; ++i)
      fb[i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
    flat_params.copy_from_host(init.data());
  }

  // Called after a parameter's gradient is final; enforces the documented order.
  void grad_ready(int id) {
    const Param& prm = params[static_cast<size_t>(id)];
    DL_CHECK(prm.offset == next_ready) << "gradient of " << prm.name << " at " << prm.offset
                                       << " completed out of order, expected " << next_ready;
    next_ready += prm.count;
    if (ready) ready(prm.offset, prm.count);
  }
  void bn_ready(const Bn& bn) {
    grad_ready(bn.bias);
    grad_ready(bn.weight);
  }

  void conv_forward(Conv& c, const ActShape& in, const float* x, ActShape* out_shape) {
    const ConvShape s = c.shape(in);
    *out_shape = s.out();
    c.out.resize({s.n, s.c_out, s.h_out(), s.w_out()});
    be.conv2d_forward(s, x, w(c.param), c.out.data(), config.precision);
  }
  void bn_forward(Bn& bn, const ActShape& s, const float* x, const float* residual, bool relu,
                  bool training) {
    bn.out.resize({s.n, s.c, s.h, s.w});
    bn.layer.bind(p(bn.weight), p(bn.bias), g(bn.weight), g(bn.bias));
    bn.layer.forward(s, x, residual, relu, training, sync, bn.out.data());
    store(bn.out);
  }
  // Backward of a convolution: its weight gradient (final: reported ready) and, when dx is not
  // null, its input gradient (added to dx when accumulate), both in the compute precision.
  void conv_backward(const Conv& c, const ConvShape& s, const float* x, const float* dy, float* dx,
                     bool accumulate = false) {
    be.conv2d_backward_weights(s, x, dy, g(c.param), config.precision);
    grad_ready(c.param);
    if (dx == nullptr) return;
    be.conv2d_backward_data(s, dy, w(c.param), dx, accumulate, config.precision);
  }
};

ResNet::ResNet(const ResNetConfig& config, uint64_t seed, kernels::Backend& backend)
    : impl_(std::make_unique<Impl>(backend)) {
  Impl& m = *impl_;
  m.config = config;
  if (config.depth != 18 && config.depth != 34)
    throw UsageError("ResNet depth must be 18 or 34, got " + std::to_string(config.depth));
  if (config.width < 1 || config.in_channels < 1 || config.num_classes < 1)
    throw UsageError("ResNet width, in_channels and num_classes must be positive, got width " +
                     std::to_string(config.width) + ", in_channels " +
                     std::to_string(config.in_channels) + ", num_classes " +
                     std::to_string(config.num_classes));
  const int64_t w = config.width;
  m.cblock = backend.preferred_cblock(w);
  // Registration follows torchvision's named_parameters() order.
  const bool imagenet = config.stem == ResNetStem::kImageNet;
  m.make_conv(m.stem, "conv1", config.in_channels, w, imagenet ? 7 : 3, imagenet ? 2 : 1,
              /*in_cblock=*/1);  // NCHW images
  m.stem_bn = m.make_bn("bn1", w);
  const int counts18[4] = {2, 2, 2, 2}, counts34[4] = {3, 4, 6, 3};
  const int* counts = config.depth == 18 ? counts18 : counts34;
  int64_t c_in = w;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t c_out = w << layer;
    for (int b = 0; b < counts[layer]; ++b) {
      const std::string prefix = "layer" + std::to_string(layer + 1) + "." + std::to_string(b);
      const int64_t stride = (layer > 0 && b == 0) ? 2 : 1;
      Impl::Block blk;
      m.make_conv(blk.conv1, prefix + ".conv1", c_in, c_out, 3, stride, m.cblock);
      blk.bn1 = m.make_bn(prefix + ".bn1", c_out);
      m.make_conv(blk.conv2, prefix + ".conv2", c_out, c_out, 3, 1, m.cblock);
      blk.bn2 = m.make_bn(prefix + ".bn2", c_out);
      if (stride != 1 || c_in != c_out) {
        blk.downsample = true;
        m.make_conv(blk.convd, prefix + ".downsample.0", c_in, c_out, 1, stride, m.cblock);
        blk.bnd = m.make_bn(prefix + ".downsample.1", c_out);
      }
      m.blocks.push_back(std::move(blk));
      c_in = c_out;
    }
  }
  m.fc_in = c_in;
  m.fc_weight = m.add_param("fc.weight", static_cast<size_t>(config.num_classes * c_in), false);
  m.fc_bias = m.add_param("fc.bias", static_cast<size_t>(config.num_classes), true);

  m.lay_out_params();
  m.initialise(seed);
}

ResNet::~ResNet() = default;

const Tensor& ResNet::forward(const Tensor& images, bool training) {
  Impl& m = *impl_;
  DL_CHECK(images.ndim() == 4 && images.dim(1) == m.config.in_channels && images.dim(2) >= 8 &&
           images.dim(3) >= 8)
      << "images must be (N, " << m.config.in_channels << ", H >= 8, W >= 8), got "
      << images.shape_string();
  m.have_training_forward = false;
  m.images.copy_from(images);  // from the host when the batch was loaded there
  m.store(m.images);
  if (m.low_precision()) {
    m.low_params.resize({m.flat_params.numel()});
    m.be.round_to_dtype(m.flat_params.numel(), m.config.precision, m.flat_params.data(),
                        m.low_params.data());
  }
  const ActShape in{images.dim(0), images.dim(1), images.dim(2), images.dim(3), 1};
  m.conv_forward(m.stem, in, m.images.data(), &m.stem_shape);
  m.bn_forward(*m.stem_bn, m.stem_shape, m.stem.out.data(), nullptr, true, training);

  const Tensor* x = &m.stem_bn->out;
  ActShape xs = m.stem_shape;
  if (m.config.stem == ResNetStem::kImageNet) {
    m.stem_pool = kernels::PoolShape{xs, 3, 2, 1};
    xs = m.stem_pool.out();
    m.pooled_stem.resize({xs.n, xs.c, xs.h, xs.w});
    m.be.max_pool_forward(m.stem_pool, x->data(), m.pooled_stem.data());
    x = &m.pooled_stem;
  }
  for (auto& blk : m.blocks) {
    if (training && m.layer_check) m.layer_check();
    blk.in = x;
    blk.in_shape = xs;
    m.conv_forward(blk.conv1, xs, x->data(), &blk.mid_shape);
    m.bn_forward(*blk.bn1, blk.mid_shape, blk.conv1.out.data(), nullptr, true, training);
    m.conv_forward(blk.conv2, blk.mid_shape, blk.bn1->out.data(), &blk.out_shape);
    const float* shortcut = x->data();
    if (blk.downsample) {
      ActShape ds;
      m.conv_forward(blk.convd, xs, x->data(), &ds);
      m.bn_forward(*blk.bnd, ds, blk.convd.out.data(), nullptr, false, training);
      shortcut = blk.bnd->out.data();
    }
    m.bn_forward(*blk.bn2, blk.out_shape, blk.conv2.out.data(), shortcut, true, training);
    x = &blk.bn2->out;
    xs = blk.out_shape;
  }

  m.pooled.resize({xs.n, xs.c});
  m.be.global_avg_pool_forward(xs, x->data(), m.pooled.data());
  m.store(m.pooled);
  m.logits.resize({xs.n, m.config.num_classes});
  m.be.linear_forward(xs.n, m.fc_in, m.config.num_classes, m.pooled.data(), m.w(m.fc_weight),
                      m.w(m.fc_bias), m.logits.data(), m.config.precision);
  m.have_training_forward = training;
  return m.logits;
}

void ResNet::backward(const Tensor& grad_logits) {
  Impl& m = *impl_;
  DL_CHECK(m.have_training_forward) << "backward needs a preceding forward with training = true";
  const int64_t n = m.logits.dim(0), classes = m.config.num_classes;
  DL_CHECK(grad_logits.ndim() == 2 && grad_logits.dim(0) == n && grad_logits.dim(1) == classes)
      << "grad_logits must be (" << n << ", " << classes << "), got " << grad_logits.shape_string();
  m.next_ready = 0;
  const int64_t largest = m.stem_bn->out.numel();
  for (Tensor* t : {&m.grad[0], &m.grad[1], &m.tmp[0], &m.tmp[1]}) t->resize({largest});

  // Head.
  const ActShape last = m.blocks.back().out_shape;
  m.dpooled.resize({n, m.fc_in});
  const float* dlogits = grad_logits.data();
  if (m.low_precision()) {  // the loss's fp32 gradient enters the classifier in its precision
    m.low_dlogits.resize({n, classes});
    m.be.round_to_dtype(n * classes, m.config.precision, dlogits, m.low_dlogits.data());
    dlogits = m.low_dlogits.data();
  }
  m.be.linear_backward(n, m.fc_in, classes, m.pooled.data(), m.w(m.fc_weight), dlogits,
                       m.dpooled.data(), m.g(m.fc_weight), m.g(m.fc_bias), m.config.precision);
  m.grad_ready(m.fc_bias);
  m.grad_ready(m.fc_weight);
  int cur = 0;
  m.be.global_avg_pool_backward(last, m.dpooled.data(), m.grad[cur].data());
  m.store(m.grad[cur].data(), last.numel());

  float* t0 = m.tmp[0].data();
  float* t1 = m.tmp[1].data();
  for (size_t bi = m.blocks.size(); bi-- > 0;) {
    Impl::Block& blk = m.blocks[bi];
    const float* dy = m.grad[cur].data();
    float* dx = m.grad[1 - cur].data();
    const float* y = blk.bn2->out.data();
    const float* x = blk.in->data();
    if (blk.downsample) {
      const ConvShape cs = blk.convd.shape(blk.in_shape);
      blk.bnd->layer.backward(cs.out(), blk.convd.out.data(), dy, y, m.sync, t0);
      m.store(t0, cs.out().numel());
      m.bn_ready(*blk.bnd);
      m.conv_backward(blk.convd, cs, x, t0, dx);
    }
    // Identity shortcut: bn2's backward also writes the masked gradient (what reaches the
    // shortcut) into dx, and conv1's backward-data adds the main path to it below.
    blk.bn2->layer.backward(blk.out_shape, blk.conv2.out.data(), dy, y, m.sync, t0,
                            blk.downsample ? nullptr : dx);
    m.store(t0, blk.out_shape.numel());
    m.bn_ready(*blk.bn2);
    const ConvShape cs2 = blk.conv2.shape(blk.mid_shape);
    m.conv_backward(blk.conv2, cs2, blk.bn1->out.data(), t0, t1);
    blk.bn1->layer.backward(blk.mid_shape, blk.conv1.out.data(), t1, blk.bn1->out.data(), m.sync, t1);
    m.store(t1, blk.mid_shape.numel());
    m.bn_ready(*blk.bn1);
    // dx already holds the shortcut's gradient (downsample conv's or the identity's).
    m.conv_backward(blk.conv1, blk.conv1.shape(blk.in_shape), x, t1, dx, /*accumulate=*/true);
    cur = 1 - cur;
  }

  // Stem: the images need no gradient. The max-pool's input (stem_bn's output) is the largest
  // activation, so grad[] has room for its gradient.
  if (m.config.stem == ResNetStem::kImageNet) {
    m.be.max_pool_backward(m.stem_pool, m.stem_bn->out.data(), m.grad[cur].data(),
                           m.grad[1 - cur].data());
    cur = 1 - cur;
    m.store(m.grad[cur].data(), m.stem_shape.numel());  // overlapping windows sum gradients
  }
  m.stem_bn->layer.backward(m.stem_shape, m.stem.out.data(), m.grad[cur].data(),
                            m.stem_bn->out.data(), m.sync, t0);
  m.store(t0, m.stem_shape.numel());
  m.bn_ready(*m.stem_bn);
  const ActShape in{m.images.dim(0), m.images.dim(1), m.images.dim(2), m.images.dim(3), 1};
  m.conv_backward(m.stem, m.stem.shape(in), m.images.data(), t0, /*dx=*/nullptr);
  DL_CHECK(m.next_ready == m.flat_grads.bytes() / sizeof(float))
      << "backward finished " << m.next_ready << " of " << m.flat_grads.numel() << " gradients";
}

float* ResNet::params() { return impl_->flat_params.data(); }
const float* ResNet::params() const { return impl_->flat_params.data(); }
Tensor& ResNet::params_tensor() { return impl_->flat_params; }
const Tensor& ResNet::params_tensor() const { return impl_->flat_params; }
kernels::Backend& ResNet::backend() const { return impl_->be; }
float* ResNet::grads() { return impl_->flat_grads.data(); }
const float* ResNet::grads() const { return impl_->flat_grads.data(); }
size_t ResNet::num_params() const { return static_cast<size_t>(impl_->flat_params.numel()); }
const std::vector<ParamInfo>& ResNet::param_info() const { return impl_->infos; }

std::vector<Tensor*> ResNet::buffers() {
  std::vector<Tensor*> out;
  auto add = [&](Impl::Bn& bn) {
    out.push_back(&bn.layer.running_mean());
    out.push_back(&bn.layer.running_var());
  };
  add(*impl_->stem_bn);
  for (auto& blk : impl_->blocks) {
    add(*blk.bn1);
    add(*blk.bn2);
    if (blk.downsample) add(*blk.bnd);
  }
  return out;
}

std::vector<std::string> ResNet::buffer_names() const {
  std::vector<std::string> out;
  // BN parameter names end in ".weight"; the buffers share the module prefix.
  for (const auto& prm : impl_->params) {
    const std::string suffix = ".weight";
    if (!prm.no_decay || prm.name.size() < suffix.size() ||
        prm.name.compare(prm.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string module = prm.name.substr(0, prm.name.size() - suffix.size());
    out.push_back(module + ".running_mean");
    out.push_back(module + ".running_var");
  }
  return out;
}

void ResNet::set_batchnorm_sync(BatchNormSync* sync) { impl_->sync = sync; }
void ResNet::set_grad_ready_callback(std::function<void(size_t, size_t)> fn) {
  impl_->ready = std::move(fn);
}
void ResNet::set_layer_check(std::function<void()> fn) { impl_->layer_check = std::move(fn); }
void ResNet::zero_grad() { impl_->flat_grads.zero(); }
const ResNetConfig& ResNet::config() const { return impl_->config; }

}  // namespace dlaunch::model
