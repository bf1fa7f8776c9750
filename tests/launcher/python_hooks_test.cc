// launcher/config/python_hooks.h: where the sitecustomize is found, the environment that turns it on,
// and the request for Python stacks, which must never signal a process that did not register.
#include "launcher/config/python_hooks.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace dlaunch {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    char t[] = "/tmp/python_hooks_test_XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

TEST(PythonHooks, FoundBesideTheBinaryInShareDlaunchPython) {
  TempDir d;
  fs::create_directories(d.path + "/bin");
  EXPECT_EQ(python_hooks_dir_for(d.path + "/bin/dlaunch"), "");
  fs::create_directories(d.path + "/share/dlaunch/python");
  std::ofstream(d.path + "/share/dlaunch/python/sitecustomize.py") << "\n";
  EXPECT_EQ(python_hooks_dir_for(d.path + "/bin/dlaunch"),
            fs::canonical(d.path + "/share/dlaunch/python").string());
}

TEST(PythonHooks, EnvPutsTheHooksFirstOnPythonPathAndKeepsTheUsersEntries) {
  std::vector<std::pair<std::string, std::string>> env{{"PYTHONPATH", "/mine:/more"},
                                                       {"HOME", "/h"}};
  add_python_hooks_env(env, "/opt/share/dlaunch/python", "/logs/0/py_stack.txt");
  auto get = [&](const std::string& k) {
    for (auto& kv : env) {
      if (kv.first == k) return kv.second;
    }
    return std::string("<unset>");
  };
  EXPECT_EQ(get("PYTHONPATH"), "/opt/share/dlaunch/python:/mine:/more");
  EXPECT_EQ(get(kPyStackFileEnv), "/logs/0/py_stack.txt");
  EXPECT_EQ(get(kPyStackSignalEnv), std::to_string(python_stack_signal()));
  EXPECT_EQ(env.size(), 4u);

  std::vector<std::pair<std::string, std::string>> bare;
  add_python_hooks_env(bare, "/d", "/f");
  EXPECT_EQ(bare.front(), std::make_pair(std::string("PYTHONPATH"), std::string("/d")));
}

// A child in its own process group, which dies of the real-time signal when it gets it (no
// handler): the request must send it only when the file registers this pid.
TEST(PythonHooks, RequestSignalsOnlyRegisteredProcessesOfTheGroup) {
  TempDir d;
  std::string file = d.path + "/py_stack.txt";
  pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    ::pause();
    ::_exit(0);
  }
  ::setpgid(child, child);
  // Not registered: nothing sent.
  EXPECT_FALSE(request_python_stacks(file, child).has_value());
  std::ofstream(file) << "dlaunch-python-stacks pid=" << child << " signal=37\n";
  // Registered, but the group named is another: nothing sent.
  EXPECT_FALSE(request_python_stacks(file, child + 100000).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WNOHANG), 0) << "signalled although not asked to";
  auto offset = request_python_stacks(file, child);
  ASSERT_TRUE(offset.has_value());
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), python_stack_signal());
  EXPECT_EQ(read_python_stacks(file, *offset).rfind("--- dlaunch: Python stacks requested", 0), 0u);
}

}  // namespace
}  // namespace dlaunch
