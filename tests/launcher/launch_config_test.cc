#include "launcher/config/config_resolution.h"
#include "launcher/config/launch_config.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>

#include "common/env.h"
#include "common/error.h"

namespace dlaunch {
namespace {

LaunchConfig resolve(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                     HostInfo host = HostInfo{8, 0, "feedfacecafebeef"}) {
  auto lookup = [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  return resolve_config(parse_cli(args), lookup, host);
}

std::string usage_error(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  try {
    resolve(args, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchConfig, DefaultsAreTorchruns) {
  auto c = resolve({"p"});
  EXPECT_EQ(c.nproc_per_node, 1);
  EXPECT_EQ(c.min_nodes, 1);
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.master_addr, "127.0.0.1");
  // torchrun 2.x: one node without --master_port: a free port and a fresh run id.
  EXPECT_EQ(c.master_port, 0);
  EXPECT_EQ(c.run_id, "feedfacecafebeef");
  EXPECT_EQ(c.monitor_interval, 0.1);
  EXPECT_EQ(c.stop_signals, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(c.shutdown_grace, std::chrono::seconds(5));
  c = resolve({"--nnodes", "2", "p"});
  EXPECT_EQ(c.master_port, 29500);
  EXPECT_EQ(c.run_id, "none");
  EXPECT_EQ(c.rdzv_backend, "static");
  EXPECT_EQ(c.role, "default");
  EXPECT_EQ(c.max_restarts, 0);
  EXPECT_EQ(c.origin.at("nproc_per_node"), "default");
}

TEST(LaunchConfig, FlagBeatsEnvTwinBeatsDefault) {
  auto c = resolve({"p"}, {{"DLAUNCH_NPROC_PER_NODE", "3"}, {"DLAUNCH_ROLE", "x"}});
  EXPECT_EQ(c.nproc_per_node, 3);
  EXPECT_EQ(c.origin.at("nproc_per_node"), "DLAUNCH_NPROC_PER_NODE");
  EXPECT_EQ(c.role, "x");
  c = resolve({"--nproc-per-node=5", "p"}, {{"DLAUNCH_NPROC_PER_NODE", "3"}});
  EXPECT_EQ(c.nproc_per_node, 5);
  EXPECT_EQ(c.origin.at("nproc_per_node"), "--nproc-per-node");
  EXPECT_NE(c.describe().find("--nproc-per-node"), std::string::npos);
}

TEST(LaunchConfig, TorchrunTwinsComeAfterOurs) {
  auto c = resolve({"p"}, {{"PET_NPROC_PER_NODE", "4"}, {"PET_MAX_RESTARTS", "2"}});
  EXPECT_EQ(c.nproc_per_node, 4);
  EXPECT_EQ(c.origin.at("nproc_per_node"), "PET_NPROC_PER_NODE");
  EXPECT_EQ(c.max_restarts, 2);
  c = resolve({"p"}, {{"PET_NPROC_PER_NODE", "4"}, {"DLAUNCH_NPROC_PER_NODE", "3"}});
  EXPECT_EQ(c.nproc_per_node, 3);
  // dlaunch-only flags have no PET_ twin.
  c = resolve({"p"}, {{"PET_HANG_TIMEOUT", "9"}});
  EXPECT_EQ(c.hang_timeout.count(), 0);
}

TEST(LaunchConfig, NprocKeywords) {
  EXPECT_EQ(resolve({"--nproc_per_node", "cpu", "p"}).nproc_per_node, 8);
  EXPECT_EQ(resolve({"--nproc_per_node", "auto", "p"}).nproc_per_node, 8);
  EXPECT_EQ(resolve({"--nproc_per_node", "auto", "p"}, {}, HostInfo{8, 2, "x"}).nproc_per_node, 2);
  EXPECT_NE(usage_error({"--nproc_per_node", "gpu", "p"}).find("no visible GPU"), std::string::npos);
  EXPECT_NE(usage_error({"--nproc_per_node", "many", "p"}).find("cpu, gpu or auto"),
            std::string::npos);
}

TEST(LaunchConfig, StandalonePicksPortAndRunId) {
  auto c = resolve({"--standalone", "p"});
  EXPECT_EQ(c.master_port, 0);
  EXPECT_EQ(c.run_id, "feedfacecafebeef");
  c = resolve({"--standalone", "--rdzv_id", "mine", "--master_port", "1234", "p"});
  EXPECT_EQ(c.run_id, "mine");
  EXPECT_EQ(c.master_port, 1234);
}

TEST(LaunchConfig, ElasticRangeDefaultsToC10d) {
  auto c = resolve({"--nnodes", "2:4", "--rdzv_endpoint", "10.0.0.1:29400", "p"});
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.rdzv_backend, "c10d");
  EXPECT_NE(usage_error({"--nnodes", "2:4", "--rdzv_backend", "static", "p"}).find("static"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "2", "--node_rank", "2", "p"}).find("--node_rank"),
            std::string::npos);
}

TEST(LaunchConfig, RdzvConf) {
  auto c = resolve({"--rdzv_conf", "join_timeout=60, last_call_timeout=1", "p"});
  EXPECT_EQ(c.rdzv_conf.at("join_timeout"), "60");
  EXPECT_EQ(c.rdzv_conf.at("last_call_timeout"), "1");
  EXPECT_NE(usage_error({"--rdzv_conf", "oops", "p"}).find("key=value"), std::string::npos);
}

TEST(LaunchConfig, StdSpecs) {
  EXPECT_EQ(parse_std_spec("3", "-r").for_rank(5), 3);
  auto s = parse_std_spec("0:1,1:2", "-r");
  EXPECT_EQ(s.for_rank(0), 1);
  EXPECT_EQ(s.for_rank(1), 2);
  EXPECT_EQ(s.for_rank(2), 0);
  EXPECT_THROW(parse_std_spec("4", "-r"), UsageError);
  EXPECT_THROW(parse_std_spec("0:1,x:2", "-r"), UsageError);
  EXPECT_THROW(parse_std_spec("", "-r"), UsageError);
}

TEST(LaunchConfig, WorkerArgv) {
  auto c = resolve({"train.py", "--lr", "0.1"});
  EXPECT_EQ(c.worker_argv(0), (std::vector<std::string>{"python3", "-u", "train.py", "--lr", "0.1"}));
  c = resolve({"--python", "/usr/bin/python3", "-m", "pkg.train", "x"});
  EXPECT_EQ(c.worker_argv(1),
            (std::vector<std::string>{"/usr/bin/python3", "-u", "-m", "pkg.train", "x"}));
  c = resolve({"--no_python", "train.py"});
  EXPECT_EQ(c.worker_argv(0), std::vector<std::string>{"train.py"});
  c = resolve({"--append_local_rank_arg", "train.py", "x"});
  EXPECT_EQ(c.worker_argv(3),
            (std::vector<std::string>{"python3", "-u", "train.py", "--local_rank=3", "x"}));
  c = resolve({"./a.out", "x"});
  EXPECT_EQ(c.worker_argv(0), (std::vector<std::string>{"./a.out", "x"}));
}

TEST(LaunchConfig, Combinations) {
  EXPECT_NE(usage_error({"-m", "--no_python", "p"}).find("--no_python"), std::string::npos);
  EXPECT_NE(usage_error({"--append_local_rank_arg", "--use_env", "p"}).find("--use_env"),
            std::string::npos);
  EXPECT_NE(usage_error({"--standalone", "--nnodes", "1:2", "p"}).find("--standalone"),
            std::string::npos);
  EXPECT_NE(usage_error({}).find("no program"), std::string::npos);
  EXPECT_NE(usage_error({"--local_ranks_filter", "0,3", "--nproc_per_node", "2", "p"})
                .find("local rank 3"),
            std::string::npos);
  EXPECT_NE(usage_error({"--hang_timeout", "-1", "p"}).find("--hang_timeout"), std::string::npos);
  EXPECT_NE(usage_error({"p"}, {{"DLAUNCH_HANG_TIMEOUT", "soon"}}).find("DLAUNCH_HANG_TIMEOUT"),
            std::string::npos);
  EXPECT_NE(usage_error({"--start_method", "thread", "p"}).find("--start_method"),
            std::string::npos);
  EXPECT_NE(usage_error({"--role", "a b", "p"}).find("--role"), std::string::npos);
}

TEST(LaunchConfig, LocalRankMacroIsSubstitutedInWorkerArguments) {
  // torchrun 1.13 runs string.Template(arg).safe_substitute(local_rank=N) on every argument.
  auto c = resolve({"train.py", "--local_rank=${local_rank}", "--device", "cuda:$local_rank",
                    "${local_rank}${local_rank}", "$local_rank.x"});
  EXPECT_EQ(c.worker_argv(3),
            (std::vector<std::string>{"python3", "-u", "train.py", "--local_rank=3", "--device",
                                      "cuda:3", "33", "3.x"}));
  // Not the macro: other names, a longer identifier, upper case, a broken brace.
  c = resolve({"--no_python", "/bin/echo", "$LOCAL_RANK", "$local_rankx", "${local_rank",
               "${ local_rank}", "$1", "50$"});
  EXPECT_EQ(c.worker_argv(1),
            (std::vector<std::string>{"/bin/echo", "$LOCAL_RANK", "$local_rankx", "${local_rank",
                                      "${ local_rank}", "$1", "50$"}));
  // The program itself is not an argument (torchrun: the entrypoint is not substituted).
  c = resolve({"--no_python", "./run_${local_rank}", "x"});
  EXPECT_EQ(c.worker_argv(2)[0], "./run_${local_rank}");
}

TEST(LaunchConfig, DollarDollarIsPassedOnUnchanged) {
  // torchrun turns "$$" into "$" (and "$$local_rank" into "$local_rank"); dlaunch does not
  // touch "$$", so shell snippets and regexes arrive as written.
  auto c = resolve(
      {"--no_python", "/bin/sh", "-c", "echo $$ ${local_rank}", "a$$b", "$$local_rank", "^x$$"});
  EXPECT_EQ(c.worker_argv(1), (std::vector<std::string>{"/bin/sh", "-c", "echo $$ 1", "a$$b",
                                                        "$$local_rank", "^x$$"}));
}

TEST(LaunchConfig, GpuCountFollowsCudasVisibleDevicesRule) {
  struct Restore {
    std::optional<std::string> old = get_env("CUDA_VISIBLE_DEVICES");
    ~Restore() {
      if (old)
        setenv("CUDA_VISIBLE_DEVICES", old->c_str(), 1);
      else
        unsetenv("CUDA_VISIBLE_DEVICES");
    }
  } restore;
  // The list ends at the first entry that is not a device; one named twice hides all.
  std::map<std::string, int64_t> cases = {
      {"-1", 0},   {"0,-1,1", 1},        {"NoDevFiles", 0}, {"", 0},
      {"0,,1", 1}, {"0,1,2,3", 4},       {" 0 , 1 ", 2},    {"1gpu,2", 2},
      {"0,0", 0},  {"GPU-ab,GPU-cd", 2}, {"GPU-ab,x", 1}};
  for (const auto& [visible, gpus] : cases) {
    setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
    EXPECT_EQ(HostInfo::detect().gpus, gpus) << "CUDA_VISIBLE_DEVICES='" << visible << "'";
  }
  setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  HostInfo host = HostInfo::detect();
  host.cpus = 8;
  EXPECT_THROW(resolve_config(parse_cli({"--nproc_per_node", "gpu", "p"}), process_env(), host),
               UsageError);
  EXPECT_EQ(resolve_config(parse_cli({"--nproc_per_node", "auto", "p"}), process_env(), host)
                .nproc_per_node,
            8);
}

TEST(LaunchConfig, TeeWinsOverRedirectOnTheConsole) {
  auto c = resolve({"--nproc_per_node", "2", "-r", "3", "-t", "3", "p"});
  EXPECT_TRUE(c.console_shows(0, 1));
  EXPECT_TRUE(c.console_shows(1, 2));
  c = resolve({"--nproc_per_node", "2", "-r", "3", "-t", "1", "p"});
  EXPECT_TRUE(c.console_shows(0, 1));
  EXPECT_FALSE(c.console_shows(0, 2));
  c = resolve({"--nproc_per_node", "2", "-r", "0:3", "-t", "0:2", "p"});
  EXPECT_FALSE(c.console_shows(0, 1));
  EXPECT_TRUE(c.console_shows(0, 2));
  EXPECT_TRUE(c.console_shows(1, 1));
  // The filter still decides which ranks reach the console at all.
  c = resolve({"--nproc_per_node", "2", "-r", "3", "-t", "3", "--local_ranks_filter", "1", "p"});
  EXPECT_FALSE(c.console_shows(0, 1));
  EXPECT_TRUE(c.console_shows(1, 1));
}

TEST(LaunchConfig, RdzvConfKeysAreCheckedForEveryBackend) {
  for (std::vector<std::string> backend :
       {std::vector<std::string>{},
        {"--nnodes", "2", "--master_addr", "10.0.0.1"},
        {"--nnodes", "1:2", "--rdzv_endpoint", "10.0.0.1:29400"},
        {"--rdzv_backend", "etcd", "--rdzv_endpoint", "10.0.0.5:2379"}}) {
    auto args = backend;
    args.insert(args.end(), {"--rdzv_conf", "join_timout=5", "p"});
    std::string e = usage_error(args);
    EXPECT_NE(e.find("unknown key 'join_timout' (did you mean join_timeout?)"), std::string::npos)
        << e;
    args = backend;
    args.insert(args.end(), {"--rdzv_conf", "join_timeout=soon", "p"});
    EXPECT_NE(usage_error(args).find("join_timeout"), std::string::npos);
    args = backend;
    args.insert(args.end(), {"--rdzv_conf", "keep_alive_interval=0", "p"});
    EXPECT_NE(usage_error(args).find("keep_alive_interval"), std::string::npos);
  }
  EXPECT_NE(usage_error({"p"}, {{"DLAUNCH_RDZV_CONF", "bogus=1"}}).find("DLAUNCH_RDZV_CONF"),
            std::string::npos);
  // torchrun's own keys are accepted (and ignored), so torchrun command lines keep working.
  auto c = resolve({"--rdzv_conf", "is_host=1,read_timeout=60,timeout=900,join_timeout=9", "p"});
  EXPECT_EQ(c.rdzv_conf.at("join_timeout"), "9");
}

TEST(LaunchConfig, SlurmModeIsCheckedOutsideSlurm) {
  EXPECT_NE(usage_error({"--slurm_mode", "foo", "p"}).find("--slurm_mode='foo'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--no_slurm", "--slurm_mode", "foo", "p"}).find("--slurm_mode"),
            std::string::npos);
  EXPECT_NE(usage_error({"p"}, {{"DLAUNCH_SLURM_MODE", "tasks"}}).find("DLAUNCH_SLURM_MODE"),
            std::string::npos);
  EXPECT_EQ(resolve({"--slurm_mode", "agent", "p"}).slurm_mode, "off");
}

// --store_proxy: off by default; auto is on from kStoreProxyAutoNodes nodes (the largest
// --nnodes); anything else is a usage error naming the flag or its variable.
TEST(LaunchConfig, StoreProxyModes) {
  EXPECT_FALSE(resolve({"p"}).wants_store_proxy());
  EXPECT_TRUE(resolve({"--store_proxy", "on", "p"}).wants_store_proxy());
  EXPECT_FALSE(resolve({"--store_proxy", "auto", "--nnodes", "1:63", "--rdzv_endpoint",
                        "127.0.0.1:29500", "p"})
                   .wants_store_proxy());
  EXPECT_TRUE(resolve({"--store_proxy", "auto", "--nnodes", "1:64", "--rdzv_endpoint",
                       "127.0.0.1:29500", "p"})
                  .wants_store_proxy());
  EXPECT_TRUE(resolve({"p"}, {{"DLAUNCH_STORE_PROXY", "on"}}).wants_store_proxy());
  EXPECT_NE(usage_error({"--store_proxy", "yes", "p"}).find("--store_proxy='yes'"),
            std::string::npos);
  EXPECT_NE(usage_error({"p"}, {{"DLAUNCH_STORE_PROXY", "1"}}).find("DLAUNCH_STORE_PROXY"),
            std::string::npos);
}

// What the agent's job services would refuse after starting is refused by resolution, so a
// --dry_run says what a run would.
TEST(LaunchConfig, EndpointsAndPortsAreCheckedBeforeAnythingStarts) {
  EXPECT_NE(usage_error({"--master_port", "0", "--nnodes", "2", "p"}).find("--master_port=0"),
            std::string::npos);
  EXPECT_NE(usage_error({"--dry_run", "--master_port", "0", "--nnodes", "2", "p"})
                .find("--master_port=0"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "1:2", "p"}).find("needs --rdzv_endpoint"), std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "1:2", "--rdzv_endpoint", "10.0.0.1:0", "p"}).find("port 0"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "1:2", "--rdzv_endpoint", "10.0.0.1:http", "p"})
                .find("--rdzv_endpoint"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv_backend", "etcd", "p"}).find("etcd's client URL"),
            std::string::npos);
  // etcd takes a list of a cluster's members; each must parse.
  EXPECT_EQ(
      resolve({"--rdzv_backend", "etcd", "--rdzv_endpoint", "10.0.0.5:2379,10.0.0.6:2379", "p"})
          .rdzv_endpoint,
      "10.0.0.5:2379,10.0.0.6:2379");
  EXPECT_NE(usage_error({"--rdzv_backend", "etcd", "--rdzv_endpoint", "10.0.0.5:2379,", "p"})
                .find("endpoint 2 of '10.0.0.5:2379,' is empty"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv_backend", "etcd", "--rdzv_endpoint", "[fd00::5:2379", "p"})
                .find("[v6addr]:port"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv_backend", "etcd-v2", "--rdzv_endpoint", "h:2379", "p"})
                .find("--rdzv_backend etcd"),
            std::string::npos);
  // Still fine: one node picks its own port; c10d on port 0 with one node (torchrun's
  // --standalone spelling).
  EXPECT_EQ(resolve({"--master_port", "0", "p"}).master_port, 0);
  EXPECT_EQ(resolve({"--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0", "p"}).max_nodes,
            1);
}

// The backends' own sentences, asked of their descriptors (rendezvous_registry.h), word for
// word as they were when the launcher compared backend names itself.
TEST(LaunchConfig, BackendMessagesComeFromTheirDescriptors) {
  EXPECT_EQ(usage_error({"--rdzv_backend", "zookeeper", "p"}),
            "--rdzv_backend='zookeeper' is not allowed; expected static, c10d or etcd");
  EXPECT_EQ(usage_error({"--rdzv_backend", "etcd-v2", "--rdzv_endpoint", "h:2379", "p"}),
            "--rdzv_backend='etcd-v2' is torchrun's backend for etcd's v2 API, which dlaunch "
            "does not speak; use --rdzv_backend etcd (etcd's v3 API, etcd 3.4 or newer)");
  EXPECT_EQ(usage_error({"--rdzv_backend", "static", "--nnodes", "1:2", "p"}),
            "--nnodes='1:2' asks for an elastic node range, which the static backend cannot do; "
            "use --rdzv_backend c10d or a fixed --nnodes");
  EXPECT_EQ(usage_error({"--rdzv_backend", "etcd", "p"}),
            "--rdzv_backend etcd needs --rdzv_endpoint host:port of etcd's client URL (e.g. "
            "10.0.0.5:2379), or a comma-separated list of the etcd cluster's members");
  EXPECT_EQ(usage_error({"--nnodes", "1:2", "p"}),
            "--rdzv_backend=c10d (--nnodes=1:2) needs --rdzv_endpoint host:port, the address "
            "where one agent hosts the rendezvous store and every other agent connects");
  EXPECT_EQ(usage_error({"--nnodes", "2", "--node_rank", "0", "--master_port", "0", "p"}),
            "--master_port=0 cannot work with --nnodes=2: the other nodes would not know the port "
            "node 0 picked; give every node the same free --master_port");
  EXPECT_EQ(usage_error({"--standalone", "--rdzv_backend", "etcd", "--rdzv_endpoint", "h", "p"}),
            "--standalone runs its own store on this node, but --rdzv_backend=etcd asks for "
            "another rendezvous; drop --standalone to use etcd, or drop --rdzv_backend");
  EXPECT_EQ(usage_error({"--rdzv_conf", "is_hots=1", "p"}).find("has the unknown key 'is_hots'"),
            std::string("--rdzv_conf='is_hots=1' ").size());
  // torchrun's keys of every backend are accepted with any backend.
  for (const char* key : {"is_host", "rank", "etcd_prefix", "ssl_cert", "store_type"}) {
    EXPECT_EQ(usage_error({"--rdzv_conf", std::string(key) + "=1", "p"}), "") << key;
  }
  // The default ports: c10d's endpoint and the master's.
  EXPECT_EQ(resolve({"p"}).master_port, 0);  // one node: a free port (torchrun 2.x)
  EXPECT_EQ(resolve({"--nnodes", "2", "p"}).master_port, 29500);
}

TEST(LaunchConfig, SecondsMustBeFiniteAndNameTheirBound) {
  for (const char* flag : {"--hang_timeout", "--shutdown_grace", "--monitor_interval"}) {
    for (const char* value : {"nan", "NaN", "inf", "-inf", "1e9"}) {
      std::string e = usage_error({flag, value, "p"});
      EXPECT_NE(e.find(std::string(flag) + "=" + value + " is not allowed"), std::string::npos)
          << flag << " " << value << ": " << e;
      EXPECT_NE(e.find("to 1e+07"), std::string::npos) << e;
    }
  }
  EXPECT_NE(usage_error({"p"}, {{"DLAUNCH_HANG_TIMEOUT", "nan"}}).find("DLAUNCH_HANG_TIMEOUT"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv_conf", "join_timeout=nan", "p"}).find("join_timeout=nan"),
            std::string::npos);
  EXPECT_EQ(resolve({"--hang_timeout", "0", "p"}).hang_timeout, Duration::zero());
}

// --hang_timeout auto[:STARTUP] (launcher/hang/hang_pace.h): the start-up timeout is kept in
// hang_timeout.
TEST(LaunchConfig, HangTimeoutAutoTakesAnOptionalStartUpTimeout) {
  LaunchConfig c = resolve({"--hang_timeout", "auto", "p"});
  EXPECT_TRUE(c.hang_timeout_auto);
  EXPECT_EQ(c.hang_timeout, std::chrono::seconds(300));
  c = resolve({"--hang_timeout", "auto:600", "p"});
  EXPECT_TRUE(c.hang_timeout_auto);
  EXPECT_EQ(c.hang_timeout, std::chrono::seconds(600));
  c = resolve({"p"}, {{"DLAUNCH_HANG_TIMEOUT", "auto"}});
  EXPECT_TRUE(c.hang_timeout_auto);
  c = resolve({"--hang_timeout", "6", "p"});
  EXPECT_FALSE(c.hang_timeout_auto);
  EXPECT_EQ(c.hang_timeout, std::chrono::seconds(6));
  for (const char* value : {"auto:0", "auto:", "auto:x", "autox", "auto:nan", "auto:1e9"}) {
    std::string e = usage_error({"--hang_timeout", value, "p"});
    EXPECT_NE(e.find(std::string("--hang_timeout=") + value + " is not allowed"),
              std::string::npos)
        << value << ": " << e;
    EXPECT_NE(e.find("'auto:STARTUP'"), std::string::npos) << e;
  }
}

TEST(LaunchConfig, RunIdsStayOnePathComponent) {
  for (const char* id : {"../esc", "a/b", "..", ".", "", "tab\there", "bell\a"}) {
    std::string e = usage_error({"--rdzv_id", id, "p"});
    EXPECT_NE(e.find("--rdzv_id="), std::string::npos) << "'" << id << "': " << e;
    EXPECT_NE(e.find("names this job's log directory"), std::string::npos) << e;
    EXPECT_EQ(e.find('\a'), std::string::npos) << "control characters are not echoed: " << e;
  }
  EXPECT_NE(usage_error({"p"}, {{"DLAUNCH_RDZV_ID", "x/y"}}).find("DLAUNCH_RDZV_ID"),
            std::string::npos);
  EXPECT_EQ(resolve({"--rdzv_id", "job-7_a.b", "p"}).run_id, "job-7_a.b");
}

TEST(LaunchConfig, UsageProblemsFoundBeforeAnythingStarts) {
  EXPECT_NE(usage_error({"--master_addr", "", "p"}).find("--master_addr is empty"),
            std::string::npos);
  EXPECT_NE(usage_error({"--master_port", "29511", "--status_port", "29511", "p"})
                .find("--status_port 29511 is also --master_port"),
            std::string::npos);
  EXPECT_EQ(resolve({"--master_port", "29511", "--status_port", "29512", "p"}).status_port, 29512);
  EXPECT_NE(usage_error({"--standalone", "--rdzv_backend", "etcd", "p"})
                .find("--standalone runs its own store on this node, but --rdzv_backend=etcd"),
            std::string::npos);
  EXPECT_EQ(resolve({"--standalone", "--rdzv_backend", "c10d", "p"}).rdzv_backend, "static");
  EXPECT_NE(resolve({"--standalone", "p"}).describe().find("Slurm values ignored (--standalone)"),
            std::string::npos);
}

TEST(LaunchConfig, DescribeShowsEveryResolvedSetting) {
  HostInfo host{8, 0, "feedfacecafebeef", "node-a"};
  auto lookup = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  auto c = resolve_config(parse_cli({"--nnodes", "2", "--master_addr", "10.0.0.1", "--use_env",
                                     "--start_method", "fork", "--no_slurm", "p"}),
                          lookup, host);
  std::string d = c.describe();
  EXPECT_NE(d.find("start_method           = fork (ignored)"), std::string::npos) << d;
  EXPECT_NE(d.find("use_env                = true (ignored)"), std::string::npos) << d;
  EXPECT_NE(d.find("no_slurm               = true"), std::string::npos) << d;
  // The address this node advertises to the others: the host name unless --local_addr.
  EXPECT_NE(d.find("local_addr             = node-a"), std::string::npos) << d;
  c = resolve_config(parse_cli({"--nnodes", "2", "--local_addr", "10.0.0.2", "p"}), lookup, host);
  EXPECT_NE(c.describe().find("local_addr             = 10.0.0.2"), std::string::npos);
}

TEST(LaunchConfig, DescribeQuotesTheWorkerCommandAsAShellWould) {
  EXPECT_EQ(shell_quote("train.py"), "train.py");
  EXPECT_EQ(shell_quote("--lr=0.1"), "--lr=0.1");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  auto c = resolve({"--no_python", "/bin/sh", "-c", "echo \"$RANK\"; exit 0", ""});
  EXPECT_NE(
      c.describe().find("worker command (local rank 0): /bin/sh -c 'echo \"$RANK\"; exit 0' ''"),
      std::string::npos)
      << c.describe();
}

TEST(LaunchConfig, NoProgramRunsDtrainBesideDlaunch) {
  HostInfo host{8, 0, "feedfacecafebeef", "node-a", "/opt/dlaunch/bin/dtrain"};
  auto lookup = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  auto c = resolve_config(parse_cli({"--nproc_per_node", "2"}), lookup, host);
  EXPECT_EQ(c.worker_argv(0), std::vector<std::string>{"/opt/dlaunch/bin/dtrain"});
  EXPECT_NE(c.describe().find("dtrain beside dlaunch"), std::string::npos);
  // A program given wins; -m without a module name is still an error.
  EXPECT_EQ(resolve_config(parse_cli({"x"}), lookup, host).program, "x");
  EXPECT_THROW(resolve_config(parse_cli({"-m"}), lookup, host), UsageError);
  // No dtrain beside dlaunch: the usage error says so.
  host.default_program.clear();
  try {
    resolve_config(parse_cli({}), lookup, host);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no program was given"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("dtrain"), std::string::npos);
  }
}

TEST(LaunchConfig, SecondsAndSwitchesFromEnv) {
  auto c = resolve({"p"}, {{"DLAUNCH_HANG_TIMEOUT", "2.5"}, {"DLAUNCH_STANDALONE", "1"},
                           {"DLAUNCH_SHUTDOWN_GRACE", "0.25"}});
  EXPECT_DOUBLE_EQ(to_seconds(c.hang_timeout), 2.5);
  EXPECT_DOUBLE_EQ(to_seconds(c.shutdown_grace), 0.25);
  EXPECT_TRUE(c.standalone);
  EXPECT_FALSE(c.hang_timeout_from_start);
  EXPECT_TRUE(resolve({"p"}, {{"DLAUNCH_HANG_TIMEOUT_FROM_START", "1"}}).hang_timeout_from_start);
}

// torchrun 2.x, one node: a free port and a fresh run id only when nothing chose the port (a
// flag, a twin, --rdzv_endpoint); an explicit run id is kept.
TEST(LaunchConfig, OneNodeWithoutMasterPortTakesAFreePort) {
  auto c = resolve({"p"});
  EXPECT_EQ(c.master_port, 0);
  EXPECT_NE(c.origin.at("master_port").find("free port"), std::string::npos);
  EXPECT_EQ(resolve({"--rdzv_id", "job7", "p"}).run_id, "job7");
  EXPECT_EQ(resolve({"--rdzv_id", "job7", "p"}).master_port, 0);
  c = resolve({"--master_port", "29511", "p"});
  EXPECT_EQ(c.master_port, 29511);
  EXPECT_EQ(c.run_id, "none");
  EXPECT_EQ(resolve({"p"}, {{"PET_MASTER_PORT", "29512"}}).master_port, 29512);
  EXPECT_EQ(resolve({"p"}, {{"DLAUNCH_MASTER_PORT", "29513"}}).master_port, 29513);
  EXPECT_EQ(resolve({"--rdzv_endpoint", "127.0.0.1:29514", "p"}).master_port, 29500);
}

TEST(LaunchConfig, TorchrunTwoFlagsHaveTheirPetTwins) {
  auto c = resolve({"p"}, {{"PET_LOG_LINE_PREFIX_TEMPLATE", "${rank}> "},
                           {"PET_DUPLICATE_STDOUT_FILTERS", "a,b"},
                           {"PET_DUPLICATE_STDERR_FILTERS", "c"},
                           {"PET_EVENT_LOG_HANDLER", "null"},
                           {"PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR2"},
                           {"PET_SHUTDOWN_TIMEOUT", "7"},
                           {"PET_VIRTUAL_LOCAL_RANK", "1"},
                           {"PET_RUN_PATH", "1"}});
  EXPECT_EQ(c.log_line_prefix_template, "${rank}> ");
  EXPECT_EQ(c.duplicate_stdout_filters, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.duplicate_stderr_filters, (std::vector<std::string>{"c"}));
  EXPECT_EQ(c.stop_signals, (std::vector<int>{SIGTERM, SIGUSR2}));
  EXPECT_EQ(c.shutdown_grace, std::chrono::seconds(7));
  EXPECT_EQ(c.origin.at("shutdown_grace"), "PET_SHUTDOWN_TIMEOUT");
  EXPECT_TRUE(c.virtual_local_rank);
  EXPECT_TRUE(c.run_path);
  // torchrun's own fallbacks, after the flag and the PET_ twin.
  c = resolve({"p"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "x "},
                      {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}});
  EXPECT_EQ(c.log_line_prefix_template, "x ");
  EXPECT_EQ(c.shutdown_grace, std::chrono::seconds(9));
  c = resolve({"--shutdown-timeout", "3", "p"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}});
  EXPECT_EQ(c.shutdown_grace, std::chrono::seconds(3));
}

TEST(LaunchConfig, ShutdownTimeoutIsShutdownGrace) {
  EXPECT_EQ(resolve({"--shutdown_timeout", "0", "p"}).shutdown_grace, Duration(0));
  EXPECT_EQ(resolve({"--shutdown_timeout", "4", "--shutdown_grace", "4", "p"}).shutdown_grace,
            std::chrono::seconds(4));
  EXPECT_NE(usage_error({"--shutdown_timeout", "4", "--shutdown_grace", "6", "p"})
                .find("--shutdown_timeout=4 and --shutdown_grace=6 were both given"),
            std::string::npos);
  EXPECT_NE(usage_error({"--shutdown_timeout", "-1", "p"}).find("--shutdown_timeout=-1"),
            std::string::npos);
}

TEST(LaunchConfig, RefusedTorchrunValuesNameTheFlag) {
  EXPECT_EQ(usage_error({"--event_log_handler", "null", "--logs_specs", "default", "p"}), "");
  EXPECT_NE(usage_error({"--event-log-handler", "console", "p"})
                .find("--event-log-handler='console' is not supported"),
            std::string::npos);
  EXPECT_NE(usage_error({"--logs_specs", "mine", "p"}).find("--logs_specs='mine' is not supported"),
            std::string::npos);
  EXPECT_NE(usage_error({"--signals_to_handle", "SIGTERM,TERM", "p"})
                .find("--signals_to_handle='SIGTERM,TERM' names 'TERM'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--signals_to_handle", "SIGKILL", "p"}).find("no process can catch"),
            std::string::npos);
  EXPECT_NE(usage_error({"--signals_to_handle", "SIGSEGV", "p"}).find("'SIGSEGV'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--log_line_prefix_template", "x", "--log_fold", "p"})
                .find("--log_line_prefix_template and --log_fold were both given"),
            std::string::npos);
}

TEST(LaunchConfig, VirtualLocalRankNeedsADevicePerWorker) {
  EXPECT_EQ(usage_error({"--virtual_local_rank", "--nproc_per_node", "2", "p"},
                        {{"CUDA_VISIBLE_DEVICES", "3,5"}}),
            "");
  EXPECT_EQ(usage_error({"--virtual_local_rank", "--nproc_per_node", "4", "p"}), "");
  EXPECT_NE(usage_error({"--virtual_local_rank", "--nproc_per_node", "3", "p"},
                        {{"CUDA_VISIBLE_DEVICES", "3,5"}})
                .find("CUDA_VISIBLE_DEVICES='3,5' has 2 entries for --nproc_per_node=3"),
            std::string::npos);
  EXPECT_NE(usage_error({"--virtual_local_rank", "--nproc_per_node", "2", "p"},
                        {{"CUDA_VISIBLE_DEVICES", "0,1"}, {"HIP_VISIBLE_DEVICES", "4"}})
                .find("HIP_VISIBLE_DEVICES='4'"),
            std::string::npos);
}

TEST(LaunchConfig, RunPathRunsAnyProgramUnderPython) {
  auto c = resolve({"--run_path", "--no_python", "--python", "py", "/x/job", "a"});
  EXPECT_EQ(c.worker_argv(0), (std::vector<std::string>{"py", "-u", "/x/job", "a"}));
  c = resolve({"--run_path", "-m", "--python", "py", "/x/job.py"});
  EXPECT_EQ(c.worker_argv(0), (std::vector<std::string>{"py", "-u", "/x/job.py"}));
}

}  // namespace
}  // namespace dlaunch
