#include "rendezvous/handlers/version_mix.h"

#include <map>

namespace dlaunch {

std::string describe_version_mix(const std::string& mine,
                                 const std::vector<std::pair<std::string, std::string>>& builds) {
  if (mine.empty()) return "";
  std::map<std::string, std::vector<std::string>> hosts_by_build;
  bool mixed = false;
  for (const auto& [host, build] : builds) {
    hosts_by_build[build].push_back(host);
    mixed = mixed || build != mine;
  }
  if (!mixed) return "";
  std::string list;
  for (const auto& [build, hosts] : hosts_by_build) {
    std::string names;
    for (const auto& h : hosts) names += (names.empty() ? "" : ", ") + h;
    list += (list.empty() ? "" : "; ") +
            (build.empty() ? std::string("an older dlaunch (no version)") : build) + " on " + names;
  }
  return "the agents of this job run different dlaunch builds: " + list + " (this agent: " + mine +
         "); expected one build on every node: install the same package everywhere (compare "
         "`dlaunch --version` on each node)";
}

}  // namespace dlaunch
