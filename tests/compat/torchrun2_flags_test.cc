// torchrun 2.15's flags side by side: each test runs the same command line under torchrun 2.15
// (`<venv python> -m torch.distributed.run`) and under dlaunch, with /bin/sh workers
// (--no-python), and compares what can be observed: the workers' environment, the console lines,
// the files, what a signal does. Skipped when the PyTorch 2.15 venv is absent
// (DLAUNCH_TORCH2_PYTHON, tests/CMakeLists.txt). Timeouts are generous: torchrun imports torch
// (5-25 s on the shared 2-core machine).
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN;
const std::string kTorch2Python = DLAUNCH_TORCH2_PYTHON;
constexpr auto kJobTimeout = 240s;

bool torch2_missing() {
  static const bool missing = [] {
    if (access(kTorch2Python.c_str(), X_OK) != 0) return true;
    auto probe = run({kTorch2Python, "-c", "import torch.distributed.run"}, {}, 180s);
    return probe.timed_out || probe.exit.shell_code() != 0;
  }();
  return missing;
}

#define SKIP_WITHOUT_TORCH2()                                                               \
  if (torch2_missing())                                                                     \
  GTEST_SKIP() << "no PyTorch 2.15 at " << kTorch2Python                                    \
               << "; scripts/setup.sh --test makes the venv, or configure with "            \
                  "-DDLAUNCH_TORCH2_PYTHON=<a python with torch 2.15>"

enum class Launcher { kTorchrun, kDlaunch };
const char* name(Launcher l) { return l == Launcher::kTorchrun ? "torchrun 2.15" : "dlaunch"; }

// The launcher's argv for `flags` (torchrun's spellings, which dlaunch accepts) and the worker.
std::vector<std::string> launcher_argv(Launcher l, const std::vector<std::string>& flags,
                                       const std::vector<std::string>& worker) {
  std::vector<std::string> argv =
      l == Launcher::kTorchrun
          ? std::vector<std::string>{kTorch2Python, "-m", "torch.distributed.run"}
          : std::vector<std::string>{kDlaunch};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), worker.begin(), worker.end());
  return argv;
}

void write_script(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  chmod(path.c_str(), 0755);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The lines of `text` that contain `marker`, sorted (workers print in any order).
std::vector<std::string> lines_containing(const std::string& text, const std::string& marker) {
  std::vector<std::string> out;
  for (auto& line : split_lines(text)) {
    if (line.find(marker) != std::string::npos) out.push_back(line);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Every regular file named `name` below `dir`.
std::vector<std::string> find_files(const std::string& dir, const std::string& name) {
  std::vector<std::string> found;
  DIR* d = opendir(dir.c_str());
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    std::string entry = e->d_name;
    if (entry == "." || entry == "..") continue;
    std::string path = dir + "/" + entry;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      auto below = find_files(path, name);
      found.insert(found.end(), below.begin(), below.end());
    } else if (entry == name) {
      found.push_back(path);
    }
  }
  closedir(d);
  return found;
}

// What each worker wrote to OUT_DIR/<RANK> (worker_env.sh below), by rank.
std::map<std::string, std::string> per_rank_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const char* rank : {"0", "1"}) {
    if (file_exists(dir + "/" + rank)) out[rank] = read_file(dir + "/" + rank);
  }
  return out;
}

// A worker that writes its launcher-given environment to $OUT_DIR/$RANK.
const char* kEnvWorker =
    "#!/bin/sh\n"
    "echo \"LOCAL_RANK=$LOCAL_RANK CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} "
    "TORCHELASTIC_SIGNALS_TO_HANDLE=$TORCHELASTIC_SIGNALS_TO_HANDLE\" > \"$OUT_DIR/$RANK\"\n";

class Torchrun2Flags : public ::testing::Test {
 protected:
  TempDir dir_;

  // Runs `flags` + worker under `l` with OUT_DIR=<fresh dir>; returns that dir's path.
  std::string run_env_worker(Launcher l, const std::vector<std::string>& flags,
                             std::map<std::string, std::string> env, RunResult* result) {
    std::string out = dir_.file(std::string(l == Launcher::kTorchrun ? "t" : "d") +
                                std::to_string(counter_++));
    mkdir(out.c_str(), 0755);
    write_script(dir_.file("env_worker.sh"), kEnvWorker);
    env["OUT_DIR"] = out;
    *result = run(launcher_argv(l, flags, {"/bin/sh", dir_.file("env_worker.sh")}), env,
                  kJobTimeout);
    return out;
  }

 private:
  int counter_ = 0;
};

// --virtual-local-rank, also as PET_VIRTUAL_LOCAL_RANK: every worker has LOCAL_RANK=0 and its
// own entry of the inherited CUDA_VISIBLE_DEVICES (or its local rank when none is inherited).
// The workers also inherit --signals-to-handle as TORCHELASTIC_SIGNALS_TO_HANDLE.
TEST_F(Torchrun2Flags, VirtualLocalRankGivesEachWorkerItsDeviceAsZero) {
  SKIP_WITHOUT_TORCH2();
  struct Case {
    std::vector<std::string> flags;
    std::map<std::string, std::string> env;
  };
  std::vector<Case> cases = {
      {{"--nproc-per-node=2", "--virtual-local-rank", "--no-python"},
       {{"CUDA_VISIBLE_DEVICES", "3,5"}}},
      {{"--nproc-per-node=2", "--no-python"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}},
      {{"--nproc-per-node=2", "--no-python", "--signals-to-handle", "SIGTERM, SIGUSR1"},
       {{"CUDA_VISIBLE_DEVICES", "2,1"}}},
  };
  for (const auto& c : cases) {
    std::map<std::string, std::string> seen[2];
    for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
      RunResult r;
      std::string out = run_env_worker(l, c.flags, c.env, &r);
      ASSERT_EQ(r.exit.shell_code(), 0) << name(l) << "\n" << r.err;
      seen[static_cast<int>(l)] = per_rank_files(out);
    }
    EXPECT_EQ(seen[0], seen[1]) << "torchrun 2.15 and dlaunch differ";
    EXPECT_EQ(seen[1].size(), 2u);
  }
  // What the first case looks like, so that agreeing on something else cannot pass.
  RunResult r;
  std::string out = run_env_worker(Launcher::kDlaunch, cases[0].flags, cases[0].env, &r);
  auto files = per_rank_files(out);
  const std::string signals = " TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT\n";
  EXPECT_EQ(files["0"], "LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=3" + signals);
  EXPECT_EQ(files["1"], "LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=5" + signals);
}

// 2.15's default for one node without --master-port: a free port and a fresh run id, not 29500
// and "none"; with --master-port, the port given and "none".
TEST_F(Torchrun2Flags, OneNodeWithoutMasterPortTakesAFreePortAndAFreshRunId) {
  SKIP_WITHOUT_TORCH2();
  write_script(dir_.file("store.sh"),
               "#!/bin/sh\necho \"$MASTER_PORT $TORCHELASTIC_RUN_ID\" > \"$OUT_DIR/$RANK\"\n");
  int given_port = free_port();
  for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
    std::string out = dir_.file(std::string("store_") + (l == Launcher::kTorchrun ? "t" : "d"));
    mkdir(out.c_str(), 0755);
    auto r = run(launcher_argv(l, {"--nproc-per-node=1", "--no-python"},
                               {"/bin/sh", dir_.file("store.sh")}),
                 {{"OUT_DIR", out}}, kJobTimeout);
    ASSERT_EQ(r.exit.shell_code(), 0) << name(l) << "\n" << r.err;
    std::istringstream line(read_file(out + "/0"));
    int port = 0;
    std::string run_id;
    line >> port >> run_id;
    EXPECT_GT(port, 0) << name(l);
    EXPECT_NE(port, 29500) << name(l) << " used the fixed default port";
    EXPECT_NE(run_id, "none") << name(l);
    EXPECT_FALSE(run_id.empty()) << name(l);

    auto given = run(launcher_argv(l, {"--nproc-per-node=1", "--no-python", "--master-port",
                                       std::to_string(given_port)},
                                   {"/bin/sh", dir_.file("store.sh")}),
                     {{"OUT_DIR", out}}, kJobTimeout);
    ASSERT_EQ(given.exit.shell_code(), 0) << name(l) << "\n" << given.err;
    EXPECT_EQ(read_file(out + "/0"), std::to_string(given_port) + " none\n") << name(l);
  }
}

// --log-line-prefix-template (its four macros, "$$" and an unknown macro) with -t 3, and
// --duplicate-stdout-filters/--duplicate-stderr-filters: the same console lines and the same
// filtered_stdout.log / filtered_stderr.log in the attempt's directory.
TEST_F(Torchrun2Flags, LogLinePrefixTemplateAndDuplicateFilters) {
  SKIP_WITHOUT_TORCH2();
  write_script(dir_.file("talk.sh"),
               "#!/bin/sh\n"
               "echo \"talk apple $RANK\"\n"
               "echo \"talk orange $RANK\"\n"
               "echo \"talk or,ange $RANK\"\n"
               "echo \"talk pear $RANK\" >&2\n"
               "echo \"talk plum $RANK\" >&2\n");
  const std::string tmpl = "<${hostname}|${rank}|${local_rank}|${role_name}|$$|${other}|$rank> ";
  std::vector<std::string> console[2], filtered_out[2], filtered_err[2];
  for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
    std::string logs = dir_.file(std::string("logs_") + (l == Launcher::kTorchrun ? "t" : "d"));
    auto r = run(launcher_argv(l,
                               {"--nproc-per-node=2", "--no-python", "--role", "trainer",
                                "--tee", "3", "--log-dir", logs, "--log-line-prefix-template",
                                tmpl, "--duplicate-stdout-filters", "apple,or,,ange",
                                "--duplicate-stderr-filters", "pear"},
                               {"/bin/sh", dir_.file("talk.sh")}),
                 {}, kJobTimeout);
    ASSERT_EQ(r.exit.shell_code(), 0) << name(l) << "\n" << r.err;
    int i = static_cast<int>(l);
    console[i] = lines_containing(r.out + r.err, "talk ");
    auto out_files = find_files(logs, "filtered_stdout.log");
    auto err_files = find_files(logs, "filtered_stderr.log");
    ASSERT_EQ(out_files.size(), 1u) << name(l);
    ASSERT_EQ(err_files.size(), 1u) << name(l);
    EXPECT_NE(out_files[0].find("/attempt_0/filtered_stdout.log"), std::string::npos)
        << out_files[0];
    filtered_out[i] = lines_containing(read_file(out_files[0]), "");
    filtered_err[i] = lines_containing(read_file(err_files[0]), "");
  }
  EXPECT_EQ(console[0], console[1]) << "console lines differ";
  EXPECT_EQ(filtered_out[0], filtered_out[1]) << "filtered_stdout.log differs";
  EXPECT_EQ(filtered_err[0], filtered_err[1]) << "filtered_stderr.log differs";
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string p1 = "<" + std::string(host) + "|1|1|trainer|$|${other}|1> ";
  EXPECT_NE(std::find(console[1].begin(), console[1].end(), p1 + "talk apple 1"),
            console[1].end());
  EXPECT_EQ(filtered_out[1].size(), 4u);  // apple and or,ange of both ranks; orange is not one
  EXPECT_EQ(filtered_err[1].size(), 2u);
}

// --run-path runs the program in python whatever its name, as runpy.run_path: __name__ is
// __main__ and sys.argv is the script and its arguments. It wins over --no-python.
TEST_F(Torchrun2Flags, RunPathRunsTheProgramAsPythonMain) {
  SKIP_WITHOUT_TORCH2();
  std::string script = dir_.file("job");  // no .py
  write_script(script,
               "import os, sys\n"
               "with open(os.path.join(os.environ['OUT_DIR'], os.environ['RANK']), 'w') as f:\n"
               "    f.write(f'{__name__} {sys.argv}\\n')\n");
  std::map<std::string, std::string> seen[2];
  for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
    std::string out = dir_.file(std::string("rp_") + (l == Launcher::kTorchrun ? "t" : "d"));
    mkdir(out.c_str(), 0755);
    std::vector<std::string> flags = {"--nproc-per-node=2", "--run-path", "--no-python"};
    if (l == Launcher::kDlaunch) flags.push_back("--python=" + kTorch2Python);
    auto r = run(launcher_argv(l, flags, {script, "a", "b c"}), {{"OUT_DIR", out}}, kJobTimeout);
    ASSERT_EQ(r.exit.shell_code(), 0) << name(l) << "\n" << r.err;
    seen[static_cast<int>(l)] = per_rank_files(out);
  }
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[1]["0"], "__main__ ['" + script + "', 'a', 'b c']\n");
}

// A worker that says when it is running, and on `sig` writes got-<sig>, takes 2 s to finish
// and writes finished.
std::string trapping_worker(const std::string& sig) {
  return "#!/bin/sh\n"
         "trap 'echo got-" + sig + " >> \"$OUT_DIR/$RANK\"; sleep 2; echo finished >> "
         "\"$OUT_DIR/$RANK\"; exit 0' " + sig + "\n"
         "echo running > \"$OUT_DIR/ready.$RANK\"\n"
         "while :; do sleep 0.1; done\n";
}

// Starts `flags` + the trapping worker under `l`, sends `sig` to the launcher once the worker
// runs, waits for the launcher's end; returns what the worker wrote.
std::string signal_run(const TempDir& dir, Launcher l, const std::vector<std::string>& flags,
                       const std::string& sig_name, int sig,
                       std::map<std::string, std::string> env, const std::string& tag) {
  std::string out = dir.file(tag + (l == Launcher::kTorchrun ? "_t" : "_d"));
  mkdir(out.c_str(), 0755);
  write_script(dir.file("trap_" + sig_name + ".sh"), trapping_worker(sig_name));
  env["OUT_DIR"] = out;
  Subprocess p(launcher_argv(l, flags, {"/bin/sh", dir.file("trap_" + sig_name + ".sh")}), env);
  EXPECT_TRUE(wait_until(
      [&] { return file_exists(out + "/ready.0") || !process_alive(p.pid()); }, kJobTimeout));
  EXPECT_TRUE(file_exists(out + "/ready.0"))
      << name(l) << " did not start the worker\n"
      << p.err();
  // The shell set its trap before it wrote ready.0; give the launcher a moment to settle.
  usleep(300 * 1000);
  p.signal(sig);
  auto st = p.wait(kJobTimeout);
  EXPECT_TRUE(st.has_value()) << name(l) << " did not end after " << sig_name;
  if (st) {
    EXPECT_NE(st->shell_code(), 0) << name(l);
  }
  return file_exists(out + "/0") ? read_file(out + "/0") : "";
}

// --shutdown-timeout (and TORCH_ELASTIC_SHUTDOWN_TIMEOUT): how long a stopped worker may take
// before SIGKILL. 0: it is killed before it can finish; 30: it finishes its 2 s.
TEST_F(Torchrun2Flags, ShutdownTimeoutIsTheGraceBeforeSigkill) {
  SKIP_WITHOUT_TORCH2();
  for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
    std::string killed = signal_run(dir_, l, {"--no-python", "--shutdown-timeout", "0"},
                                    "TERM", SIGTERM, {}, "timeout0");
    EXPECT_EQ(killed.find("finished"), std::string::npos) << name(l) << ": " << killed;
    std::string waited = signal_run(dir_, l, {"--no-python"}, "TERM", SIGTERM,
                                    {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"}}, "timeout30");
    EXPECT_EQ(waited, "got-TERM\nfinished\n") << name(l);
  }
}

// --signals-to-handle: SIGQUIT, in the default list, and a signal added to it (SIGALRM) are
// forwarded to the workers and stop the job.
TEST_F(Torchrun2Flags, SignalsToHandleAreForwardedAndStopTheJob) {
  SKIP_WITHOUT_TORCH2();
  for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
    std::string quit = signal_run(dir_, l, {"--no-python"}, "QUIT", SIGQUIT, {}, "quit");
    EXPECT_EQ(quit, "got-QUIT\nfinished\n") << name(l);
    std::string alarm = signal_run(
        dir_, l, {"--no-python", "--signals-to-handle", "SIGTERM,SIGINT,SIGALRM"}, "ALRM",
        SIGALRM, {}, "alarm");
    EXPECT_EQ(alarm, "got-ALRM\nfinished\n") << name(l);
  }
}

// The default values of --event-log-handler and --logs-specs work in both; dlaunch refuses
// others, and --numa-binding, with a sentence naming the flag.
TEST_F(Torchrun2Flags, EventLogHandlerAndLogsSpecsDefaultsWorkOthersAreRefused) {
  SKIP_WITHOUT_TORCH2();
  for (Launcher l : {Launcher::kTorchrun, Launcher::kDlaunch}) {
    auto r = run(launcher_argv(l, {"--no-python", "--event-log-handler", "null", "--logs-specs",
                                   "default"},
                               {"/bin/true"}),
                 {}, kJobTimeout);
    EXPECT_EQ(r.exit.shell_code(), 0) << name(l) << "\n" << r.err;
  }
  for (std::vector<std::string> flags : {std::vector<std::string>{"--event-log-handler",
                                                                  "console"},
                                         {"--logs-specs", "mine"},
                                         {"--numa-binding", "node"}}) {
    flags.insert(flags.end(), {"--no-python", "/bin/true"});
    auto r = run(launcher_argv(Launcher::kDlaunch, flags, {}), {}, 60s);
    EXPECT_EQ(r.exit.shell_code(), 2) << flags[0];
    EXPECT_NE(r.err.find(flags[0] + "="), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace dlaunch::testing
