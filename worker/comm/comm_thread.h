// One background thread that runs submitted collectives in FIFO order. FIFO matters: every rank
// submits the same sequence, and the thread runs it in that order, so the ranks' collectives
// pair up without tags.
//
// submit() never blocks; Work::wait() blocks until that task ran and rethrows its exception.
// The destructor finishes the queued tasks, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "worker/comm/process_group.h"

namespace dlaunch::comm {

class CommThread {
 public:
  CommThread();
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  std::shared_ptr<Work> submit(std::function<void()> task);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dlaunch::comm
