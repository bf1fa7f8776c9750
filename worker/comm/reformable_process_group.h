// A process group whose connections can be replaced while the objects that use it keep their
// reference: rank-level recovery drops a group broken by a peer's death and re-forms it with
// that rank's replacement (worker/train/rank_recovery.h). DataParallel, GradReducer, SyncBN, the
// checkpointer and the trainer all hold a ProcessGroup&; they hold this one, which delegates
// every call to the current inner group, so nothing has to be rebound.
//
//   replace(first) -> collectives ... failure -> drop() -> replace(next) -> collectives ...
//
// rank() and size() change only through move_to(): a replacement takes the same rank in a world
// of the same size, and only a shrink (a node lost, the survivors re-form smaller) moves this
// worker to another rank of a smaller world. backend() is the inner group's. Between drop() and
// replace() every collective throws ConnectionError. Same threading as ProcessGroup: the training
// thread's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/process_group.h"

namespace dlaunch::comm {

class ReformableProcessGroup : public ProcessGroup {
 public:
  explicit ReformableProcessGroup(std::unique_ptr<ProcessGroup> first);

  // The group failed: abandon it (ProcessGroup::abandon) and destroy it. The destruction waits
  // for the async allreduce running on its communication thread, if any, which ends when the
  // peers abandon theirs (or at the collective timeout). Never throws.
  void drop();
  // Takes `next` (same rank and size, else InternalError) after drop().
  void replace(std::unique_ptr<ProcessGroup> next);
  // After drop(): the groups from now on have rank `rank` of `size` (a shrink). InternalError
  // while a group is held or for a rank outside [0, size).
  void move_to(int rank, int size);
  bool dropped() const { return inner_ == nullptr; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return backend_; }
  void allreduce(float* data, size_t count, ReduceOp op) override;
  void allreduce(double* data, size_t count, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override;
  void barrier() override;
  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override;
  bool device_allreduce() const override;
  void allreduce_device(double* data, size_t count, ReduceOp op) override;
  void abandon() override;

 private:
  ProcessGroup& inner(const char* what) const;

  std::unique_ptr<ProcessGroup> inner_;
  int rank_;
  int size_;
  std::string backend_;
};

}  // namespace dlaunch::comm
