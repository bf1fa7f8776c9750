#include "worker/comm/nccl_stream_watchdog.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/error.h"
#include "common/log.h"

namespace dlaunch::comm {

// Often enough that a failure ends the worker within milliseconds of its detection; rarely
// enough to cost nothing (one cudaEventQuery per poll).
constexpr auto kPollInterval = std::chrono::milliseconds(2);

NcclStreamWatchdog::NcclStreamWatchdog(ncclComm_t comm, int device,
                                       std::chrono::milliseconds timeout, std::string who,
                                       std::string peer)
    : comm_(comm),
      device_(device),
      timeout_(timeout),
      who_(std::move(who)),
      peer_(std::move(peer)) {}

NcclStreamWatchdog::~NcclStreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const Pending& p : pending_) cudaEventDestroy(p.event);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

void NcclStreamWatchdog::watch(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  cudaEvent_t event{};
  if (!spare_.empty()) {
    event = spare_.back();
    spare_.pop_back();
  } else if (const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
             e != cudaSuccess) {
    throw InternalError(fmt::format("CUDA event create failed: {}", cudaGetErrorString(e)));
  }
  if (const cudaError_t e = cudaEventRecord(event, stream); e != cudaSuccess) {
    cudaEventDestroy(event);
    throw InternalError(fmt::format("CUDA event record failed: {}", cudaGetErrorString(e)));
  }
  pending_.push_back({event, Clock::now() + timeout_, what});
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  cv_.notify_all();
}

void NcclStreamWatchdog::run() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (pending_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      continue;
    }
    const Pending p = pending_.front();
    const cudaError_t q = cudaEventQuery(p.event);
    if (q == cudaSuccess) {
      pending_.pop_front();
      spare_.push_back(p.event);
      continue;
    }
    if (q != cudaErrorNotReady) {
      fail(fmt::format("CUDA error while waiting for NCCL {} on {}: {}", p.what, who_,
                       cudaGetErrorString(q)));
    }
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      const ncclResult_t bad = r != ncclSuccess ? r : async;
      fail(fmt::format("NCCL {} on {} failed: {} ({}); {} probably failed", p.what, who_,
                       ncclGetErrorString(bad), ncclGetLastError(comm_), peer_));
    }
    if (Clock::now() >= p.deadline) {
      fail(
          fmt::format("NCCL {} on {} did not complete within the collective timeout ({} ms, "
                      "--collective_timeout): {} is stuck or gone",
                      p.what, who_, timeout_.count(), peer_));
    }
    cv_.wait_for(lock, kPollInterval, [&] { return stop_; });
  }
}

void NcclStreamWatchdog::fail(const std::string& why) const {
  log_error("{}; this worker exits so the launcher restarts the group", why);
  std::_Exit(1);  // the training thread may be blocked inside CUDA: no unwinding, no destructors
}

}  // namespace dlaunch::comm
