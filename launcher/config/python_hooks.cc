#include "launcher/config/python_hooks.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <set>

#include "common/log.h"

namespace dlaunch {

int python_stack_signal() {
  return SIGRTMIN + 3;
}

std::string python_hooks_dir_for(const std::string& exe) {
  size_t slash = exe.rfind('/');
  if (slash == std::string::npos) return "";
  std::string bin = exe.substr(0, slash);
  std::string dir = bin + "/../share/dlaunch/python";
  std::string file = dir + "/" + kPythonHooksFile;
  if (::access(file.c_str(), R_OK) != 0) return "";
  char resolved[PATH_MAX];
  if (::realpath(dir.c_str(), resolved) == nullptr) return dir;
  return resolved;
}

std::string python_hooks_dir() {
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  return python_hooks_dir_for(std::string(self, static_cast<size_t>(n)));
}

void add_python_hooks_env(std::vector<std::pair<std::string, std::string>>& env,
                          const std::string& dir, const std::string& stack_file) {
  auto set = [&env](const std::string& name, const std::string& value) {
    for (auto& kv : env) {
      if (kv.first == name) {
        kv.second = value;
        return;
      }
    }
    env.emplace_back(name, value);
  };
  std::string path = dir;
  for (const auto& kv : env) {
    if (kv.first == "PYTHONPATH" && !kv.second.empty()) path += ":" + kv.second;
  }
  set("PYTHONPATH", path);
  set(kPyStackFileEnv, stack_file);
  set(kPyStackSignalEnv, std::to_string(python_stack_signal()));
}

namespace {

// Pids from the registration lines of `text`.
std::set<int> registered_pids(const std::string& text) {
  std::set<int> pids;
  const std::string key = kPyStackRegistration;
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at != 0 && text[at - 1] != '\n') continue;
    try {
      pids.insert(std::stoi(text.substr(at + key.size(), 12)));
    } catch (const std::exception&) {
    }
  }
  return pids;
}

}  // namespace

std::optional<uint64_t> request_python_stacks(const std::string& stack_file, int pgid) {
  std::string before = read_python_stacks(stack_file, 0);
  std::vector<int> targets;
  std::set<int> registered = registered_pids(before);
  if (registered.count(pgid)) {
    // The worker itself runs Python: only it. Its spawned children (DataLoader workers) register
    // too, and their dumps would interleave with its own in the one file.
    targets.push_back(pgid);
  } else {
    // A wrapper (a shell script) started Python: the processes of its group that registered. A
    // registered pid that left the worker's group is gone or reused: never signal it.
    for (int pid : registered) {
      if (pid > 0 && ::getpgid(pid) == pgid) targets.push_back(pid);
    }
  }
  if (targets.empty()) return std::nullopt;
  int fd = ::open(stack_file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  uint64_t offset = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : before.size();
  std::string marker =
      fmt::format("--- dlaunch: Python stacks requested (signal {}) of pid(s) {}\n",
                  python_stack_signal(), fmt::join(targets, ", "));
  ssize_t ignored = ::write(fd, marker.data(), marker.size());
  (void)ignored;
  ::close(fd);
  for (int pid : targets) {
    if (::kill(pid, python_stack_signal()) != 0) {
      log_debug("could not ask pid {} for its Python stacks: {}", pid, std::strerror(errno));
    }
  }
  return offset;
}

std::string read_python_stacks(const std::string& stack_file, uint64_t offset) {
  constexpr uint64_t kMax = 1 << 20;
  std::ifstream in(stack_file, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  std::string text(kMax, '\0');
  in.read(text.data(), static_cast<std::streamsize>(kMax));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace dlaunch
