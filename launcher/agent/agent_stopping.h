// Stopping the worker group: the first signal to every running worker's process group, SIGKILL
// after --shutdown_grace (or a second Ctrl-C), then the processes that did not die reported and
// abandoned. After a success, what the workers left running (an uploader, a daemon) is given
// --shutdown_grace to end, then SIGTERM, then SIGKILL, each step logged. When everything is
// down the agent decides (AgentCore::group_stopped). Loop thread only.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace dlaunch {

struct AgentCore;

class GroupStopper {
 public:
  explicit GroupStopper(AgentCore& agent);

  // Sends `first` to every running worker's group and arms the grace timer.
  void stop(int first);
  // The workers exited 0: their leftovers, if any, get the grace; else the group is down.
  void stop_leftovers();
  // The grace is over (or cut short by a second signal): SIGKILL now.
  void kill_now();
  // The group is down or the job ends: no timer fires any more.
  void cancel();
  // When the stop signal was sent.
  TimePoint stop_started() const { return stop_started_; }

 private:
  AgentCore& agent_;
  boost::asio::steady_timer grace_timer_;
  boost::asio::steady_timer kill_timer_;
  TimePoint stop_started_{};  // when the group (or what it left) was sent its stop signal
  // The workers exited 0 and what they left running is given --shutdown_grace.
  bool leftovers_pending_ = false;

  // Runs `then` after `after` unless the generation or the stopping phase has moved on.
  void after(boost::asio::steady_timer& timer, Duration delay, std::function<void()> then);
  void term_leftovers();
  std::function<void()> on_leftovers_gone();
  void kill_leftovers();
  void abandon_survivors();
};

}  // namespace dlaunch
