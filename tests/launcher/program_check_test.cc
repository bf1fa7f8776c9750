// The check that runs before anything starts (launcher/config/program_check.h): a program that cannot
// run is a usage error at once, not a failure every attempt repeats.
#include "launcher/config/program_check.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace dlaunch {
namespace {

class ProgramCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/dlaunch_program_check_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    env_.cwd = dir_;
    env_.path = "/usr/bin:/bin";
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  void touch(const std::string& name) { std::ofstream(dir_ + "/" + name) << "print(1)\n"; }
  LaunchConfig script(const std::string& program) {
    LaunchConfig c;
    c.program = program;
    return c;
  }
  std::string dir_;
  ProgramCheckEnv env_;
};

// `dlaunch --max_restarts 2 trian.py` spent every restart on a script that does not exist.
TEST_F(ProgramCheck, MissingScriptIsNotFoundAndACloseNameIsSuggested) {
  touch("train.py");
  auto problem = check_program(script("trian.py"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("python script 'trian.py' was not found"), std::string::npos) << *problem;
  EXPECT_NE(problem->find(dir_), std::string::npos) << *problem;
  EXPECT_NE(problem->find("did you mean 'train.py'?"), std::string::npos) << *problem;
  EXPECT_FALSE(check_program(script("train.py"), env_));
  EXPECT_FALSE(check_program(script(dir_ + "/train.py"), env_));
  problem = check_program(script(dir_ + "/sub/none.py"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("was not found"), std::string::npos) << *problem;
}

// `--python py3 train.py` failed only at each worker's exec; --dry_run said nothing.
TEST_F(ProgramCheck, AMissingInterpreterIsSaidBeforeAnythingStarts) {
  touch("train.py");
  for (const std::string python : {"py3", "/nonexistent/python3"}) {
    LaunchConfig c = script("train.py");
    c.python = python;
    auto problem = check_program(c, env_);
    ASSERT_TRUE(problem) << python;
    EXPECT_NE(problem->find("the Python interpreter '" + python + "' (--python) was not found"),
              std::string::npos)
        << *problem;
    c.module = true;
    c.program = "json";
    EXPECT_TRUE(check_program(c, env_)) << "-m runs under the interpreter too";
  }
  LaunchConfig direct = script("/bin/true");
  direct.no_python = true;
  direct.python = "py3";
  EXPECT_FALSE(check_program(direct, env_)) << "--no_python runs no interpreter";
}

TEST_F(ProgramCheck, ScriptDirectoryNeedsMainPy) {
  ASSERT_EQ(mkdir((dir_ + "/app.py").c_str(), 0755), 0);
  auto problem = check_program(script("app.py"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("is a directory without __main__.py"), std::string::npos) << *problem;
  touch("app.py/__main__.py");  // python runs a directory holding __main__.py
  EXPECT_FALSE(check_program(script("app.py"), env_));
}

// exec of a directory fails with EACCES, whose advice was "chmod +x".
TEST_F(ProgramCheck, DirectoryAsProgramIsADirectoryNotChmod) {
  ASSERT_EQ(mkdir((dir_ + "/tool").c_str(), 0755), 0);
  auto problem = check_program(script(dir_ + "/tool"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("is a directory"), std::string::npos) << *problem;
  EXPECT_EQ(problem->find("chmod"), std::string::npos) << *problem;
  problem = check_program(script("./tool"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("is a directory"), std::string::npos) << *problem;
  // A bare name is looked up in PATH; the directory here is named as the likely confusion.
  problem = check_program(script("tool"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("'tool' was not found in PATH"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("is a directory"), std::string::npos) << *problem;
}

TEST_F(ProgramCheck, DirectProgramsOnPathOrByPath) {
  EXPECT_FALSE(check_program(script("sh"), env_));
  EXPECT_FALSE(check_program(script("/bin/sh"), env_));
  auto problem = check_program(script("no_such_program_dlaunch"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("'no_such_program_dlaunch' was not found in PATH (/usr/bin:/bin)"),
            std::string::npos)
      << *problem;
  problem = check_program(script(dir_ + "/missing"), env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("was not found: no such file"), std::string::npos) << *problem;
  // Found but not executable: left to the spawn, which reports the errno with the path.
  touch("plain");
  EXPECT_FALSE(check_program(script(dir_ + "/plain"), env_));
  // --no_python runs a .py directly: the direct rules apply.
  LaunchConfig direct = script("trian.py");
  direct.no_python = true;
  problem = check_program(direct, env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("was not found in PATH"), std::string::npos) << *problem;
}

TEST_F(ProgramCheck, ModuleIsCheckedByItsTopLevelPackageOnly) {
  std::vector<std::string> asked;
  std::optional<bool> answer = false;
  env_.find_module = [&](const std::string& python, const std::string& name) {
    asked.push_back(python + " " + name);
    return answer;
  };
  LaunchConfig m = script("pkg.train");
  m.module = true;
  m.python = "/usr/bin/python3";
  auto problem = check_program(m, env_);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("module 'pkg.train' was not found: /usr/bin/python3 finds no module "
                          "'pkg'"),
            std::string::npos)
      << *problem;
  EXPECT_EQ(asked, (std::vector<std::string>{"/usr/bin/python3 pkg"}));
  answer = true;
  EXPECT_FALSE(check_program(m, env_));
  answer = std::nullopt;  // the interpreter could not tell: the worker will
  EXPECT_FALSE(check_program(m, env_));
}

// The real interpreter, when Debian's python3 is installed.
TEST_F(ProgramCheck, RealInterpreterFindsModules) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  ProgramCheckEnv real = current_program_check_env();
  real.cwd = dir_;
  LaunchConfig m = script("json.tool");
  m.module = true;
  m.python = "/usr/bin/python3";
  EXPECT_FALSE(check_program(m, real));
  m.program = "no_such_module_dlaunch.train";
  auto problem = check_program(m, real);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("was not found"), std::string::npos) << *problem;
}

}  // namespace
}  // namespace dlaunch
