#include "worker/comm/reformable_process_group.h"

#include <fmt/format.h>

#include "common/error.h"

namespace dlaunch::comm {

ReformableProcessGroup::ReformableProcessGroup(std::unique_ptr<ProcessGroup> first)
    : inner_(std::move(first)),
      rank_(inner_->rank()),
      size_(inner_->size()),
      backend_(inner_->backend()) {}

void ReformableProcessGroup::drop() {
  if (!inner_) return;
  inner_->abandon();
  inner_.reset();
}

void ReformableProcessGroup::replace(std::unique_ptr<ProcessGroup> next) {
  if (next->rank() != rank_ || next->size() != size_) {
    throw InternalError(fmt::format(
        "re-formed process group has rank {} of {}; expected rank {} of {}", next->rank(),
        next->size(), rank_, size_));
  }
  drop();
  backend_ = next->backend();
  inner_ = std::move(next);
}

void ReformableProcessGroup::move_to(int rank, int size) {
  if (inner_ || rank < 0 || rank >= size) {
    throw InternalError(fmt::format("cannot move rank {} of {} to rank {} of {}{}", rank_, size_,
                                    rank, size, inner_ ? " while its group is held" : ""));
  }
  rank_ = rank;
  size_ = size;
}

ProcessGroup& ReformableProcessGroup::inner(const char* what) const {
  if (!inner_) {
    throw ConnectionError(fmt::format(
        "{} on rank {} of {}: the process group was dropped after a failure and is not "
        "re-formed yet",
        what, rank_, size_));
  }
  return *inner_;
}

void ReformableProcessGroup::allreduce(float* data, size_t count, ReduceOp op) {
  inner("allreduce").allreduce(data, count, op);
}
void ReformableProcessGroup::allreduce(double* data, size_t count, ReduceOp op) {
  inner("allreduce").allreduce(data, count, op);
}
void ReformableProcessGroup::broadcast(void* data, size_t bytes, int root) {
  inner("broadcast").broadcast(data, bytes, root);
}
std::vector<std::vector<uint8_t>> ReformableProcessGroup::allgather(
    const std::vector<uint8_t>& mine) {
  return inner("allgather").allgather(mine);
}
void ReformableProcessGroup::barrier() { inner("barrier").barrier(); }
std::shared_ptr<Work> ReformableProcessGroup::allreduce_async(float* data, size_t count,
                                                              ReduceOp op) {
  return inner("allreduce").allreduce_async(data, count, op);
}
bool ReformableProcessGroup::device_allreduce() const {
  return inner_ != nullptr && inner_->device_allreduce();
}
void ReformableProcessGroup::allreduce_device(double* data, size_t count, ReduceOp op) {
  inner("device allreduce").allreduce_device(data, count, op);
}
void ReformableProcessGroup::abandon() {
  if (inner_) inner_->abandon();
}

}  // namespace dlaunch::comm
