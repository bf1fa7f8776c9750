#include "launcher/agent/parent_error_file.h"

#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/worker_env.h"
#include "launcher/agent/failure_report.h"

namespace dlaunch {

void write_parent_error_file(const WorkerGroup& group,
                             const std::vector<std::pair<std::string, std::string>>& base_env,
                             const std::string& host, Duration hang_timeout) {
  std::string target;
  for (const auto& [k, v] : base_env) {
    if (k == env_names::kErrorFile) target = v;
  }
  auto root = group.root_cause();
  if (target.empty() || !root) return;
  const WorkerRecord& w = group.worker(*root);
  std::ifstream in(w.error_file);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (content.empty()) {
    nlohmann::json j;
    j["message"]["message"] =
        fmt::format("dlaunch: rank {} on {} {}", w.global_rank, host, describe_end(w, hang_timeout));
    j["message"]["extraInfo"]["timestamp"] = std::to_string(
        std::chrono::duration_cast<std::chrono::seconds>(w.exited_wall.time_since_epoch())
            .count());
    content = j.dump();
  }
  std::ofstream out(target);
  out << content;
  if (!out) log_warning("could not write the error file {} for the parent launcher", target);
}

}  // namespace dlaunch
