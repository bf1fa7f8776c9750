// --rdzv_endpoint for etcd: one endpoint or a list of a cluster's members (etcdctl's form).
#include "rendezvous/etcd/etcd_endpoints.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlaunch::etcd {
namespace {

std::string usage_error(const std::string& text) {
  try {
    parse_endpoints(text, "--rdzv_endpoint");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(EtcdEndpoints, OneEndpointOrAListInEtcdctlsForm) {
  auto one = parse_endpoints("10.0.0.5:2379", "--rdzv_endpoint");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].to_string(), "10.0.0.5:2379");
  EXPECT_EQ(format_endpoints(parse_endpoints("127.0.0.1:23801,127.0.0.1:23811,127.0.0.1:23821",
                                             "--rdzv_endpoint")),
            "127.0.0.1:23801,127.0.0.1:23811,127.0.0.1:23821");
  // etcdctl's and etcd's own spelling, IPv6 in brackets, the default port.
  EXPECT_EQ(format_endpoints(parse_endpoints("http://etcd-a:2379,http://[fd00::7]:2380/,etcd-c",
                                             "--rdzv_endpoint")),
            "etcd-a:2379,[fd00::7]:2380,etcd-c:2379");
}

TEST(EtcdEndpoints, ABadEntryIsNamedWithWhatToWrite) {
  std::string e = usage_error("127.0.0.1:23801,,127.0.0.1:23821");
  EXPECT_NE(e.find("endpoint 2 of '127.0.0.1:23801,,127.0.0.1:23821' is empty"), std::string::npos)
      << e;
  EXPECT_NE(e.find("comma-separated list"), std::string::npos) << e;
  e = usage_error("127.0.0.1:23801,");
  EXPECT_NE(e.find("endpoint 2 of"), std::string::npos) << e;
  e = usage_error("127.0.0.1:23801,127.0.0.1:http");
  EXPECT_NE(e.find("--rdzv_endpoint: endpoint '127.0.0.1:http'"), std::string::npos) << e;
  e = usage_error("127.0.0.1:23801,[fd00::7:2379");
  EXPECT_NE(e.find("'[fd00::7:2379'"), std::string::npos) << e;
  EXPECT_NE(e.find("[v6addr]:port"), std::string::npos) << e;
  e = usage_error("a:2379, b:2379");
  EXPECT_NE(e.find("contains a space"), std::string::npos) << e;
  e = usage_error("https://etcd-a:2379");
  EXPECT_NE(e.find("only plain http://"), std::string::npos) << e;
  e = usage_error("etcd-a:0");
  EXPECT_NE(e.find("port 0"), std::string::npos) << e;
  e = usage_error("etcd-a:70000");
  EXPECT_NE(e.find("outside 0-65535"), std::string::npos) << e;
  e = usage_error("http://etcd-a:2379/v3");
  EXPECT_NE(e.find("has a path"), std::string::npos) << e;
  e = usage_error("");
  EXPECT_NE(e.find("--rdzv_endpoint is empty"), std::string::npos) << e;
}

}  // namespace
}  // namespace dlaunch::etcd
