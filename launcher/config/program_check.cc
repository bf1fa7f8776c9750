#include "launcher/config/program_check.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/suggest.h"
#include "launcher/config/cli.h"
#include "launcher/process/posix_process_context.h"

extern char** environ;

namespace dlaunch {
namespace {

std::string absolute(const std::string& path, const std::string& cwd) {
  return !path.empty() && path[0] == '/' ? path : cwd + "/" + path;
}

// The file in `path`'s directory whose name is closest to its name (a typo: trian.py for
// train.py), as the user would type it; "" when none is close.
std::string closest_sibling(const std::string& path, const std::string& cwd) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string best;
  size_t best_distance = std::max<size_t>(1, std::min<size_t>(2, name.size() / 4));
  DIR* d = opendir(absolute(dir.empty() ? "." : dir, cwd).c_str());
  if (!d) return "";
  while (dirent* e = readdir(d)) {
    std::string candidate = e->d_name;
    if (candidate == "." || candidate == ".." || candidate == name) continue;
    size_t distance = edit_distance(name, candidate);
    if (distance <= best_distance && (best.empty() || distance < best_distance)) {
      best = candidate;
      best_distance = distance;
    }
  }
  closedir(d);
  return best.empty() ? "" : dir + best;
}

std::string did_you_mean(const std::string& path, const std::string& cwd) {
  std::string near = closest_sibling(path, cwd);
  return near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near);
}

std::optional<std::string> check_script(const LaunchConfig& cfg, const ProgramCheckEnv& env) {
  const std::string& script = cfg.program;
  std::string full = absolute(script, env.cwd);
  struct stat st;
  if (::stat(full.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return fmt::format(
          "python script '{}' was not found: no such file {}{}; check the name, or give its path "
          "relative to the directory dlaunch runs in",
          script, script[0] == '/' ? "" : "in " + env.cwd, did_you_mean(script, env.cwd));
    }
    return fmt::format("python script '{}' cannot be read: {}; check its permissions", script,
                       std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    if (::access((full + "/__main__.py").c_str(), F_OK) == 0) return std::nullopt;
    return fmt::format(
        "python script '{}' is a directory without __main__.py, not a script; give the path of "
        "the script inside it",
        script);
  }
  if (::access(full.c_str(), R_OK) != 0) {
    return fmt::format("python script '{}' cannot be read: {}; check its permissions", script,
                       std::strerror(errno));
  }
  return std::nullopt;
}

std::optional<std::string> check_module(const LaunchConfig& cfg, const ProgramCheckEnv& env) {
  if (!env.find_module) return std::nullopt;
  std::string top = cfg.program.substr(0, cfg.program.find('.'));
  if (top.empty()) return std::nullopt;  // a relative name (".x"): python says what is wrong
  std::optional<bool> found = env.find_module(cfg.python, top);
  if (!found || *found) return std::nullopt;
  return fmt::format(
      "module '{}' was not found: {} finds no module '{}' on its path (the directory dlaunch runs "
      "in, {}, PYTHONPATH, site-packages); check the name and the interpreter (--python), run "
      "dlaunch from the directory that holds '{}', or set PYTHONPATH",
      cfg.program, cfg.python, top, env.cwd, top);
}

// The interpreter a .py program or -m runs under (--python) must exist, or every worker's exec
// fails the same way.
std::optional<std::string> check_interpreter(const LaunchConfig& cfg, const ProgramCheckEnv& env) {
  const std::string& python = cfg.python;
  const bool found = python.find('/') == std::string::npos
                         ? !resolve_program(python, env.path).empty()
                         : ::access(absolute(python, env.cwd).c_str(), X_OK) == 0;
  if (found) return std::nullopt;
  return fmt::format(
      "the Python interpreter '{}' (--python) was not found{}; choose it with --python, e.g. "
      "--python /usr/bin/python3 for Debian's PyTorch",
      python, python.find('/') == std::string::npos ? " in PATH (" + env.path + ")" : "");
}

std::optional<std::string> check_direct(const LaunchConfig& cfg, const ProgramCheckEnv& env) {
  const std::string& program = cfg.program;
  if (program.find('/') == std::string::npos) {
    if (!resolve_program(program, env.path).empty()) return std::nullopt;
    std::string here = absolute(program, env.cwd);
    struct stat st;
    std::string hint;
    if (::stat(here.c_str(), &st) == 0) {
      hint = S_ISDIR(st.st_mode)
                 ? fmt::format("; '{}' here is a directory, not a program", program)
                 : fmt::format("; to run the '{}' in this directory, give its path: ./{}", program,
                               program);
    }
    return fmt::format("program '{}' was not found in PATH ({}){}{}", program, env.path,
                       hint.empty() ? "; give its full path or fix PATH" : hint,
                       hint.empty() ? did_you_mean(program, env.cwd) : "");
  }
  std::string full = absolute(program, env.cwd);
  struct stat st;
  if (::stat(full.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return fmt::format("program '{}' was not found: no such file{}; check the path", program,
                         did_you_mean(program, env.cwd));
    }
    return std::nullopt;  // the spawn names the errno
  }
  if (S_ISDIR(st.st_mode)) {
    return fmt::format(
        "program '{}' is a directory, not a program; give the path of the "
        "executable or script inside it",
        program);
  }
  return std::nullopt;
}

// Runs `python -c <find_spec> name` with stdio on /dev/null: exit 0 found, 3 not found.
std::optional<bool> run_find_spec(const std::string& python, const std::string& name,
                                  const std::string& path_env) {
  std::string exe = resolve_program(python, path_env);
  if (exe.empty()) return std::nullopt;
  static const char kScript[] =
      "import importlib.util, sys\n"
      "sys.exit(0 if importlib.util.find_spec(sys.argv[1]) is not None else 3)\n";
  std::vector<std::string> args = {exe, "-c", kScript, name};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd : {0, 1, 2}) {
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return std::nullopt;
  // Bounded: a broken site-packages (a .pth that hangs) must not keep dlaunch from starting.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int ready;
    do {
      ready = ::poll(&p, 1, 10000);
    } while (ready < 0 && errno == EINTR);
    ::close(pidfd);
    if (ready == 0) ::kill(pid, SIGKILL);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) return std::nullopt;
  if (WEXITSTATUS(status) == 0) return true;
  if (WEXITSTATUS(status) == 3) return false;
  return std::nullopt;
}

}  // namespace

ProgramCheckEnv current_program_check_env() {
  ProgramCheckEnv env;
  char buf[4096];
  env.cwd = ::getcwd(buf, sizeof(buf)) ? buf : ".";
  const char* path = std::getenv("PATH");
  env.path = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::string path_env = env.path;
  env.find_module = [path_env](const std::string& python, const std::string& name) {
    return run_find_spec(python, name, path_env);
  };
  return env;
}

std::optional<std::string> check_program(const LaunchConfig& cfg, const ProgramCheckEnv& env) {
  if (cfg.program.empty()) return std::nullopt;
  if (cfg.module || cfg.runs_python()) {
    if (auto problem = check_interpreter(cfg, env)) return problem;
  }
  if (cfg.module) return check_module(cfg, env);
  if (cfg.runs_python()) return check_script(cfg, env);
  return check_direct(cfg, env);
}

}  // namespace dlaunch
