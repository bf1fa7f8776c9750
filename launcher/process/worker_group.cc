#include "launcher/process/worker_group.h"

#include <utility>

#include "common/error.h"

namespace dlaunch {

const char* group_state_name(GroupState s) {
  switch (s) {
    case GroupState::kInit: return "Init";
    case GroupState::kHealthy: return "Healthy";
    case GroupState::kSucceeded: return "Succeeded";
    case GroupState::kFailed: return "Failed";
    case GroupState::kUnhealthy: return "Unhealthy";
    case GroupState::kStopped: return "Stopped";
  }
  return "?";
}

WorkerGroup::WorkerGroup(int64_t attempt, std::vector<WorkerRecord> workers)
    : attempt_(attempt), workers_(std::move(workers)) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    DL_CHECK(workers_[i].local_rank == static_cast<int64_t>(i))
        << "worker " << i << " has local rank " << workers_[i].local_rank;
  }
}

WorkerRecord& WorkerGroup::worker(int64_t local_rank) {
  return const_cast<WorkerRecord&>(std::as_const(*this).worker(local_rank));
}

const WorkerRecord& WorkerGroup::worker(int64_t local_rank) const {
  DL_CHECK(local_rank >= 0 && local_rank < static_cast<int64_t>(workers_.size()))
      << "local_rank=" << local_rank << " size=" << workers_.size();
  return workers_[static_cast<size_t>(local_rank)];
}

bool WorkerGroup::final() const {
  return state_ != GroupState::kInit && state_ != GroupState::kHealthy;
}

void WorkerGroup::on_started(int64_t local_rank, int pid, TimePoint now,
                             std::chrono::system_clock::time_point wall) {
  WorkerRecord& w = worker(local_rank);
  DL_CHECK(w.state == WorkerState::kInit) << "local_rank=" << local_rank << " started twice";
  w.pid = pid;
  w.state = WorkerState::kRunning;
  w.started = now;
  w.started_wall = wall;
  if (state_ != GroupState::kInit) return;
  for (const auto& x : workers_) {
    if (x.state == WorkerState::kInit) return;
  }
  state_ = GroupState::kHealthy;
}

void WorkerGroup::on_exit(int64_t local_rank, const ExitStatus& status, TimePoint now,
                          std::chrono::system_clock::time_point wall) {
  WorkerRecord& w = worker(local_rank);
  if (w.state != WorkerState::kRunning) return;  // abandoned, or a duplicate report
  w.exit = status;
  if (!w.hung) {  // a hung worker's time is when it was declared hung, not when we killed it
    w.exited = now;
    w.exited_wall = wall;
  }
  if (w.replacing) {
    // Its failure is being taken by a replacement: not the group's, whatever the code (a hung
    // one is killed, a success after the decision is still replaced); once the group is final
    // for another reason, a consequence of that stop.
    w.state = final() ? WorkerState::kStopped : WorkerState::kFailed;
    return;
  }
  if (!status.success()) {
    // Once the group is final, a non-zero exit is a consequence of the stop (our SIGTERM, a
    // broken collective), not a new cause.
    w.state = final() ? WorkerState::kStopped : WorkerState::kFailed;
    if (!final()) {
      state_ = GroupState::kFailed;
      root_cause_ = local_rank;
    }
    return;
  }
  w.state = WorkerState::kSucceeded;
  if (state_ != GroupState::kHealthy) return;
  for (const auto& x : workers_) {
    if (x.state != WorkerState::kSucceeded) return;
  }
  state_ = GroupState::kSucceeded;
}

void WorkerGroup::on_hung(int64_t local_rank, TimePoint now,
                          std::chrono::system_clock::time_point wall) {
  WorkerRecord& w = worker(local_rank);
  if (final() || w.state != WorkerState::kRunning) return;
  w.hung = true;
  w.exited = now;
  w.exited_wall = wall;
  state_ = GroupState::kUnhealthy;
  root_cause_ = local_rank;
}

void WorkerGroup::blame_hang(int64_t local_rank) {
  if (state_ != GroupState::kUnhealthy || !root_cause_ || *root_cause_ == local_rank) return;
  WorkerRecord& first = worker(*root_cause_);
  WorkerRecord& w = worker(local_rank);
  if (w.state != WorkerState::kRunning && !w.hung) return;
  w.hung = true;
  w.exited = first.exited;
  w.exited_wall = first.exited_wall;
  root_cause_ = local_rank;
}

void WorkerGroup::on_stop_requested(const std::string& reason) {
  if (final()) return;
  state_ = GroupState::kStopped;
  stop_reason_ = reason;
}

void WorkerGroup::on_spawn_failed(const std::string& reason) {
  if (final()) return;
  state_ = GroupState::kFailed;
  stop_reason_ = reason;
}

void WorkerGroup::on_abandoned(int64_t local_rank) { worker(local_rank).abandoned = true; }

void WorkerGroup::forgive_hang() {
  if (state_ != GroupState::kUnhealthy) return;
  state_ = GroupState::kHealthy;
  root_cause_.reset();
  for (auto& w : workers_) w.hung = false;
}

bool WorkerGroup::begin_replacement(int64_t local_rank) {
  WorkerRecord& w = worker(local_rank);
  if (w.state != WorkerState::kRunning || w.replacing) return false;
  if (state_ == GroupState::kUnhealthy && root_cause_ == local_rank) {
    state_ = GroupState::kHealthy;
    root_cause_.reset();
  }
  if (state_ != GroupState::kHealthy) return false;
  w.replacing = true;
  return true;
}

void WorkerGroup::restart_worker(int64_t local_rank) {
  WorkerRecord& w = worker(local_rank);
  DL_CHECK(w.replacing && w.state != WorkerState::kRunning)
      << "local_rank=" << local_rank << " restarted while not replaced";
  replaced_.push_back(w);
  WorkerRecord fresh;
  fresh.local_rank = w.local_rank;
  fresh.global_rank = w.global_rank;
  fresh.error_file = w.error_file;
  fresh.heartbeat_file = w.heartbeat_file;
  fresh.log_dir = w.log_dir;
  fresh.replacement = true;
  fresh.replacements = w.replacements + 1;
  w = std::move(fresh);
}

void WorkerGroup::replacement_failed(int64_t local_rank) {
  WorkerRecord& w = worker(local_rank);
  w.replacing = false;
  if (final()) return;
  state_ = GroupState::kFailed;
  root_cause_ = local_rank;
}

void WorkerGroup::renumber(int64_t first_rank) {
  for (auto& w : workers_) w.global_rank = first_rank + w.local_rank;
}

void WorkerGroup::add_stderr_line(int64_t local_rank, std::string line) {
  auto& tail = worker(local_rank).stderr_tail;
  tail.push_back(std::move(line));
  if (tail.size() > kTailLines) tail.pop_front();
}

bool WorkerGroup::all_exited() const {
  for (const auto& w : workers_) {
    if (w.running()) return false;
  }
  return true;
}

bool WorkerGroup::is_hung(TimePoint started, std::optional<TimePoint> last_beat, TimePoint now,
                          Duration timeout, bool from_start) {
  // Any beat counts (launcher/hang/heartbeat_file.h arms the file before the spawn); one stamped
  // before the start by the coarse file clock counts as made at the start.
  if (!last_beat && !from_start) return false;
  TimePoint last = started;
  if (last_beat && *last_beat > last) last = *last_beat;
  return now - last > timeout;
}

}  // namespace dlaunch
