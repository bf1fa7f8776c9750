#include "launcher/log_router.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"

namespace dlaunch {

bool writes_file(const LaunchConfig& cfg, int64_t local_rank, int stream) {
  int bit = stream == 1 ? StdSpec::kOut : StdSpec::kErr;
  return !cfg.log_dir.empty() || (cfg.redirects.for_rank(local_rank) & bit) ||
         (cfg.tee.for_rank(local_rank) & bit);
}

WorkerOutput::WorkerOutput(const LaunchConfig& cfg, int64_t local_rank,
                           const std::string& rank_dir)
    : prefix_(fmt::format("[{}{}]:", cfg.role, local_rank)) {
  for (int stream : {1, 2}) {
    int bit = stream == 1 ? StdSpec::kOut : StdSpec::kErr;
    console_[stream] = cfg.console_shows(local_rank) && !(cfg.redirects.for_rank(local_rank) & bit);
    if (!writes_file(cfg, local_rank, stream)) continue;
    std::string path = rank_dir + (stream == 1 ? "/stdout.log" : "/stderr.log");
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw SystemError(errno_message("cannot create log file " + path, errno));
    file_fd_[stream] = fd;
  }
}

WorkerOutput::~WorkerOutput() {
  for (int fd : file_fd_) {
    if (fd >= 0) ::close(fd);
  }
}

void WorkerOutput::line(int stream, std::string_view text) {
  if (stream != 1 && stream != 2) return;
  static const char kNewline = '\n';
  if (file_fd_[stream] >= 0) {
    iovec iov[2] = {{const_cast<char*>(text.data()), text.size()},
                    {const_cast<char*>(&kNewline), 1}};
    ssize_t ignored = ::writev(file_fd_[stream], iov, 2);
    (void)ignored;
  }
  if (console_[stream]) {
    iovec iov[3] = {{prefix_.data(), prefix_.size()},
                    {const_cast<char*>(text.data()), text.size()},
                    {const_cast<char*>(&kNewline), 1}};
    // A console that went away (closed pipe) is not a reason to stop the job.
    ssize_t ignored = ::writev(stream, iov, 3);
    (void)ignored;
  }
}

}  // namespace dlaunch
