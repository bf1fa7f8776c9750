#include "common/error.h"
#include "worker/comm/process_group.h"

namespace dlaunch::comm {
namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
};

class LocalProcessGroup : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void allreduce(float*, size_t, ReduceOp) override {}
  void allreduce(double*, size_t, ReduceOp) override {}
  void broadcast(void*, size_t, int root) override {
    DL_CHECK(root == 0) << "root=" << root << " in a world of one";
  }
  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override {
    return {mine};
  }
  void barrier() override {}
  std::shared_ptr<Work> allreduce_async(float*, size_t, ReduceOp) override {
    return std::make_shared<DoneWork>();
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> make_local_process_group() {
  return std::make_unique<LocalProcessGroup>();
}

}  // namespace dlaunch::comm
