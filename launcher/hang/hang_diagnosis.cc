#include "launcher/hang/hang_diagnosis.h"

#include <fmt/format.h>

#include <regex>
#include <sstream>

namespace dlaunch {

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// Python code that waits for peers: torch.distributed (collectives, the store, rendezvous) and
// DDP's module, which syncs buffers and parameters with collectives.
bool collective_python_frame(const PyFrame& f) {
  return contains(f.file, "torch/distributed/") ||
         contains(f.file, "torch/nn/parallel/distributed");
}

// Native code that waits for peers: c10d (process groups, DDP's Reducer, the TCPStore), gloo,
// NCCL, and dtrain's own process groups and gradient reducer (its main thread waits for the
// comm thread there, in a futex, not in gloo; the rest of its training step is compute). eu-stack and gdb print demangled C++ names.
// Only the function's own name counts, not its argument list: dtrain's run_training(...,
// dlaunch::comm::ProcessGroup&, ...) is on every rank's stack, stuck or not.
bool collective_native_frame(const std::string& frame) {
  std::string f = frame;
  const std::string anonymous = "(anonymous namespace)";
  for (size_t at; (at = f.find(anonymous)) != std::string::npos;) f.erase(at, anonymous.size());
  f = f.substr(0, f.find('('));
  return contains(f, "c10d::") || contains(f, "gloo::") || contains(f, "nccl") ||
         contains(f, "NCCL") || contains(f, "dlaunch::comm::") ||
         contains(f, "dlaunch::ddp::GradReducer::");
}

// Interpreter and library files: the frame that says where a script is stuck is the innermost
// one outside them ("wait_for_data (train.py:42)", not "wait (threading.py:320)").
bool library_file(const std::string& file) {
  return contains(file, "/lib/python3") || contains(file, "site-packages") ||
         contains(file, "dist-packages") || contains(file, "<frozen");
}

std::string base_name(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "#2  0x00007f2c84ca5023 c10d::Reducer::finalize_backward()" -> "c10d::Reducer::...()".
std::string native_function(const std::string& frame) {
  static const std::regex prefix(R"(^#\d+\s+(0x[0-9a-f]+\s+)?(in\s+)?)");
  return std::regex_replace(frame, prefix, "");
}

std::string describe(const PyFrame& f) {
  return fmt::format("{} ({}:{})", f.function, base_name(f.file), f.line);
}

}  // namespace

std::vector<PyThreadStack> parse_faulthandler_dump(const std::string& text) {
  static const std::regex header(R"(^(Current thread|Thread) 0x[0-9a-f]+ .*:\s*$)");
  static const std::regex frame(R"re(^\s+File "(.*)", line (\d+) in (.*?)\s*$)re");
  std::vector<PyThreadStack> threads;
  bool in_thread = false;
  std::smatch m;
  for (const auto& line : lines_of(text)) {
    if (std::regex_match(line, m, header)) {
      threads.push_back(PyThreadStack{m[1] == "Current thread", {}});
      in_thread = true;
    } else if (in_thread && std::regex_match(line, m, frame)) {
      threads.back().frames.push_back(PyFrame{m[1], std::stoi(m[2]), m[3]});
    } else {
      in_thread = false;
    }
  }
  return threads;
}

std::vector<std::string> native_thread_frames(const std::string& text, int tid) {
  const std::string eu = fmt::format("TID {}:", tid);
  const std::string gdb = fmt::format("(LWP {})", tid);
  std::vector<std::string> frames;
  bool in_thread = false;
  for (const auto& line : lines_of(text)) {
    bool eu_header = line.rfind("TID ", 0) == 0;
    bool gdb_header = line.rfind("Thread ", 0) == 0;
    if (eu_header || gdb_header) {
      if (in_thread) break;
      in_thread = eu_header ? line.rfind(eu, 0) == 0 : contains(line, gdb.c_str());
      continue;
    }
    if (in_thread && line.rfind('#', 0) == 0) frames.push_back(line);
  }
  return frames;
}

HangFinding diagnose_hang(const std::string& py_dump, const std::string& native, int pid) {
  HangFinding f;
  auto threads = parse_faulthandler_dump(py_dump);
  // The main thread was made first, and faulthandler lists the newest first.
  const PyThreadStack* main_thread = threads.empty() ? nullptr : &threads.back();
  if (main_thread && !main_thread->frames.empty()) {
    f.have_python = true;
    const auto& frames = main_thread->frames;
    const PyFrame* user = nullptr;
    for (const auto& fr : frames) {
      f.in_collective |= collective_python_frame(fr);
      if (!user && !library_file(fr.file)) user = &fr;
      f.python_stack +=
          fmt::format("  File \"{}\", line {} in {}\n", fr.file, fr.line, fr.function);
    }
    f.where = describe(frames.front());
    if (user && user != &frames.front()) f.where = describe(*user) + ", in " + f.where;
  }
  auto main_native = native_thread_frames(native, pid);
  if (!main_native.empty()) {
    f.have_native = true;
    for (const auto& fr : main_native) {
      if (collective_native_frame(fr)) {
        f.in_collective = true;
        f.where += (f.where.empty() ? "" : ", natively in ") + native_function(fr);
        break;
      }
    }
    if (f.where.empty()) f.where = native_function(main_native.front());
  }
  return f;
}

std::optional<size_t> pick_hang_root(const std::vector<HangFinding>& findings) {
  if (findings.empty()) return std::nullopt;
  // A stopped process cannot be a victim that will move once its peer does.
  for (size_t i = 0; i < findings.size(); ++i) {
    if (findings[i].stopped) return i;
  }
  // A rank whose stacks show it elsewhere beats one with no stacks at all (nothing known).
  for (bool need_stacks : {true, false}) {
    for (size_t i = 0; i < findings.size(); ++i) {
      const auto& f = findings[i];
      bool known = f.have_python || f.have_native;
      if (!f.in_collective && (known || !need_stacks)) return i;
    }
  }
  return 0;
}

}  // namespace dlaunch
