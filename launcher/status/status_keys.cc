#include "launcher/status/status_keys.h"

#include <fmt/format.h>

namespace dlaunch {

std::string status_agent_key(int64_t index) {
  return fmt::format("status/agent/{}", index);
}

std::string job_store_prefix(const std::string& run_id) {
  return "dlaunch/job/" + run_id;
}

}  // namespace dlaunch
