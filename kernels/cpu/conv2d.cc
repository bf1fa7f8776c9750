// Convolutions on oneDNN. Activations come in the caller's layout (NCHW or nChw8c/16c, see
// ops.h), weights in OIHW; oneDNN picks its own (blocked) weight format ("any") and we reorder
// the OIHW weights into it on each call (weights are small next to a batch of activations) and
// reorder weight gradients back. Primitives are created once per shape and cached.
//
// Each pass has several implementations ("variants"), because oneDNN 2.6's JIT kernels differ
// a lot by shape on the same CPU (measured on the 2-core AVX-512 machine: the 16-channel
// 32x32 forward is ~4x slower than its backward-data twin; Winograd wins on wide layers):
//   direct    oneDNN's direct algorithm for that pass;
//   auto      oneDNN's convolution_auto (Winograd F(4x4,3x3) where oneDNN supports it);
//   twin      for stride-1 "same" convolutions, forward and backward-data are each other's
//             transposes: conv(x, W) == backward_data(x, V) of the channel-swapped convolution
//             with V[i][o][kh][kw] = W[o][i][k-1-kh][k-1-kw], and vice versa.
// The variant is chosen per shape and pass the first time it runs (DLAUNCH_CONV_ALGO=autotune,
// the default) or fixed by DLAUNCH_CONV_ALGO=direct|auto|twin (falling back to direct where a
// variant does not apply). Autotuning times each candidate's CPU time once, runs again only the
// ones close to the best (see kMaxRounds), never times oneDNN's reference ("ref") kernels when a
// JIT one exists, and keeps the winner's trial output as the call's result. Choices are keyed by
// the shape without its batch size and remembered in a per-host file (conv_choice_cache.h:
// $XDG_CACHE_HOME/dlaunch, or DLAUNCH_CONV_CACHE), so later batch sizes, the other ranks on the
// host and later runs reuse them. The fixed policies neither read nor write that file.
// Autotuning means two runs of the same program may use different algorithms, so results can
// differ in float rounding; set DLAUNCH_CONV_ALGO=direct for bitwise-reproducible runs.
//
// Concurrency: several models may run in one process on different threads (the SyncBN tests run
// ranks as threads), so the cache is locked and everything mutable per call (scratchpad, weight
// reorder buffers, stream) is thread_local. Scratchpads are user-managed because oneDNN's
// library-managed scratchpad is shared between threads unless built for concurrent execution.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/conv_choice_cache.h"
#include "kernels/ops.h"
#include "kernels/profile.h"
#include "kernels/shape_key.h"

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

enum Arenas { kScratch, kWeights, kTwinWeights, kDiffWeights, kPartial, kArenaCount };
void* arena(int which, size_t bytes) {
  thread_local Arena a[kArenaCount];
  return a[which].get(bytes);
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

enum class Variant { kDirect, kAuto, kTwin };
// kBackwardDataAcc is backward-data that adds to its output (dx += ...): the twin does it with
// a sum post-op for free, the others through a temporary and an add.
enum class Pass { kForward, kBackwardData, kBackwardWeights, kBackwardDataAcc };
const char* variant_name(Variant v) {
  return v == Variant::kDirect ? "direct" : v == Variant::kAuto ? "auto" : "twin";
}
const char* pass_name(Pass p) {
  switch (p) {
    case Pass::kForward:
      return "forward";
    case Pass::kBackwardData:
      return "backward_data";
    case Pass::kBackwardWeights:
      return "backward_weights";
    case Pass::kBackwardDataAcc:
      return "backward_data_accumulate";
  }
  return "?";
}

// "autotune" (default), or a fixed variant.
enum class Policy { kAutotune, kDirect, kAuto, kTwin };
// Read when a shape's pass is first used (not cached: tests switch it between shapes).
Policy policy() {
  const std::string v = get_env_or("DLAUNCH_CONV_ALGO", "autotune");
  if (v == "autotune") return Policy::kAutotune;
  if (v == "direct") return Policy::kDirect;
  if (v == "auto") return Policy::kAuto;
  if (v == "twin") return Policy::kTwin;
  throw UsageError("DLAUNCH_CONV_ALGO must be autotune, direct, auto or twin, got '" + v + "'");
}

using Key = ShapeKey<10>;

// A reorder between two descriptors; no primitive when they are equal.
struct Reorder {
  memory::desc from, to;
  std::unique_ptr<dnnl::reorder> prim;
  void init(const memory::desc& f, const memory::desc& t) {
    from = f;
    to = t;
    if (f != t) prim = std::make_unique<dnnl::reorder>(dnnl::reorder::primitive_desc(engine(), f, engine(), t));
  }
  void run(const void* src, void* dst) const {
    memory a(from, engine(), const_cast<void*>(src));
    memory b(to, engine(), dst);
    prim->execute(stream(), a, b);
  }
  // src in `from` format -> pointer in `to` format (src itself or the arena).
  const void* to_target(const void* src, int which) const {
    if (!prim) return src;
    void* buf = arena(which, to.get_size());
    run(src, buf);
    return buf;
  }
};

dnnl::primitive_attr user_scratchpad(bool sum_post_op = false) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (sum_post_op) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return attr;
}

memory scratch(const memory::desc& md) { return memory(md, engine(), arena(kScratch, md.get_size())); }

// The descriptors of one convolution (src/dst in the caller's layouts).
struct Descs {
  memory::desc src, dst, user_wei, any_wei;
  memory::dims strides, pads;
};

Descs descs(const ConvShape& s) {
  const auto f32 = memory::data_type::f32;
  Descs d;
  d.src = memory::desc({s.n, s.c_in, s.h_in, s.w_in}, f32, act_tag(s.in_cblock));
  d.dst = memory::desc({s.n, s.c_out, s.h_out(), s.w_out()}, f32, act_tag(s.out_cblock));
  d.user_wei = memory::desc({s.c_out, s.c_in, s.kernel, s.kernel}, f32, Tag::oihw);
  d.any_wei = memory::desc({s.c_out, s.c_in, s.kernel, s.kernel}, f32, Tag::any);
  d.strides = {s.stride, s.stride};
  d.pads = {s.pad, s.pad};
  return d;
}

dnnl::convolution_forward::primitive_desc fwd_pd(const Descs& d, dnnl::algorithm alg,
                                                 bool sum_post_op = false) {
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_training, alg, d.src, d.any_wei,
                                       d.dst, d.strides, d.pads, d.pads);
  return dnnl::convolution_forward::primitive_desc(desc, user_scratchpad(sum_post_op), engine());
}

// One runnable implementation of one pass: the primitive, its scratchpad, the weight reorder.
struct Impl {
  dnnl::primitive prim;
  std::string name;  // oneDNN's implementation, e.g. "jit:avx512_core" or "ref:any"
  memory::desc scratch;
  Reorder wei;  // forward/backward-data: OIHW (or its twin transform) -> primitive format;
                // backward-weights: primitive's diff format -> OIHW
};

std::unique_ptr<Impl> make_forward(const Descs& d, dnnl::algorithm alg, bool sum_post_op = false) {
  auto pd = fwd_pd(d, alg, sum_post_op);
  auto impl = std::make_unique<Impl>();
  impl->prim = dnnl::convolution_forward(pd);
  impl->name = pd.impl_info_str();
  impl->scratch = pd.scratchpad_desc();
  impl->wei.init(d.user_wei, pd.weights_desc());
  return impl;
}

std::unique_ptr<Impl> make_backward_data(const Descs& d, dnnl::algorithm alg) {
  dnnl::convolution_backward_data::desc desc(alg, d.src, d.any_wei, d.dst, d.strides, d.pads, d.pads);
  dnnl::convolution_backward_data::primitive_desc pd(desc, user_scratchpad(), engine(), fwd_pd(d, alg));
  auto impl = std::make_unique<Impl>();
  impl->prim = dnnl::convolution_backward_data(pd);
  impl->name = pd.impl_info_str();
  impl->scratch = pd.scratchpad_desc();
  impl->wei.init(d.user_wei, pd.weights_desc());
  return impl;
}

std::unique_ptr<Impl> make_backward_weights(const Descs& d, dnnl::algorithm alg) {
  dnnl::convolution_backward_weights::desc desc(alg, d.src, d.any_wei, d.dst, d.strides, d.pads, d.pads);
  dnnl::convolution_backward_weights::primitive_desc pd(desc, user_scratchpad(), engine(), fwd_pd(d, alg));
  auto impl = std::make_unique<Impl>();
  impl->prim = dnnl::convolution_backward_weights(pd);
  impl->name = pd.impl_info_str();
  impl->scratch = pd.scratchpad_desc();
  impl->wei.init(pd.diff_weights_desc(), d.user_wei);
  return impl;
}

bool has_twin(const ConvShape& s) {
  return s.stride == 1 && s.kernel % 2 == 1 && s.pad == s.kernel / 2;
}

ConvShape swapped(const ConvShape& s) {
  ConvShape t = s;
  std::swap(t.c_in, t.c_out);
  std::swap(t.in_cblock, t.out_cblock);
  return t;
}

// V[i][o][kh][kw] = W[o][i][k-1-kh][k-1-kw]: the weights of the channel-swapped twin.
const float* twin_weights(const ConvShape& s, const float* w) {
  const int64_t k = s.kernel, kk = k * k;
  float* v = static_cast<float*>(arena(kTwinWeights, sizeof(float) * s.weight_numel()));
  for (int64_t o = 0; o < s.c_out; ++o)
    for (int64_t i = 0; i < s.c_in; ++i) {
      const float* src = w + (o * s.c_in + i) * kk;
      float* dst = v + (i * s.c_out + o) * kk;
      for (int64_t j = 0; j < kk; ++j) dst[j] = src[kk - 1 - j];
    }
  return v;
}

struct PassState {
  std::mutex mu;
  bool chosen = false;
  Variant variant = Variant::kDirect;
  std::unique_ptr<Impl> impl;
};

struct ConvEntry {
  ConvShape shape;
  Descs d, twin_d;
  PassState pass[4];
};

ConvEntry& entry(const ConvShape& s) {
  static std::mutex mu;
  static std::unordered_map<Key, std::unique_ptr<ConvEntry>, ShapeKeyHash> cache;
  DL_CHECK(s.n > 0 && s.c_in > 0 && s.c_out > 0 && s.h_out() > 0 && s.w_out() > 0)
      << "bad conv shape n=" << s.n << " c_in=" << s.c_in << " " << s.h_in << "x" << s.w_in
      << " c_out=" << s.c_out << " k=" << s.kernel << " stride=" << s.stride << " pad=" << s.pad;
  DL_CHECK(s.c_in % s.in_cblock == 0 && s.c_out % s.out_cblock == 0)
      << "channels " << s.c_in << "/" << s.c_out << " not multiples of blocks " << s.in_cblock
      << "/" << s.out_cblock;
  const Key key{{s.n, s.c_in, s.h_in, s.w_in, s.c_out, s.kernel, s.stride, s.pad, s.in_cblock,
                 s.out_cblock}};
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[key];
  if (!slot) {
    slot = std::make_unique<ConvEntry>();
    slot->shape = s;
    slot->d = descs(s);
    if (has_twin(s)) slot->twin_d = descs(swapped(s));
  }
  return *slot;
}

std::unique_ptr<Impl> make(ConvEntry& e, Pass pass, Variant v) {
  const dnnl::algorithm alg =
      v == Variant::kAuto ? dnnl::algorithm::convolution_auto : dnnl::algorithm::convolution_direct;
  switch (pass) {
    case Pass::kForward:
      return v == Variant::kTwin ? make_backward_data(e.twin_d, alg) : make_forward(e.d, alg);
    case Pass::kBackwardData:
      return v == Variant::kTwin ? make_forward(e.twin_d, alg) : make_backward_data(e.d, alg);
    case Pass::kBackwardWeights:
      return make_backward_weights(e.d, alg);
    case Pass::kBackwardDataAcc:
      return v == Variant::kTwin ? make_forward(e.twin_d, alg, /*sum_post_op=*/true)
                                 : make_backward_data(e.d, alg);
  }
  return nullptr;
}

// Runs one pass with one implementation. a/b are the pass's two inputs, out its output:
// forward (x, w) -> y; backward-data (dy, w) -> dx; backward-weights (x, dy) -> dw.
void execute(const ConvEntry& e, Pass pass, Variant v, const Impl& impl, const float* a,
             const float* b, float* out) {
  const Descs& d = e.d;
  auto mem = [](const memory::desc& md, const void* p) { return memory(md, engine(), const_cast<void*>(p)); };
  switch (pass) {
    case Pass::kForward: {
      if (v == Variant::kTwin) {  // backward-data of the twin: diff_dst = x, diff_src = y
        const void* wei = impl.wei.to_target(twin_weights(e.shape, b), kWeights);
        impl.prim.execute(stream(), {{DNNL_ARG_DIFF_DST, mem(e.twin_d.dst, a)},
                                     {DNNL_ARG_WEIGHTS, mem(impl.wei.to, wei)},
                                     {DNNL_ARG_DIFF_SRC, mem(e.twin_d.src, out)},
                                     {DNNL_ARG_SCRATCHPAD, scratch(impl.scratch)}});
      } else {
        const void* wei = impl.wei.to_target(b, kWeights);
        impl.prim.execute(stream(), {{DNNL_ARG_SRC, mem(d.src, a)},
                                     {DNNL_ARG_WEIGHTS, mem(impl.wei.to, wei)},
                                     {DNNL_ARG_DST, mem(d.dst, out)},
                                     {DNNL_ARG_SCRATCHPAD, scratch(impl.scratch)}});
      }
      break;
    }
    case Pass::kBackwardDataAcc:
      if (v != Variant::kTwin) {  // into a temporary, then dx += temporary
        float* partial = static_cast<float*>(arena(kPartial, d.src.get_size()));
        execute(e, Pass::kBackwardData, v, impl, a, b, partial);
        const int64_t n = e.shape.in().numel();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; ++i) out[i] += partial[i];
        return;
      }
      [[fallthrough]];  // the twin's forward primitive carries a sum post-op: dst += conv
    case Pass::kBackwardData: {
      if (v == Variant::kTwin) {  // forward of the twin: src = dy, dst = dx
        const void* wei = impl.wei.to_target(twin_weights(e.shape, b), kWeights);
        impl.prim.execute(stream(), {{DNNL_ARG_SRC, mem(e.twin_d.src, a)},
                                     {DNNL_ARG_WEIGHTS, mem(impl.wei.to, wei)},
                                     {DNNL_ARG_DST, mem(e.twin_d.dst, out)},
                                     {DNNL_ARG_SCRATCHPAD, scratch(impl.scratch)}});
      } else {
        const void* wei = impl.wei.to_target(b, kWeights);
        impl.prim.execute(stream(), {{DNNL_ARG_DIFF_DST, mem(d.dst, a)},
                                     {DNNL_ARG_WEIGHTS, mem(impl.wei.to, wei)},
                                     {DNNL_ARG_DIFF_SRC, mem(d.src, out)},
                                     {DNNL_ARG_SCRATCHPAD, scratch(impl.scratch)}});
      }
      break;
    }
    case Pass::kBackwardWeights: {
      void* diff = impl.wei.prim ? arena(kDiffWeights, impl.wei.from.get_size()) : out;
      impl.prim.execute(stream(), {{DNNL_ARG_SRC, mem(d.src, a)},
                                   {DNNL_ARG_DIFF_DST, mem(d.dst, b)},
                                   {DNNL_ARG_DIFF_WEIGHTS, mem(impl.wei.from, diff)},
                                   {DNNL_ARG_SCRATCHPAD, scratch(impl.scratch)}});
      if (impl.wei.prim) impl.wei.run(diff, out);
      break;
    }
  }
  stream().wait();
}

std::vector<Variant> candidates(const ConvShape& s, Pass pass) {
  std::vector<Variant> v = {Variant::kDirect};
  // oneDNN only has Winograd for 3x3 stride 1; elsewhere "auto" is "direct" again.
  if (s.kernel == 3 && s.stride == 1) v.push_back(Variant::kAuto);
  if (pass != Pass::kBackwardWeights && has_twin(s)) v.push_back(Variant::kTwin);
  return v;
}

// Trial runs: every candidate once (its first run also pays page faults and cache misses that
// the other candidates' runs share, which is why a candidate is never judged on that one run
// alone when it is close), then only the candidates within kKeepFactor of the best run again, up
// to kMaxRounds runs each; each keeps its cheapest run. A clear loser costs one run, not four.
constexpr int kMaxRounds = 3;
constexpr double kKeepFactor[kMaxRounds] = {1.5, 1.15, 1.0};

// CPU seconds consumed so far by the threads of the calling thread's OpenMP team (the threads
// oneDNN runs on; GOMP keeps the same pool threads for every region of one team size).
// Autotuning compares this rather than wall time: the 2-core machines are shared, and another
// process stealing a core stretches wall time but not the work a variant needs; background
// threads of our own process (data loader, gradient all-reduce) are not counted either.
double team_cpu_seconds() {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    total += static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return total;
}

// What the autotuner did in this process (ops.h: conv_autotune_stats).
struct TuneCounters {
  std::atomic<int64_t> tuned{0}, reused{0}, trial_runs{0}, wall_ns{0};
};
TuneCounters& counters() {
  static TuneCounters c;
  return c;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

// What makes a choice valid only on this machine and configuration: oneDNN's version and the ISA
// its JIT targets, the CPU model, and the OpenMP team size of the calling thread.
std::string choice_context() {
  static const std::string fixed = [] {
    std::string model;
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
      if (line.rfind("model name", 0) == 0) {
        model = line;
        break;
      }
    }
    uint64_t h = 1469598103934665603ull;
    for (char c : model) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    const dnnl_version_t* v = dnnl_version();
    return "dnnl" + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + "-isa" + hex(static_cast<uint64_t>(dnnl::get_effective_cpu_isa())) +
           "-cpu" + hex(h);
  }();
  return fixed + "-t" + std::to_string(omp_get_max_threads());
}

// The choice's key: everything about the shape but the batch size. The ranking of the variants
// follows the work per image, and a different n appears at every epoch's last batch and in
// evaluation (batch 256): tuning each again cost as much as the first.
std::string choice_key(const ConvShape& s, Pass pass) {
  return choice_context() + "/" + pass_name(pass) + "/" + std::to_string(s.c_in) + "x" +
         std::to_string(s.h_in) + "x" + std::to_string(s.w_in) + "-" + std::to_string(s.c_out) + "-k" +
         std::to_string(s.kernel) + "s" + std::to_string(s.stride) + "p" + std::to_string(s.pad) + "-b" +
         std::to_string(s.in_cblock) + "x" + std::to_string(s.out_cblock);
}

std::mutex& choices_mu() {
  static std::mutex mu;
  return mu;
}
// Guarded by choices_mu().
ConvChoiceCache& choices() {
  static ConvChoiceCache cache(ConvChoiceCache::default_path());
  return cache;
}

std::optional<Variant> variant_from_name(const std::string& name) {
  for (Variant v : {Variant::kDirect, Variant::kAuto, Variant::kTwin})
    if (name == variant_name(v)) return v;
  return std::nullopt;
}

// DLAUNCH_CONV_ALGO names the variant (direct where the named one does not exist for the shape).
void choose_fixed(ConvEntry& e, PassState& ps, Pass pass, const std::vector<Variant>& cands,
                  Policy pol) {
  Variant want = pol == Policy::kAuto ? Variant::kAuto : pol == Policy::kTwin ? Variant::kTwin : Variant::kDirect;
  if (std::find(cands.begin(), cands.end(), want) == cands.end()) want = Variant::kDirect;
  try {
    ps.impl = make(e, pass, want);
  } catch (const dnnl::error&) {
    want = Variant::kDirect;  // e.g. no twin primitive for a 3-channel input
    ps.impl = make(e, pass, want);
  }
  ps.variant = want;
}

// The variant an earlier run chose for this shape and pass (the choice file); false when there
// is none or it cannot be built here.
bool reuse_known_choice(ConvEntry& e, PassState& ps, Pass pass, const std::vector<Variant>& cands,
                        const std::string& key) {
  std::optional<std::string> known;
  {
    std::lock_guard<std::mutex> lock(choices_mu());
    known = choices().lookup(key);
  }
  if (!known) return false;
  const auto v = variant_from_name(*known);
  if (!v || std::find(cands.begin(), cands.end(), *v) == cands.end()) return false;
  try {
    ps.impl = make(e, pass, *v);
    ps.variant = *v;
    ++counters().reused;
    return true;
  } catch (const dnnl::error&) {
    return false;  // recorded for a shape where it cannot be built here after all: tune
  }
}

struct Trial {
  Variant variant;
  std::unique_ptr<Impl> impl;
  double best = 1e300;
};

// Every candidate that exists for the shape, without oneDNN's reference kernels when a JIT one
// exists.
std::vector<Trial> make_trials(ConvEntry& e, Pass pass, const std::vector<Variant>& cands) {
  std::vector<Trial> trials;
  for (Variant v : cands) {
    try {
      trials.push_back(Trial{v, make(e, pass, v)});
    } catch (const dnnl::error&) {
      continue;  // this variant does not exist for the shape
    }
  }
  DL_CHECK(!trials.empty()) << "no oneDNN implementation for this convolution";
  // oneDNN's reference kernels ("ref:any": plain loops, e.g. the twin of a 3-channel convolution)
  // run 100-1000x slower than the JIT ones; timing one took 1.6 s at batch 64 and 6 s at 256, four
  // times per pass, most of a 70 s first epoch. They cannot win against a JIT candidate.
  const auto is_ref = [](const Trial& t) { return t.impl->name.rfind("ref", 0) == 0; };
  if (!std::all_of(trials.begin(), trials.end(), is_ref))
    trials.erase(std::remove_if(trials.begin(), trials.end(), is_ref), trials.end());
  return trials;
}

// Times the trials in interleaved rounds, dropping the slow ones after each. Returns the index
// of the trial that ran last (its output is in `out`) and adds the runs to `runs`. `original`:
// dx before the first run, restored before each (the accumulating pass); empty otherwise.
size_t run_trials(ConvEntry& e, Pass pass, std::vector<Trial>& trials, const float* a,
                  const float* b, float* out, const std::vector<float>& original, int& runs) {
  size_t last_run = trials.size();
  if (trials.size() == 1) {
    // Nothing to compare: its run is this call's result.
    execute(e, pass, trials[0].variant, *trials[0].impl, a, b, out);
    runs = 1;
    return 0;
  }
  std::vector<size_t> alive(trials.size());
  for (size_t i = 0; i < alive.size(); ++i) alive[i] = i;
  for (int round = 0; round < kMaxRounds && (round == 0 || alive.size() > 1); ++round) {
    for (size_t i : alive) {
      if (!original.empty()) std::copy(original.begin(), original.end(), out);
      const double t0 = team_cpu_seconds();
      execute(e, pass, trials[i].variant, *trials[i].impl, a, b, out);
      trials[i].best = std::min(trials[i].best, team_cpu_seconds() - t0);
      last_run = i;
      ++runs;
    }
    double best = 1e300;
    for (size_t i : alive) best = std::min(best, trials[i].best);
    std::vector<size_t> keep;
    for (size_t i : alive)
      if (trials[i].best <= kKeepFactor[round] * best) keep.push_back(i);
    // The likely winner runs last in the next round, so its output is the one left in `out`.
    std::sort(keep.begin(), keep.end(), [&](size_t x, size_t y) { return trials[x].best > trials[y].best; });
    alive = std::move(keep);
  }
  return last_run;
}

// Picks the pass's implementation on first use (under the pass's lock, so concurrent first
// calls autotune once). Returns true when `out` already holds this call's result (the winner
// ran last among the trials), so the caller need not run it again.
bool choose(ConvEntry& e, PassState& ps, Pass pass, const float* a, const float* b, float* out) {
  const ConvShape& s = e.shape;
  const auto cands = candidates(s, pass);
  const Policy pol = policy();
  if (pol != Policy::kAutotune) {
    choose_fixed(e, ps, pass, cands, pol);
    return false;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string key = choice_key(s, pass);
  if (reuse_known_choice(e, ps, pass, cands, key)) return false;
  // Trial runs of the accumulating pass must not add to dx more than once: keep the original
  // and restore it before every run.
  std::vector<float> original;
  if (pass == Pass::kBackwardDataAcc) original.assign(out, out + s.in().numel());
  std::vector<Trial> trials = make_trials(e, pass, cands);
  int runs = 0;
  const size_t last_run = run_trials(e, pass, trials, a, b, out, original, runs);
  size_t win = 0;
  for (size_t i = 1; i < trials.size(); ++i)
    if (trials[i].best < trials[win].best) win = i;
  ps.variant = trials[win].variant;
  ps.impl = std::move(trials[win].impl);
  const bool ready = last_run == win;
  if (!ready && !original.empty()) std::copy(original.begin(), original.end(), out);
  {
    std::lock_guard<std::mutex> lock(choices_mu());
    choices().record(key, variant_name(ps.variant));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++counters().tuned;
  counters().trial_runs += runs;
  counters().wall_ns += static_cast<int64_t>(wall * 1e9);
  if (trials.size() > 1)
    log_debug("conv {}x{}x{}x{} -> {} k{} s{} {}: {} ({:.2f} CPU ms; {} trial runs, {:.1f} ms tuning)", s.n,
              s.c_in, s.h_in, s.w_in, s.c_out, s.kernel, s.stride, pass_name(pass),
              variant_name(ps.variant), trials[win].best * 1e3, runs, wall * 1e3);
  return ready;
}

void run(const ConvShape& s, Pass pass, const float* a, const float* b, float* out) {
  ConvEntry& e = entry(s);
  PassState& ps = e.pass[static_cast<int>(pass)];
  try {
    {
      std::lock_guard<std::mutex> lock(ps.mu);
      if (!ps.chosen) {
        const bool done = choose(e, ps, pass, a, b, out);
        ps.chosen = true;
        if (done) return;
      }
    }
    // The implementation is immutable once chosen; executing it concurrently is safe.
    execute(e, pass, ps.variant, *ps.impl, a, b, out);
  } catch (const dnnl::error& err) {
    DL_CHECK(false) << "conv2d " << pass_name(pass) << ": oneDNN error " << err.status << ": " << err.what();
  }
}

}  // namespace

ConvAutotuneStats conv_autotune_stats() {
  ConvAutotuneStats st;
  st.tuned = counters().tuned.load();
  st.reused = counters().reused.load();
  st.trial_runs = counters().trial_runs.load();
  st.seconds = 1e-9 * static_cast<double>(counters().wall_ns.load());
  std::lock_guard<std::mutex> lock(choices_mu());
  st.cache_path = choices().path();
  return st;
}

// bf16/fp16 (op_signatures.inc): fp32 arithmetic on the (already rounded) inputs, then the output
// rounded; the accumulating pass rounds the sum once, as a 16-bit output with beta = 1 would.
void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y, Dtype dtype) {
  ScopedOpTimer timer("conv2d_forward");
  run(s, Pass::kForward, x, w, y);
  if (dtype != Dtype::kF32) round_to_dtype(s.out().numel(), dtype, y, y);
}

void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx,
                          bool accumulate, Dtype dtype) {
  ScopedOpTimer timer("conv2d_backward_data");
  run(s, accumulate ? Pass::kBackwardDataAcc : Pass::kBackwardData, dy, w, dx);
  if (dtype != Dtype::kF32) round_to_dtype(s.in().numel(), dtype, dx, dx);
}

void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                             Dtype dtype) {
  ScopedOpTimer timer("conv2d_backward_weights");
  run(s, Pass::kBackwardWeights, x, dy, dw);
  if (dtype != Dtype::kF32) round_to_dtype(s.weight_numel(), dtype, dw, dw);
}

}  // namespace dlaunch::kernels::cpu
