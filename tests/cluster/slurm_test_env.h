// Where the Slurm cluster tests find the private cluster: the one the ctest fixture started in
// DLAUNCH_TEST_SLURM_DIR, else $SLURM_CONF when a developer started one by hand
// (tests/cluster/start_slurm.sh DIR; source DIR/env.sh). Tests skip with the reason otherwise.
#pragma once

#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace dlaunch::test {

struct SlurmLocation {
  std::string conf;         // slurm.conf of a running cluster; empty: none
  std::string skip_reason;  // why not
};

inline SlurmLocation find_test_slurm() {
  const std::string dir = DLAUNCH_TEST_SLURM_DIR;
  std::string line;
  if (std::ifstream skip(dir + "/skip"); skip && std::getline(skip, line)) return {"", line};
  if (std::ifstream pid(dir + "/run/slurmctld.pid"); pid && std::getline(pid, line)) {
    if (::kill(std::atoi(line.c_str()), 0) == 0) return {dir + "/slurm.conf", ""};
  }
  if (const char* c = std::getenv("SLURM_CONF"); c != nullptr && *c != '\0') return {c, ""};
  return {"",
          "no Slurm cluster running: run these tests through `ctest -L cluster` (its "
          "fixture starts one), or start one with tests/cluster/start_slurm.sh " +
              dir + " and source " + dir + "/env.sh"};
}

}  // namespace dlaunch::test
