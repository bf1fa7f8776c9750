#include "launcher/config/torchrun_flags.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "common/error.h"
#include "launcher/output/filtered_copy.h"
#include "launcher/config/config_resolution.h"
#include "launcher/config/launch_config.h"
#include "tests/support/subprocess.h"

namespace dlaunch {
namespace {

// As Python's string.Template("...").safe_substitute(role_name=..., rank=..., ...).
TEST(LogLinePrefix, RendersAsSafeSubstitute) {
  PrefixMacros m{"trainer", 12, 3, "r12i0n8"};
  EXPECT_EQ(render_log_line_prefix("${hostname}:${rank}: ", m), "r12i0n8:12: ");
  EXPECT_EQ(render_log_line_prefix("[${role_name}${local_rank}]:", m), "[trainer3]:");
  EXPECT_EQ(render_log_line_prefix("$rank|$local_rank|$role_name|$hostname", m),
            "12|3|trainer|r12i0n8");
  // Unknown names, "$$", a '$' at the end, a name running on, an unclosed brace.
  EXPECT_EQ(render_log_line_prefix("${other} $other $$ $rankx $rank-x ${rank $", m),
            "${other} $other $ $rankx 12-x ${rank $");
  EXPECT_EQ(render_log_line_prefix("${ rank} ${1} $1", m), "${ rank} ${1} $1");
  EXPECT_EQ(render_log_line_prefix("", m), "");
}

// As torchrun's comma_separated_list.
TEST(FilterList, SplitsOnCommasWithDoubledCommaEscaped) {
  EXPECT_EQ(parse_filter_list("apple,orange"), (std::vector<std::string>{"apple", "orange"}));
  EXPECT_EQ(parse_filter_list("a,,b,c"), (std::vector<std::string>{"a,b", "c"}));
  EXPECT_EQ(parse_filter_list(""), (std::vector<std::string>{""}));
  EXPECT_TRUE(line_matches("any line\n", parse_filter_list("")));
  EXPECT_TRUE(line_matches("an apple\n", {"pear", "apple"}));
  EXPECT_FALSE(line_matches("an orange\n", {"or,ange"}));
}

TEST(SignalList, NamesBecomeNumbers) {
  EXPECT_EQ(parse_signal_list("SIGTERM,SIGINT,SIGHUP,SIGQUIT", "--s"),
            (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(parse_signal_list(" SIGUSR1 , SIGUSR1,SIGALRM", "--s"),
            (std::vector<int>{SIGUSR1, SIGALRM}));
  EXPECT_EQ(parse_signal_list("", "--s"), std::vector<int>{});
  EXPECT_THROW(parse_signal_list("SIGSTOP", "--s"), UsageError);
  EXPECT_THROW(parse_signal_list("15", "--s"), UsageError);
  EXPECT_THROW(parse_signal_list("SIGBUS", "--s"), UsageError);
}

using Env = std::vector<std::pair<std::string, std::string>>;
std::string get(const Env& env, const std::string& name) {
  for (const auto& [k, v] : env) {
    if (k == name) return v;
  }
  return "(unset)";
}

TEST(VirtualLocalRank, EachWorkerSeesItsDeviceAsZero) {
  Env env = {{"LOCAL_RANK", "1"}, {"CUDA_VISIBLE_DEVICES", "3, 5"}};
  apply_virtual_local_rank(env, 1);
  EXPECT_EQ(get(env, "LOCAL_RANK"), "0");
  EXPECT_EQ(get(env, "CUDA_VISIBLE_DEVICES"), "5");
  Env none = {{"LOCAL_RANK", "2"}};
  apply_virtual_local_rank(none, 2);
  EXPECT_EQ(get(none, "CUDA_VISIBLE_DEVICES"), "2");
  Env hip = {{"LOCAL_RANK", "1"}, {"HIP_VISIBLE_DEVICES", "6,7"}, {"CUDA_VISIBLE_DEVICES", "0"}};
  apply_virtual_local_rank(hip, 1);
  EXPECT_EQ(get(hip, "HIP_VISIBLE_DEVICES"), "7");
  EXPECT_EQ(get(hip, "CUDA_VISIBLE_DEVICES"), "7");
  // Split on every comma, as Python's str.split: ",," is an empty entry, not an escape.
  Env doubled = {{"CUDA_VISIBLE_DEVICES", "4,,6"}};
  apply_virtual_local_rank(doubled, 2);
  EXPECT_EQ(get(doubled, "CUDA_VISIBLE_DEVICES"), "6");
}

TEST(RefusedValues, DefaultsPassOthersNameTheFlag) {
  EXPECT_NO_THROW(check_event_log_handler("null", "--event_log_handler"));
  EXPECT_NO_THROW(check_logs_specs("default", "--logs_specs"));
  EXPECT_NO_THROW(check_logs_specs("", "--logs_specs"));
  EXPECT_NO_THROW(check_numa_binding("", "--numa_binding"));
  for (auto check : {check_event_log_handler, check_logs_specs, check_numa_binding}) {
    try {
      check("other", "--the-flag");
      ADD_FAILURE() << "'other' was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--the-flag='other' is not", 0), 0u) << e.what();
    }
  }
}

// Only teed streams of the ranks --local_ranks_filter shows are copied; a line goes out whole,
// an unterminated last one when its worker exits.
TEST(FilteredCopy, CopiesMatchingTeedLinesOfShownRanks) {
  testing::TempDir dir;
  LaunchConfig cfg;
  cfg.nproc_per_node = 3;
  cfg.tee = parse_std_spec("0:3,1:1,2:3", "--tee");
  cfg.local_ranks_filter = {0, 1};
  cfg.duplicate_stdout_filters = {"keep"};
  cfg.duplicate_stderr_filters = {"err"};
  auto copy = FilteredCopy::open(cfg, dir.path());
  ASSERT_TRUE(copy);
  copy->feed(0, 1, "keep a\ndrop b\nke", "[r0]:");
  copy->feed(1, 2, "err not teed\n", "[r1]:");
  copy->feed(2, 1, "keep filtered out\n", "[r2]:");
  copy->feed(0, 1, "ep c\nkeep d", "[r0]:");
  copy->feed(0, 2, "an err\n", "[r0]:");
  copy->finish(0, "[r0]:");
  copy.reset();
  EXPECT_EQ(testing::read_file(dir.file("filtered_stdout.log")),
            "[r0]:keep a\n[r0]:keep c\n[r0]:keep d");
  EXPECT_EQ(testing::read_file(dir.file("filtered_stderr.log")), "[r0]:an err\n");
  cfg.duplicate_stdout_filters.clear();
  cfg.duplicate_stderr_filters.clear();
  EXPECT_FALSE(FilteredCopy::open(cfg, dir.path()));
}

}  // namespace
}  // namespace dlaunch
