// Shows a worker's unterminated console line (a prompt, a progress bar) once it has waited
// kPartialLineDelay (log_router.h). One timer serves every worker, armed only while a tail
// waits. Loop thread only.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <set>

#include "common/clock.h"
#include "launcher/output/log_router.h"

namespace dlaunch {

class PartialLineTimer {
 public:
  PartialLineTimer(boost::asio::io_context& io, const Clock& clock) : timer_(io), clock_(clock) {}

  // `out` has a line due at out->next_due(): flush it then (the output may go away first).
  void watch(const std::shared_ptr<WorkerOutput>& out);

 private:
  boost::asio::steady_timer timer_;
  const Clock& clock_;
  bool armed_ = false;
  std::set<std::weak_ptr<WorkerOutput>, std::owner_less<std::weak_ptr<WorkerOutput>>> waiting_;

  void arm();
};

}  // namespace dlaunch
