#include "worker/ddp/grad_reducer.h"

#include "common/error.h"

namespace dlaunch::ddp {

GradReducer::GradReducer(comm::ProcessGroup& pg, float* grads,
                         const std::vector<model::ParamInfo>& params,
                         size_t bucket_bytes, GradStaging staging)
    : pg_(pg), grads_(grads), staging_(std::move(staging)) {
  const size_t cap = std::max<size_t>(1, bucket_bytes / sizeof(float));
  size_t begin = 0;
  for (const model::ParamInfo& p : params) {
    DL_CHECK(p.offset == total_) << "parameters must tile the flat buffer in order: " << p.name
                                 << " starts at " << p.offset << ", expected " << total_;
    total_ += p.count;
    if (total_ - begin >= cap) {
      buckets_.emplace_back(begin, total_);
      begin = total_;
    }
  }
  if (total_ > begin) buckets_.emplace_back(begin, total_);
  if (staging_.to_host && pg.size() > 1) host_.resize(total_);
}

void GradReducer::begin_step() {
  DL_CHECK(in_flight_.empty()) << "begin_step() before finish() of the previous step";
  next_bucket_ = 0;
  ready_end_ = 0;
}

void GradReducer::on_grad_ready(size_t offset, size_t count) {
  DL_CHECK(offset == ready_end_) << "gradients must become ready as a growing prefix: got offset "
                                 << offset << ", expected " << ready_end_;
  ready_end_ = offset + count;
  launch_ready(ready_end_);
}

void GradReducer::launch_ready(size_t ready_end) {
  if (pg_.size() == 1) {
    next_bucket_ = buckets_.size();
    return;
  }
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].second <= ready_end) {
    auto [b, e] = buckets_[next_bucket_++];
    float* data = grads_ + b;
    if (!host_.empty()) {
      staging_.to_host(host_.data() + b, grads_ + b, e - b);
      data = host_.data() + b;
    }
    in_flight_.push_back(pg_.allreduce_async(data, e - b, comm::ReduceOp::kAvg));
  }
}

void GradReducer::finish() {
  // A model that reports no callbacks (or skips some) still gets every bucket reduced, in the
  // same order on every rank.
  launch_ready(total_);
  std::vector<std::shared_ptr<comm::Work>> works;
  works.swap(in_flight_);
  for (auto& w : works) w->wait();
  if (!host_.empty()) staging_.from_host(grads_, host_.data(), total_);
}

void GradReducer::abandon_step() {
  in_flight_.clear();
  next_bucket_ = 0;
  ready_end_ = 0;
}

void broadcast_from_rank0(comm::ProcessGroup& pg, float* data, size_t count) {
  if (pg.size() > 1) pg.broadcast(data, count * sizeof(float), 0);
}

}  // namespace dlaunch::ddp
