// Convolutions on oneDNN. Activations come in the caller's layout (NCHW or nChw8c/16c, see
// ops.h), weights in OIHW; oneDNN picks its own (blocked) weight format ("any") and we reorder
// the OIHW weights into it on each call (weights are small next to a batch of activations) and
// reorder weight gradients back. Primitives are created once per shape and cached.
//
// Concurrency: several models may run in one process on different threads (the SyncBN tests run
// ranks as threads), so the cache is locked and everything mutable per call (scratchpad, weight
// reorder buffers, stream) is thread_local. Scratchpads are user-managed because oneDNN's
// library-managed scratchpad is shared between threads unless built for concurrent execution.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "common/error.h"
#include "kernels/ops.h"
#include "kernels/profile.h"

namespace dlaunch::kernels::cpu {
namespace {

using dnnl::memory;
using Tag = dnnl::memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

// A grow-only 64-byte aligned buffer, one per thread and purpose.
class Arena {
 public:
  ~Arena() { std::free(ptr_); }
  void* get(size_t bytes) {
    if (bytes > size_) {
      std::free(ptr_);
      size_ = (bytes + 63) / 64 * 64;
      ptr_ = std::aligned_alloc(64, size_);
      DL_CHECK(ptr_ != nullptr) << "out of memory allocating " << size_ << " bytes";
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

Arena& scratch_arena() {
  thread_local Arena a;
  return a;
}
Arena& weight_arena() {
  thread_local Arena a;
  return a;
}

Tag act_tag(int cblock) {
  switch (cblock) {
    case 1:
      return Tag::nchw;
    case 8:
      return Tag::nChw8c;
    case 16:
      return Tag::nChw16c;
  }
  DL_CHECK(false) << "unsupported channel block " << cblock;
  return Tag::undef;
}

struct Key {
  int64_t v[10];
  bool operator==(const Key& o) const { return std::memcmp(v, o.v, sizeof(v)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

Key make_key(const ConvShape& s) {
  return Key{{s.n, s.c_in, s.h_in, s.w_in, s.c_out, s.kernel, s.stride, s.pad, s.in_cblock,
              s.out_cblock}};
}

// A reorder between two descriptors, or nothing when they are equal.
struct Reorder {
  memory::desc from, to;
  std::unique_ptr<dnnl::reorder> prim;
  void init(const memory::desc& f, const memory::desc& t) {
    from = f;
    to = t;
    if (f != t) prim = std::make_unique<dnnl::reorder>(dnnl::reorder::primitive_desc(engine(), f, engine(), t));
  }
  // Returns the pointer holding data in `to`'s format: src itself or `buffer` after reordering.
  void run(const void* src, void* dst) const {
    memory a(from, engine(), const_cast<void*>(src));
    memory b(to, engine(), dst);
    prim->execute(stream(), a, b);
  }
};

struct ConvPrims {
  memory::desc src, dst, user_wei;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  Reorder fwd_wei;  // OIHW -> fwd weights format
  std::once_flag bwd_data_once, bwd_weights_once;
  dnnl::convolution_backward_data bwd_data;
  memory::desc bwd_data_scratch;
  Reorder bwd_data_wei;  // OIHW -> bwd-data weights format
  dnnl::convolution_backward_weights bwd_weights;
  memory::desc bwd_weights_scratch;
  Reorder bwd_diff_wei;  // bwd-weights diff format -> OIHW
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

memory::dims strides(const ConvShape& s) { return {s.stride, s.stride}; }
memory::dims pads(const ConvShape& s) { return {s.pad, s.pad}; }

std::unique_ptr<ConvPrims> create(const ConvShape& s) {
  DL_CHECK(s.n > 0 && s.c_in > 0 && s.c_out > 0 && s.h_out() > 0 && s.w_out() > 0)
      << "bad conv shape n=" << s.n << " c_in=" << s.c_in << " " << s.h_in << "x" << s.w_in
      << " c_out=" << s.c_out << " k=" << s.kernel << " stride=" << s.stride << " pad=" << s.pad;
  DL_CHECK(s.c_in % s.in_cblock == 0 && s.c_out % s.out_cblock == 0)
      << "channels " << s.c_in << "/" << s.c_out << " not multiples of blocks " << s.in_cblock
      << "/" << s.out_cblock;
  auto p = std::make_unique<ConvPrims>();
  const auto f32 = memory::data_type::f32;
  p->src = memory::desc({s.n, s.c_in, s.h_in, s.w_in}, f32, act_tag(s.in_cblock));
  p->dst = memory::desc({s.n, s.c_out, s.h_out(), s.w_out()}, f32, act_tag(s.out_cblock));
  p->user_wei = memory::desc({s.c_out, s.c_in, s.kernel, s.kernel}, f32, Tag::oihw);
  memory::desc any_wei({s.c_out, s.c_in, s.kernel, s.kernel}, f32, Tag::any);
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::convolution_direct, p->src, any_wei, p->dst,
                                    strides(s), pads(s), pads(s));
  p->fwd_pd = dnnl::convolution_forward::primitive_desc(d, user_scratchpad(), engine());
  p->fwd = dnnl::convolution_forward(p->fwd_pd);
  p->fwd_wei.init(p->user_wei, p->fwd_pd.weights_desc());
  return p;
}

void init_bwd_data(const ConvShape& s, ConvPrims& p) {
  memory::desc any_wei({s.c_out, s.c_in, s.kernel, s.kernel}, memory::data_type::f32, Tag::any);
  dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, p.src, any_wei,
                                          p.dst, strides(s), pads(s), pads(s));
  dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad(), engine(), p.fwd_pd);
  p.bwd_data = dnnl::convolution_backward_data(pd);
  p.bwd_data_scratch = pd.scratchpad_desc();
  p.bwd_data_wei.init(p.user_wei, pd.weights_desc());
}

void init_bwd_weights(const ConvShape& s, ConvPrims& p) {
  memory::desc any_wei({s.c_out, s.c_in, s.kernel, s.kernel}, memory::data_type::f32, Tag::any);
  dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, p.src, any_wei,
                                             p.dst, strides(s), pads(s), pads(s));
  dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad(), engine(), p.fwd_pd);
  p.bwd_weights = dnnl::convolution_backward_weights(pd);
  p.bwd_weights_scratch = pd.scratchpad_desc();
  p.bwd_diff_wei.init(pd.diff_weights_desc(), p.user_wei);
}

ConvPrims& prims(const ConvShape& s) {
  static std::mutex mu;
  static std::unordered_map<Key, std::unique_ptr<ConvPrims>, KeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[make_key(s)];
  if (!slot) slot = create(s);
  return *slot;
}

memory scratch(const memory::desc& md) {
  return memory(md, engine(), scratch_arena().get(md.get_size()));
}

template <typename F>
void guarded(const char* what, F&& f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    DL_CHECK(false) << what << ": oneDNN error " << e.status << ": " << e.what();
  }
}

}  // namespace

void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y) {
  ScopedOpTimer timer("conv2d_forward");
  guarded("conv2d_forward", [&] {
    ConvPrims& p = prims(s);
    const void* wei = w;
    if (p.fwd_wei.prim) {
      void* buf = weight_arena().get(p.fwd_wei.to.get_size());
      p.fwd_wei.run(w, buf);
      wei = buf;
    }
    p.fwd.execute(stream(),
                  {{DNNL_ARG_SRC, memory(p.src, engine(), const_cast<float*>(x))},
                   {DNNL_ARG_WEIGHTS, memory(p.fwd_wei.to, engine(), const_cast<void*>(wei))},
                   {DNNL_ARG_DST, memory(p.dst, engine(), y)},
                   {DNNL_ARG_SCRATCHPAD, scratch(p.fwd_pd.scratchpad_desc())}});
    stream().wait();
  });
}

void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx) {
  ScopedOpTimer timer("conv2d_backward_data");
  guarded("conv2d_backward_data", [&] {
    ConvPrims& p = prims(s);
    std::call_once(p.bwd_data_once, [&] { init_bwd_data(s, p); });
    const void* wei = w;
    if (p.bwd_data_wei.prim) {
      void* buf = weight_arena().get(p.bwd_data_wei.to.get_size());
      p.bwd_data_wei.run(w, buf);
      wei = buf;
    }
    p.bwd_data.execute(
        stream(), {{DNNL_ARG_DIFF_DST, memory(p.dst, engine(), const_cast<float*>(dy))},
                   {DNNL_ARG_WEIGHTS, memory(p.bwd_data_wei.to, engine(), const_cast<void*>(wei))},
                   {DNNL_ARG_DIFF_SRC, memory(p.src, engine(), dx)},
                   {DNNL_ARG_SCRATCHPAD, scratch(p.bwd_data_scratch)}});
    stream().wait();
  });
}

void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw) {
  ScopedOpTimer timer("conv2d_backward_weights");
  guarded("conv2d_backward_weights", [&] {
    ConvPrims& p = prims(s);
    std::call_once(p.bwd_weights_once, [&] { init_bwd_weights(s, p); });
    void* diff = dw;
    if (p.bwd_diff_wei.prim) diff = weight_arena().get(p.bwd_diff_wei.from.get_size());
    p.bwd_weights.execute(
        stream(), {{DNNL_ARG_SRC, memory(p.src, engine(), const_cast<float*>(x))},
                   {DNNL_ARG_DIFF_DST, memory(p.dst, engine(), const_cast<float*>(dy))},
                   {DNNL_ARG_DIFF_WEIGHTS, memory(p.bwd_diff_wei.from, engine(), diff)},
                   {DNNL_ARG_SCRATCHPAD, scratch(p.bwd_weights_scratch)}});
    if (p.bwd_diff_wei.prim) p.bwd_diff_wei.run(diff, dw);
    stream().wait();
  });
}

}  // namespace dlaunch::kernels::cpu
