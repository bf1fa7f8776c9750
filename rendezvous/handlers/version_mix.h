// Agents of one job running different dlaunch builds: each agent publishes its build
// ("0.1.0+3467aab": version and commit, RendezvousParams::version) in the record it writes at
// rendezvous, and every agent compares the round's records with its own. A mix is a warning,
// not a refusal: today's wire formats are the same in every version (older agents publish no
// version and read the new field as nothing). When a format changes, the version that changes
// it must refuse the mix instead.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dlaunch {

// One sentence naming each build and its hosts when any (host, build) differs from `mine`; ""
// when all agree or `mine` is empty (a test or tool that publishes none). An empty build is an
// agent older than version publishing.
std::string describe_version_mix(const std::string& mine,
                                 const std::vector<std::pair<std::string, std::string>>& builds);

}  // namespace dlaunch
