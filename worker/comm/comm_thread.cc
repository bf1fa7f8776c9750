#include "worker/comm/comm_thread.h"

namespace dlaunch::comm {
namespace {

class FutureWork : public Work {
 public:
  explicit FutureWork(std::future<void> f) : future_(std::move(f)) {}
  void wait() override {
    if (future_.valid()) future_.get();  // get() rethrows; a second wait() is a no-op
  }

 private:
  std::future<void> future_;
};

}  // namespace

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Work> CommThread::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  auto work = std::make_shared<FutureWork>(packaged.get_future());
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(packaged));
  }
  cv_.notify_one();
  return work;
}

void CommThread::run() {
  while (true) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // exceptions land in the future
  }
}

}  // namespace dlaunch::comm
