#include "rendezvous/handlers/round_table.h"

#include <fmt/format.h>

#include <map>
#include <sstream>

#include "common/error.h"

namespace dlaunch {

namespace {

[[noreturn]] void malformed(const char* what, const Bytes& value) {
  throw ProtocolError(fmt::format(
      "dynamic rendezvous: malformed {} '{}'; expected the v1 format a dlaunch agent of this "
      "job writes (another program writing under dlaunch/rdzv/, or a corrupted store?)",
      what, to_string(value).substr(0, 200)));
}

// Newlines would split a field; hosts and builds never hold them, but a table must not break.
std::string one_line(std::string s) {
  for (auto& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

}  // namespace

RoundTable RoundTable::make(const std::vector<NodeDescriptor>& arrivals,
                            const std::vector<size_t>& by_rank) {
  RoundTable t;
  t.participants = static_cast<int64_t>(by_rank.size());
  bool listed = t.participants <= kNodesListedUpTo;
  std::map<std::string, int64_t> counts;
  for (size_t i : by_rank) {
    const auto& d = arrivals[i];
    if (!t.worker_runs.empty() && t.worker_runs.back().second == d.local_world_size) {
      ++t.worker_runs.back().first;
    } else {
      t.worker_runs.emplace_back(1, d.local_world_size);
    }
    if (listed) {
      t.hosts.push_back(d.host);
      t.builds.push_back(d.version);
    } else {
      ++counts[d.version];
    }
  }
  t.build_counts.assign(counts.begin(), counts.end());
  return t;
}

std::vector<int64_t> RoundTable::local_world_sizes() const {
  std::vector<int64_t> out;
  out.reserve(participants);
  for (auto [count, size] : worker_runs) out.insert(out.end(), count, size);
  return out;
}

std::vector<std::pair<std::string, std::string>> RoundTable::host_builds() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < hosts.size(); ++i) out.emplace_back(hosts[i], builds[i]);
  for (const auto& [build, count] : build_counts) {
    out.emplace_back(fmt::format("{} node{}", count, count == 1 ? "" : "s"), build);
  }
  return out;
}

Bytes RoundTable::encode() const {
  // v1 n=<n>
  // workers <count>x<size>,...
  // node <build>\t<host>            (per rank, when listed)
  // builds <count>\t<build>         (per distinct build, when not)
  std::string s = fmt::format("v1 n={}\nworkers ", participants);
  for (size_t i = 0; i < worker_runs.size(); ++i) {
    s += fmt::format("{}{}x{}", i ? "," : "", worker_runs[i].first, worker_runs[i].second);
  }
  s += "\n";
  for (size_t i = 0; i < hosts.size(); ++i) {
    s += fmt::format("node {}\t{}\n", one_line(builds[i]), one_line(hosts[i]));
  }
  for (const auto& [build, count] : build_counts) {
    s += fmt::format("builds {}\t{}\n", count, one_line(build));
  }
  return to_bytes(s);
}

RoundTable RoundTable::decode(const Bytes& value) {
  std::istringstream in(to_string(value));
  std::string line;
  RoundTable t;
  if (!std::getline(in, line) || line.rfind("v1 n=", 0) != 0) malformed("round table", value);
  try {
    t.participants = std::stoll(line.substr(5));
    int64_t listed_workers = 0;
    while (std::getline(in, line)) {
      if (line.rfind("workers ", 0) == 0) {
        std::istringstream runs(line.substr(8));
        std::string run;
        while (std::getline(runs, run, ',')) {
          auto x = run.find('x');
          if (x == std::string::npos) malformed("round table", value);
          t.worker_runs.emplace_back(std::stoll(run.substr(0, x)), std::stoll(run.substr(x + 1)));
          listed_workers += t.worker_runs.back().first;
        }
      } else if (line.rfind("node ", 0) == 0) {
        auto tab = line.find('\t');
        if (tab == std::string::npos) malformed("round table", value);
        t.builds.push_back(line.substr(5, tab - 5));
        t.hosts.push_back(line.substr(tab + 1));
      } else if (line.rfind("builds ", 0) == 0) {
        auto tab = line.find('\t');
        if (tab == std::string::npos) malformed("round table", value);
        t.build_counts.emplace_back(line.substr(tab + 1), std::stoll(line.substr(7, tab - 7)));
      }  // other lines: fields of a later build
    }
    if (listed_workers != t.participants) malformed("round table", value);
  } catch (const std::logic_error&) {
    malformed("round table", value);
  }
  return t;
}

std::vector<RankAssignment> RankAssignment::make(const std::vector<NodeDescriptor>& arrivals,
                                                 const std::vector<size_t>& by_rank) {
  const auto n = static_cast<int64_t>(by_rank.size());
  std::vector<RankAssignment> out(arrivals.size());
  for (int64_t rank = 0; rank < n; ++rank) {
    auto& a = out[by_rank[rank]];
    a.rank = rank;
    for (auto w : watched_ranks(rank, n)) {
      const auto& d = arrivals[by_rank[w]];
      a.watched.push_back({d.id, d.host, w});
    }
  }
  return out;
}

Bytes RankAssignment::encode() const {
  // v1 rank=<r>
  // watch <rank>\t<id>\t<host>      (per watched node)
  std::string s = fmt::format("v1 rank={}\n", rank);
  for (const auto& w : watched) {
    s += fmt::format("watch {}\t{}\t{}\n", w.rank, one_line(w.id), one_line(w.host));
  }
  return to_bytes(s);
}

RankAssignment RankAssignment::decode(const Bytes& value) {
  std::istringstream in(to_string(value));
  std::string line;
  RankAssignment a;
  if (!std::getline(in, line) || line.rfind("v1 rank=", 0) != 0) {
    malformed("rank assignment", value);
  }
  try {
    a.rank = std::stoll(line.substr(8));
    while (std::getline(in, line)) {
      if (line.rfind("watch ", 0) != 0) continue;  // a later build's field
      auto t1 = line.find('\t');
      auto t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
      if (t2 == std::string::npos) malformed("rank assignment", value);
      a.watched.push_back({line.substr(t1 + 1, t2 - t1 - 1), line.substr(t2 + 1),
                           std::stoll(line.substr(6, t1 - 6))});
    }
  } catch (const std::logic_error&) {
    malformed("rank assignment", value);
  }
  return a;
}

}  // namespace dlaunch
