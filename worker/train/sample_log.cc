#include "worker/train/sample_log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "common/env.h"
#include "common/error.h"

namespace dlaunch::train {

SampleLog SampleLog::from_env() {
  SampleLog log;
  const std::string dir = get_env_or("DTRAIN_LOG_SAMPLES", "");
  if (dir.empty()) return log;
  log.path_ = (std::filesystem::path(dir) / fmt::format("samples.{}", ::getpid())).string();
  std::FILE* f = std::fopen(log.path_.c_str(), "a");
  if (f == nullptr) {
    throw SystemError(errno_message("opening DTRAIN_LOG_SAMPLES file " + log.path_, errno));
  }
  log.file_.reset(f, std::fclose);
  return log;
}

void SampleLog::record(int64_t epoch, int64_t global_step, int world_size,
                       const std::vector<int64_t>& indices, size_t first, size_t count) {
  if (!file_) return;
  std::string line = fmt::format("{} {} {}", epoch, global_step, world_size);
  for (size_t i = first; i < first + count && i < indices.size(); ++i) {
    line += fmt::format(" {}", indices[i]);
  }
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() ||
      std::fflush(file_.get()) != 0) {
    throw SystemError(errno_message("writing DTRAIN_LOG_SAMPLES file " + path_, errno));
  }
}

}  // namespace dlaunch::train
