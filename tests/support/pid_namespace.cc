#include "tests/support/pid_namespace.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace dlaunch::testing {
namespace {

const char kUnshare[] = "/usr/bin/unshare";

std::string namespace_of(pid_t pid) {
  char buf[64];
  std::string link = "/proc/" + std::to_string(pid) + "/ns/pid";
  ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string exe_of(pid_t pid) {
  std::error_code ec;
  auto target = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return ec ? "" : target.string();
}

}  // namespace

std::string pid_namespaces_unavailable() {
  if (::geteuid() != 0) return "making a PID namespace needs root";
  if (!file_exists(kUnshare)) return "no /usr/bin/unshare (util-linux)";
  auto r =
      run({kUnshare, "--pid", "--fork", "--mount-proc", "/bin/true"}, {}, std::chrono::seconds(30));
  if (r.timed_out || r.exit.shell_code() != 0) {
    return "unshare --pid --fork --mount-proc fails here: " + r.err;
  }
  return "";
}

PidNamespace::PidNamespace(const std::string& program, const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env) {
  std::vector<std::string> full = {kUnshare, "--pid", "--fork", "--mount-proc", "--kill-child"};
  full.insert(full.end(), argv.begin(), argv.end());
  unshare_ = std::make_unique<Subprocess>(full, env);
  // unshare forks the namespace's PID 1, which execs argv[0] (which may exec `program`).
  std::error_code ec;
  const std::string want = std::filesystem::canonical(program, ec).string();
  wait_until(
      [&] {
        for (pid_t child : children_of(unshare_->pid())) {
          if (exe_of(child) == want) {
            init_pid_ = child;
            namespace_id_ = namespace_of(child);
            return !namespace_id_.empty();
          }
        }
        return false;
      },
      std::chrono::seconds(30));
}

std::vector<NamespaceProcess> PidNamespace::processes() const {
  std::vector<NamespaceProcess> out;
  if (namespace_id_.empty()) return out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    int pid = std::atoi(e->d_name);
    if (pid <= 0 || namespace_of(pid) != namespace_id_) continue;
    std::string stat = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    NamespaceProcess p;
    p.pid = pid;
    if (std::sscanf(stat.c_str() + close + 2, "%c %d", &p.state, &p.ppid) != 2) continue;
    p.cmdline = read_proc_file("/proc/" + std::to_string(pid) + "/cmdline");
    while (!p.cmdline.empty() && p.cmdline.back() == '\0') p.cmdline.pop_back();
    for (char& c : p.cmdline) {
      if (c == '\0') c = ' ';
    }
    out.push_back(std::move(p));
  }
  ::closedir(d);
  return out;
}

}  // namespace dlaunch::testing
