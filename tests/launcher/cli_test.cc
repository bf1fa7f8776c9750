#include "launcher/config/cli.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlaunch {
namespace {

TEST(Cli, BothSpellingsAndBothValueShapes) {
  auto a = parse_cli({"--nproc_per_node", "2", "--max-restarts=3", "--rdzv_conf=a=1,b=2", "prog"});
  EXPECT_EQ(a.values.at("nproc_per_node"), "2");
  EXPECT_EQ(a.values.at("max_restarts"), "3");
  EXPECT_EQ(a.values.at("rdzv_conf"), "a=1,b=2");  // only the first '=' splits
  EXPECT_EQ(a.spelled.at("max_restarts"), "--max-restarts");
  EXPECT_EQ(a.program, "prog");
}

TEST(Cli, ShortFlags) {
  auto a = parse_cli({"-r", "3", "-t1", "-m", "mod"});
  EXPECT_EQ(a.values.at("redirects"), "3");
  EXPECT_EQ(a.values.at("tee"), "1");
  EXPECT_EQ(a.values.at("module"), "true");
  EXPECT_EQ(a.program, "mod");
  EXPECT_EQ(parse_cli({"-r=0:1,1:2", "p"}).values.at("redirects"), "0:1,1:2");
  EXPECT_THROW(parse_cli({"-mx", "p"}), UsageError);
  EXPECT_THROW(parse_cli({"-z", "p"}), UsageError);
}

TEST(Cli, SwitchesTakeOptionalValues) {
  auto a = parse_cli({"--standalone", "--no-python=false", "p"});
  EXPECT_EQ(a.values.at("standalone"), "true");
  EXPECT_EQ(a.values.at("no_python"), "false");
}

TEST(Cli, EverythingAfterTheProgramBelongsToIt) {
  auto a = parse_cli({"--standalone", "train.py", "--nproc_per_node", "8", "-r", "3"});
  EXPECT_EQ(a.program, "train.py");
  EXPECT_EQ(a.program_args, (std::vector<std::string>{"--nproc_per_node", "8", "-r", "3"}));
  EXPECT_EQ(a.values.count("nproc_per_node"), 0u);
  auto b = parse_cli({"--", "-weird-name", "x"});
  EXPECT_EQ(b.program, "-weird-name");
  EXPECT_EQ(b.program_args, std::vector<std::string>{"x"});
}

TEST(Cli, UniquePrefixesAsArgparse) {
  EXPECT_EQ(parse_cli({"--nproc", "4", "p"}).values.at("nproc_per_node"), "4");
  // --master could be --master_addr or --master_port.
  try {
    parse_cli({"--master", "x", "p"});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("ambiguous"), std::string::npos);
  }
}

TEST(Cli, ErrorsNameTheFlag) {
  try {
    parse_cli({"--nproc_per_node"});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc_per_node"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("needs a value"), std::string::npos);
  }
  try {
    parse_cli({"--frobnicate", "p"});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--frobnicate"), std::string::npos);
  }
}

TEST(Cli, UnknownFlagSuggestsTheClosestOne) {
  auto message = [](std::vector<std::string> args) {
    try {
      parse_cli(args);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({"--nprocs_per_node", "2", "p"}).find("did you mean --nproc_per_node?"),
            std::string::npos);
  EXPECT_NE(message({"--nproc-per-nodes=2", "p"}).find("did you mean --nproc_per_node?"),
            std::string::npos);
  EXPECT_NE(message({"--masterport", "1", "p"}).find("did you mean --master_port?"),
            std::string::npos);
  // Nothing close: no guess, only the pointer to --help.
  std::string far = message({"--frobnicate", "p"});
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_NE(far.find("dlaunch --help"), std::string::npos) << far;
  EXPECT_EQ(closest_match("join_timout", {"join_timeout", "last_call_timeout"}), "join_timeout");
  EXPECT_EQ(closest_match("zzz", {"join_timeout", "last_call_timeout"}), "");
}

TEST(Cli, RepeatedFlagKeepsTheLast) {
  EXPECT_EQ(parse_cli({"--role", "a", "--role", "b", "p"}).values.at("role"), "b");
}

TEST(Cli, HelpListsEveryFlagWithItsTwin) {
  std::string h = help_text();
  for (const auto& s : flag_specs()) {
    EXPECT_NE(h.find("--" + s.name), std::string::npos) << s.name;
    // They act at once, with no twin.
    if (s.name != "help" && s.name != "version" && s.name != "print_completion") {
      EXPECT_NE(h.find(s.env), std::string::npos) << s.env;
    }
  }
  EXPECT_TRUE(parse_cli({"-h"}).help);
}

// torchrun 2.15's flags are dlaunch flags, in both spellings (docs/cli.md, "Every torchrun 2.15
// flag").
TEST(Cli, TakesEveryTorchrunTwoFifteenFlag) {
  for (const char* flag :
       {"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
        "standalone", "max-restarts", "monitor-interval", "start-method", "event-log-handler",
        "role", "module", "no-python", "run-path", "log-dir", "redirects", "tee",
        "log-line-prefix-template", "local-ranks-filter", "duplicate-stdout-filters",
        "duplicate-stderr-filters", "node-rank", "master-addr", "master-port", "local-addr",
        "logs-specs", "numa-binding", "signals-to-handle", "shutdown-timeout",
        "virtual-local-rank", "print-completion", "help"}) {
    std::string dashed = std::string("--") + flag;
    std::string underscored = dashed;
    for (size_t i = 2; i < underscored.size(); ++i) {
      if (underscored[i] == '-') underscored[i] = '_';
    }
    for (const auto& spelled : {dashed, underscored}) {
      auto cli = parse_cli({spelled + "=1", "p"});
      EXPECT_EQ(cli.values.size(), 1u) << spelled;
    }
  }
}

}  // namespace
}  // namespace dlaunch
