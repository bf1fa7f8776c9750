// The records the closing node of a dynamic round writes (rendezvous/handlers/round_table.h): what each
// node reads back must equal what it would compute from all N descriptors, in a fixed size.
#include "rendezvous/handlers/round_table.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlaunch {
namespace {

std::vector<NodeDescriptor> nodes(int n, int64_t workers = 8) {
  std::vector<NodeDescriptor> out;
  for (int i = 0; i < n; ++i) {
    NodeDescriptor d{"id" + std::to_string(i), "host-" + std::to_string(i), workers, -1};
    d.version = "0.1.0+aaaaaaa";
    out.push_back(d);
  }
  return out;
}

TEST(RoundTable, SmallRoundListsHostsAndBuildsAndRoundTrips) {
  auto arrivals = nodes(3);
  arrivals[1].local_world_size = 2;
  arrivals[2].version = "0.2.0+bbbbbbb";
  std::vector<size_t> by_rank = {2, 0, 1};
  auto t = RoundTable::decode(RoundTable::make(arrivals, by_rank).encode());
  EXPECT_EQ(t.participants, 3);
  EXPECT_EQ(t.local_world_sizes(), (std::vector<int64_t>{8, 8, 2}));
  EXPECT_EQ(t.hosts, (std::vector<std::string>{"host-2", "host-0", "host-1"}));
  EXPECT_EQ(t.host_builds()[0], (std::pair<std::string, std::string>{"host-2", "0.2.0+bbbbbbb"}));
}

TEST(RoundTable, LargeRoundStaysSmall) {
  const int n = 16384;
  auto arrivals = nodes(n);
  std::vector<size_t> by_rank(n);
  for (int i = 0; i < n; ++i) by_rank[i] = i;
  Bytes encoded = RoundTable::make(arrivals, by_rank).encode();
  EXPECT_LT(encoded.size(), 100u) << to_string(encoded);
  auto t = RoundTable::decode(encoded);
  EXPECT_EQ(t.local_world_sizes(), std::vector<int64_t>(n, 8));
  EXPECT_TRUE(t.hosts.empty());
  EXPECT_EQ(t.host_builds(),
            (std::vector<std::pair<std::string, std::string>>{{"16384 nodes", "0.1.0+aaaaaaa"}}));
}

TEST(RankAssignment, EachArrivalGetsItsRankAndRingNeighbours) {
  auto arrivals = nodes(4);
  std::vector<size_t> by_rank = {3, 2, 1, 0};  // arrival 3 is rank 0, ...
  auto all = RankAssignment::make(arrivals, by_rank);
  ASSERT_EQ(all.size(), 4u);
  auto a = RankAssignment::decode(all[3].encode());
  EXPECT_EQ(a.rank, 0);
  ASSERT_EQ(a.watched.size(), 2u);
  EXPECT_EQ(a.watched[0], (NodeRef{"id2", "host-2", 1}));
  EXPECT_EQ(a.watched[1], (NodeRef{"id0", "host-0", 3}));
}

TEST(RoundTable, GarbageIsAProtocolErrorNamingTheRecord) {
  EXPECT_THROW(RoundTable::decode(to_bytes("v1 n=2\nworkers 1x8\n")), ProtocolError);
  EXPECT_THROW(RoundTable::decode(to_bytes("hello")), ProtocolError);
  EXPECT_THROW(RankAssignment::decode(to_bytes("v1 rank=x")), ProtocolError);
  try {
    RankAssignment::decode(to_bytes("nonsense"));
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("rank assignment"), std::string::npos);
  }
}

}  // namespace
}  // namespace dlaunch
