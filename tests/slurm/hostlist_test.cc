#include "launcher/slurm/hostlist.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace dlaunch {
namespace {

using Hosts = std::vector<std::string>;

TEST(Hostlist, PlainNamesAndSeparators) {
  EXPECT_EQ(expand_hostlist("node1"), Hosts({"node1"}));
  EXPECT_EQ(expand_hostlist("a,b,c"), Hosts({"a", "b", "c"}));
  EXPECT_EQ(expand_hostlist("a b\tc\nd"), Hosts({"a", "b", "c", "d"}));
  EXPECT_EQ(expand_hostlist("a,,b,"), Hosts({"a", "b"}));
  EXPECT_EQ(expand_hostlist(""), Hosts());
  EXPECT_EQ(expand_hostlist(",, "), Hosts());
  // A dash outside brackets is just part of the name.
  EXPECT_EQ(expand_hostlist("host-1-2"), Hosts({"host-1-2"}));
}

TEST(Hostlist, RangesAndZeroPadding) {
  EXPECT_EQ(expand_hostlist("n[1-3]"), Hosts({"n1", "n2", "n3"}));
  EXPECT_EQ(expand_hostlist("n[8-11]"), Hosts({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[09-11]"), Hosts({"n09", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[001-003]"), Hosts({"n001", "n002", "n003"}));
  // The padding is the width of the low end as written, as in Slurm.
  EXPECT_EQ(expand_hostlist("n[001-10]").back(), "n010");
  EXPECT_EQ(expand_hostlist("n[1-10]").back(), "n10");
  EXPECT_EQ(expand_hostlist("n[7]"), Hosts({"n7"}));
  EXPECT_EQ(expand_hostlist("n[0]"), Hosts({"n0"}));
  EXPECT_EQ(expand_hostlist("[1-3]"), Hosts({"1", "2", "3"}));
  EXPECT_EQ(expand_hostlist("n[98-101]"), Hosts({"n98", "n99", "n100", "n101"}));
}

TEST(Hostlist, CommasInsideBracketsSeparateRangesNotHosts) {
  EXPECT_EQ(expand_hostlist("gpu-[01-04,07]"),
            Hosts({"gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"}));
  EXPECT_EQ(expand_hostlist("gpu-[01-04,07],login[1-2]"),
            Hosts({"gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07", "login1", "login2"}));
  EXPECT_EQ(expand_hostlist("a[1,3,5-6],b,c[9]"), Hosts({"a1", "a3", "a5", "a6", "b", "c9"}));
  // Order and duplicates are kept, as Slurm does.
  EXPECT_EQ(expand_hostlist("n[3,1,3]"), Hosts({"n3", "n1", "n3"}));
}

TEST(Hostlist, SeveralBracketGroupsAreACartesianProduct) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[01-02]"),
            Hosts({"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand_hostlist("a[1-2][3-4]"), Hosts({"a13", "a14", "a23", "a24"}));
  // With three or more groups Slurm's order is not plain nesting: the last group turns fastest,
  // then the first, the second, ..., the second-to-last slowest.
  EXPECT_EQ(expand_hostlist("r[1-2]c[1-3]n[5],x"),
            Hosts({"r1c1n5", "r2c1n5", "r1c2n5", "r2c2n5", "r1c3n5", "r2c3n5", "x"}));
  EXPECT_EQ(expand_hostlist("a[1-2]b[3-4]c[5-6]"), Hosts({"a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6",
                                                          "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"}));
  EXPECT_EQ(expand_hostlist("a[1-2]b[3-4]c[5-6]d[7-8]")[8], "a1b3c6d7");
  // Extension: text after the last group (Slurm refuses it).
  EXPECT_EQ(expand_hostlist("x[1-2]y"), Hosts({"x1y", "x2y"}));
}

TEST(Hostlist, FirstHost) {
  EXPECT_EQ(first_host("gpu-[01-04,07],login[1-2]"), "gpu-01");
  EXPECT_EQ(first_host("login1,gpu-[01-04]"), "login1");
  EXPECT_THROW(first_host(""), UsageError);
  // The whole list is validated, not only the first host.
  EXPECT_THROW(first_host("a,b[2-1]"), UsageError);
}

std::string error_of(const std::string& input) {
  try {
    expand_hostlist(input);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for \"" << input << "\"";
  return "";
}

TEST(Hostlist, MalformedInputNamesInputAndPosition) {
  std::string msg = error_of("gpu-[01-04");
  EXPECT_NE(msg.find("\"gpu-[01-04\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("never closed at position 4"), std::string::npos) << msg;

  msg = error_of("gpu-01]");
  EXPECT_NE(msg.find("without a matching '[' at position 6"), std::string::npos) << msg;

  msg = error_of("n[5-3]");
  EXPECT_NE(msg.find("reversed range '5-3'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;

  msg = error_of("n[1-2],m[1,7-4]");
  EXPECT_NE(
      msg.find("reversed range '7-4' (the low end must come first, e.g. [4-7]) at position 11"),
      std::string::npos)
      << msg;

  msg = error_of("n[1-[2]]");
  EXPECT_NE(msg.find("'[' inside the bracket group opened at position 1 at position 4"),
            std::string::npos)
      << msg;

  msg = error_of("n[a-b]");
  EXPECT_NE(msg.find("'a' in range 'a' is not a digit at position 2"), std::string::npos) << msg;
  msg = error_of("n[1-x]");
  EXPECT_NE(msg.find("position 4"), std::string::npos) << msg;

  EXPECT_NE(error_of("n[]").find("empty range"), std::string::npos);
  EXPECT_NE(error_of("n[1,,2]").find("empty range"), std::string::npos);
  EXPECT_NE(error_of("n[1-]").find("empty range"), std::string::npos);
  EXPECT_NE(error_of("n[-3]").find("empty range"), std::string::npos);
  EXPECT_NE(error_of("n[1-2-3]").find("not a digit"), std::string::npos);
  EXPECT_NE(error_of("n[1 ,2]").find("not a digit"), std::string::npos);
  // Every message tells what a valid list looks like.
  EXPECT_NE(error_of("n[").find("gpu-[01-04,07],login[1-2]"), std::string::npos);
}

TEST(Hostlist, RefusesHugeExpansions) {
  EXPECT_NE(error_of("n[1-100000000]").find("more than"), std::string::npos);
  EXPECT_NE(error_of("n[1-2000]m[1-2000]").find("more than"), std::string::npos);
  EXPECT_NE(error_of("n[1234567890123456789]").find("too long"), std::string::npos);
  EXPECT_EQ(expand_hostlist("n[1-1000]m[1-1000]").size(), 1000000u);
}

// Cross-check against Slurm's own expansion. `scontrol show hostnames` works without a
// controller but needs a readable slurm.conf, so we point SLURM_CONF at a minimal one.
std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  pclose(pipe);
  return out;
}

TEST(Hostlist, AgreesWithScontrol) {
  if (run("command -v scontrol").empty()) {
    GTEST_SKIP() << "scontrol not installed (slurm-client); install with scripts/setup.sh --test";
  }
  char dir_template[] = "/tmp/dlaunch_hostlist_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string conf = std::string(dir_template) + "/slurm.conf";
  std::ofstream(conf) << "ClusterName=hostlisttest\nSlurmctldHost=localhost\n"
                         "NodeName=n1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
                         "PartitionName=p Nodes=n1 Default=YES\n";
  const std::vector<std::string> inputs = {"node1",
                                           "a,b,c",
                                           "a b",
                                           "n[1-3]",
                                           "n[8-11]",
                                           "n[09-11]",
                                           "n[001-10]",
                                           "[1-3]",
                                           "gpu-[01-04,07]",
                                           "gpu-[01-04,07],login[1-2]",
                                           "rack[1-2]-n[01-02]",
                                           "a[1-2][3-4]",
                                           "r[1-2]c[1-3]n[5],x",
                                           "n[3,1,3]",
                                           "n[98-101],m[0]",
                                           "a,,b",
                                           "a[1-2]b[3-4]c[5-6]",
                                           "a[1-2]b[3-4]c[5-6]d[7-8]",
                                           "a[1-3]b[4-5]",
                                           "x[1,3],y[2]z[4-5]"};
  for (const auto& input : inputs) {
    std::string out = run("SLURM_CONF=" + conf + " scontrol show hostnames '" + input + "' 2>&1");
    std::istringstream lines(out);
    Hosts expected;
    for (std::string line; std::getline(lines, line);) expected.push_back(line);
    EXPECT_EQ(expand_hostlist(input), expected) << "input: " << input << "\nscontrol: " << out;
  }
  std::remove(conf.c_str());
  rmdir(dir_template);
}

}  // namespace
}  // namespace dlaunch
