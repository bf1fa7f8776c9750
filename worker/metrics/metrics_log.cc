#include "worker/metrics/metrics_log.h"

#include <cerrno>
#include <chrono>
#include <fstream>

#include "common/error.h"

namespace dlaunch::metrics {

MetricsLog::MetricsLog(const std::string& path, int64_t attempt) : path_(path), attempt_(attempt) {
  file_ = std::fopen(path.c_str(), "a+");
  if (file_ == nullptr) throw SystemError(errno_message("opening metrics file " + path, errno));
  // A run killed mid-line left a torn last line: end it, so our first record starts clean.
  if (std::fseek(file_, -1, SEEK_END) == 0 && std::fgetc(file_) != '\n') {
    std::fputc('\n', file_);
    std::fflush(file_);
  }
}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

nlohmann::json MetricsLog::write(const nlohmann::json& record) {
  nlohmann::json stamped = record;
  stamped["attempt"] = attempt_;
  stamped["time"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string line = stamped.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw SystemError(errno_message("writing metrics file " + path_, errno));
  }
  return stamped;
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace dlaunch::metrics
