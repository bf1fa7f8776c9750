#include "launcher/output/log_router.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "common/log.h"
#include "launcher/config/torchrun_flags.h"

namespace dlaunch {

namespace {

// Writes all of `data`, or gives up: a console that went away (a closed pipe) or a full disk is
// not a reason to stop the job. Returns how much was written; errno tells why the rest was not.
size_t write_all(int fd, std::string_view data) {
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = ENOSPC;  // a regular file that takes nothing is full
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  return written;
}

// --log_timestamps: "14:05:01.123 " in local time, when the agent got the line.
std::string console_timestamp() { return time_of_day_now() + " "; }

}  // namespace

std::shared_ptr<SharedConsole> make_shared_console(const LaunchConfig& cfg) {
  if (!cfg.log_fold) return nullptr;
  auto shared = std::make_shared<SharedConsole>();
  for (int stream : {1, 2}) {
    size_t shown = 0;
    for (int64_t local_rank = 0; local_rank < cfg.nproc_per_node; ++local_rank) {
      shown += cfg.console_shows(local_rank, stream);
    }
    if (shown >= 2) shared->fold[stream].emplace(cfg.role, shown);
  }
  return shared;
}

std::string console_prefix(const LaunchConfig& cfg, int64_t local_rank, int64_t rank,
                           const std::string& hostname) {
  if (cfg.log_line_prefix_template.empty()) return fmt::format("[{}{}]:", cfg.role, local_rank);
  return render_log_line_prefix(cfg.log_line_prefix_template,
                                PrefixMacros{cfg.role, rank, local_rank, hostname});
}

bool writes_file(const LaunchConfig& cfg, int64_t local_rank, int stream) {
  int bit = stream == 1 ? StdSpec::kOut : StdSpec::kErr;
  return !cfg.log_dir.empty() || (cfg.redirects.for_rank(local_rank) & bit) ||
         (cfg.tee.for_rank(local_rank) & bit);
}

WorkerOutput::WorkerOutput(const LaunchConfig& cfg, int64_t local_rank, const std::string& rank_dir,
                           std::shared_ptr<SharedConsole> shared, OutputLossCallback on_loss,
                           std::string prefix, bool append)
    : shared_(std::move(shared)),
      on_loss_(std::move(on_loss)),
      local_rank_(local_rank),
      prefix_(prefix.empty() ? fmt::format("[{}{}]:", cfg.role, local_rank) : std::move(prefix)) {
  for (int stream : {1, 2}) {
    ConsoleStyle& style = style_[stream];
    style.rank = local_rank;
    // A fold is made only for the streams the console shows (make_shared_console).
    if (shared_ && shared_->fold[stream] && cfg.console_shows(local_rank, stream)) {
      style.fold = &*shared_->fold[stream];
    }
    if (cfg.log_timestamps) style.stamp = console_timestamp;
    if (cfg.console_shows(local_rank, stream)) console_[stream].emplace(prefix_, style);
    if (!writes_file(cfg, local_rank, stream)) continue;
    path_[stream] = rank_dir + (stream == 1 ? "/stdout.log" : "/stderr.log");
    int fd = ::open(path_[stream].c_str(),
                    O_WRONLY | O_CREAT | (append ? 0 : O_TRUNC) | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw SystemError(errno_message("cannot create log file " + path_[stream], errno));
    file_fd_[stream] = fd;
  }
}

WorkerOutput::~WorkerOutput() {
  for (int fd : file_fd_) {
    if (fd >= 0) ::close(fd);
  }
}

void WorkerOutput::show(int stream, const std::string& text) {
  if (!text.empty()) write_all(stream, text);
}

void WorkerOutput::write(int stream, std::string_view bytes, TimePoint now) {
  if (stream != 1 && stream != 2) return;
  std::string_view for_console = bytes;
  if (file_fd_[stream] >= 0) {
    size_t written = write_all(file_fd_[stream], bytes);
    if (written < bytes.size()) {
      const bool had_console = console_[stream].has_value();
      on_file_failed(stream, bytes.substr(written), errno);
      // A console copy started just now shows what the file did not take.
      if (!had_console) for_console = bytes.substr(written);
    }
  } else if (loss_[stream]) {
    loss_[stream]->bytes += bytes.size();
  }
  if (!console_[stream]) return;
  scratch_.clear();
  console_[stream]->feed(for_console, now, scratch_);
  show(stream, scratch_);
}

void WorkerOutput::on_file_failed(int stream, std::string_view rest, int error) {
  ::close(file_fd_[stream]);
  file_fd_[stream] = -1;
  auto loss = std::make_shared<OutputLoss>();
  loss->local_rank = local_rank_;
  loss->stream = stream;
  loss->path = path_[stream];
  loss->error = error;
  loss->bytes = rest.size();
  if (!console_[stream]) {
    console_[stream].emplace(prefix_, style_[stream]);
    loss->console_fallback = true;
  }
  loss_[stream] = loss;
  if (on_loss_) on_loss_(loss);
}

void WorkerOutput::flush_due(TimePoint now) {
  for (int stream : {1, 2}) {
    if (!console_[stream]) continue;
    scratch_.clear();
    console_[stream]->flush(now, kPartialLineDelay, scratch_);
    if (shared_ && shared_->fold[stream]) {
      shared_->fold[stream]->flush_due(now, kPartialLineDelay, scratch_);
    }
    show(stream, scratch_);
  }
}

void WorkerOutput::finish() {
  for (int stream : {1, 2}) {
    if (!console_[stream]) continue;
    scratch_.clear();
    console_[stream]->finish(scratch_);
    show(stream, scratch_);
  }
}

std::optional<TimePoint> WorkerOutput::next_due() const {
  std::optional<TimePoint> due;
  for (int stream : {1, 2}) {
    if (!console_[stream]) continue;
    const ConsoleFold* fold = shared_ && shared_->fold[stream] ? &*shared_->fold[stream] : nullptr;
    for (auto since : {console_[stream]->pending_since(),
                       fold ? fold->pending_since(kPartialLineDelay) : std::nullopt}) {
      if (!since) continue;
      TimePoint t = *since + kPartialLineDelay;
      if (!due || t < *due) due = t;
    }
  }
  return due;
}

}  // namespace dlaunch
