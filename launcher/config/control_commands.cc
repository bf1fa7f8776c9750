#include "launcher/config/control_commands.h"

#include <algorithm>

namespace dlaunch {

bool is_job_control_command(const std::string& word) {
  const auto& all = job_control_commands();
  return std::find(all.begin(), all.end(), word) != all.end();
}

const std::vector<std::string>& job_control_commands() {
  static const std::vector<std::string> commands = {"status", "stop", "restart", "dump"};
  return commands;
}

// Those job_control.cc's parse() takes.
const std::vector<std::string>& job_control_flags() {
  static const std::vector<std::string> flags = {
      "--rdzv_backend", "--rdzv_endpoint", "--master_addr", "--master_port", "--rdzv_id",
      "--run_id",       "--token_file",    "--rdzv_conf",   "--json",        "--events",
      "--timeout",      "--help"};
  return flags;
}

}  // namespace dlaunch
