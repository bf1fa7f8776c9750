#include "launcher/output/filtered_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/error.h"
#include "common/log.h"
#include "launcher/config/torchrun_flags.h"

namespace dlaunch {
namespace {

// A line without '\n' longer than this is copied (or dropped) as it is, so a runaway progress
// bar cannot grow the agent.
constexpr size_t kMaxPendingLine = 1 << 20;

const std::vector<std::string>& filters(const LaunchConfig& cfg, int stream) {
  return stream == 1 ? cfg.duplicate_stdout_filters : cfg.duplicate_stderr_filters;
}

}  // namespace

std::unique_ptr<FilteredCopy> FilteredCopy::open(const LaunchConfig& cfg,
                                                 const std::string& attempt_dir) {
  if (cfg.duplicate_stdout_filters.empty() && cfg.duplicate_stderr_filters.empty()) return nullptr;
  std::unique_ptr<FilteredCopy> copy(new FilteredCopy(cfg));
  for (int stream : {1, 2}) {
    if (filters(cfg, stream).empty()) continue;
    copy->path_[stream] =
        attempt_dir + (stream == 1 ? "/filtered_stdout.log" : "/filtered_stderr.log");
    int fd = ::open(copy->path_[stream].c_str(),
                    O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw SystemError(errno_message("cannot create " + copy->path_[stream], errno));
    }
    copy->fd_[stream] = fd;
  }
  return copy;
}

FilteredCopy::~FilteredCopy() {
  for (int fd : fd_) {
    if (fd >= 0) ::close(fd);
  }
}

void FilteredCopy::feed(int64_t local_rank, int stream, std::string_view bytes,
                        const std::string& prefix) {
  if ((stream != 1 && stream != 2) || fd_[stream] < 0) return;
  if (!(cfg_.tee.for_rank(local_rank) & (stream == 1 ? StdSpec::kOut : StdSpec::kErr))) return;
  // torchrun tails only the ranks --local_ranks_filter shows, for the copies too.
  const auto& shown = cfg_.local_ranks_filter;
  if (!shown.empty() && std::find(shown.begin(), shown.end(), local_rank) == shown.end()) return;
  std::string& line = pending_[{local_rank, stream}];
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    size_t take = nl == std::string_view::npos ? bytes.size() : nl + 1;
    line.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (line.back() == '\n' || line.size() >= kMaxPendingLine) {
      copy_if_matching(stream, line, prefix);
      line.clear();
    }
  }
}

void FilteredCopy::finish(int64_t local_rank, const std::string& prefix) {
  for (int stream : {1, 2}) {
    auto it = pending_.find({local_rank, stream});
    if (it == pending_.end()) continue;
    if (!it->second.empty()) copy_if_matching(stream, it->second, prefix);
    pending_.erase(it);
  }
}

void FilteredCopy::copy_if_matching(int stream, const std::string& line,
                                    const std::string& prefix) {
  if (fd_[stream] < 0 || !line_matches(line, filters(cfg_, stream))) return;
  std::string out = prefix + line;
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::write(fd_[stream], out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A copy for convenience: the worker's own log files and the console still have the line.
      log_warning("{}; the filtered copy stops here",
                  errno_message("cannot write " + path_[stream], n == 0 ? ENOSPC : errno));
      ::close(fd_[stream]);
      fd_[stream] = -1;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace dlaunch
