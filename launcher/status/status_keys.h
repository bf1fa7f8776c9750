// Where a job's agents publish their status endpoints, shared by the agents that publish
// (agent_monitor.h) and `dlaunch status|stop|restart|dump`, which read them (job_control.h).
#pragma once

#include <cstdint>
#include <string>

namespace dlaunch {

// The store keys where agents publish their endpoints, relative to the job's store
// ("dlaunch/job/<run_id>/" on the TCP store).
inline constexpr const char kStatusAgentsKey[] = "status/agents";
std::string status_agent_key(int64_t index);
// The job's store: the TCP store at the job's endpoint under this prefix, where the static and
// c10d rendezvous put their result's store (rendezvous/handlers/static_rendezvous.cc,
// dynamic_rendezvous.cc), and where a single-node agent publishes its endpoint too.
std::string job_store_prefix(const std::string& run_id);

}  // namespace dlaunch
