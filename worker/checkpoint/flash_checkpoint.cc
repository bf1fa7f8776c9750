#include "worker/checkpoint/flash_checkpoint.h"

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "worker/checkpoint/checkpoint.h"

namespace dlaunch::ckpt {
namespace fs = std::filesystem;

FlashWriter::FlashWriter(const std::string& flash_dir, const std::string& persist_to) {
  if (flash_dir.empty()) return;
  std::string dir = (fs::path(flash_dir) / "dtrain").string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw SystemError(fmt::format("cannot create {} in the flash directory (DLAUNCH_FLASH_DIR): {}",
                                  dir, ec.message()));
  }
  if (!persist_to.empty()) {
    // The agent's file name (launcher/flash/flash_persist.h: kPersistRequestFile); a worker cannot
    // include the launcher, the contract is the file.
    std::ofstream(fs::path(dir) / ".persist_to") << persist_to << "\n";
  }
  dir_ = std::move(dir);
}

std::string FlashWriter::write(const std::string& name, const std::vector<uint8_t>& bytes) {
  DL_CHECK(enabled());
  std::string path = (fs::path(dir_) / name).string();
  write_checkpoint_bytes(path, bytes, Durability::kMemory);
  if (!last_.empty() && last_ != path) {
    std::error_code ec;
    fs::remove(last_, ec);  // a leftover costs memory, not correctness: resuming takes the newest
  }
  last_ = path;
  return path;
}

BackgroundPersister::~BackgroundPersister() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (failure_) {
    try {
      std::rethrow_exception(failure_);
    } catch (const std::exception& e) {
      log_error("a checkpoint was not written to disk: {}", e.what());
    }
  }
}

void BackgroundPersister::rethrow_failure() {
  if (failure_) {
    std::exception_ptr f = std::exchange(failure_, nullptr);
    std::rethrow_exception(f);
  }
}

void BackgroundPersister::submit(Bytes bytes, std::string path, std::function<void()> after) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    rethrow_failure();
    queue_.push_back(Job{std::move(bytes), std::move(path), std::move(after)});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
}

void BackgroundPersister::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  rethrow_failure();
}

void BackgroundPersister::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything is written
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      write_checkpoint_bytes(job.path, *job.bytes, Durability::kFsync);
      log_debug("wrote {} (in the background)", job.path);
      if (job.after) job.after();
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (failed && !failure_) failure_ = failed;
    cv_.notify_all();
  }
}

std::optional<LoadedCheckpoint> newest_with_flash(std::optional<LoadedCheckpoint> disk,
                                                  const std::string& flash_dir) {
  if (flash_dir.empty()) return disk;
  std::optional<LoadedCheckpoint> flash = load_latest_valid(flash_dir);
  if (!flash) return disk;
  auto steps = [](const LoadedCheckpoint& c) { return c.ckpt.meta.value("step", int64_t{-1}); };
  if (disk) {
    const std::string disk_run = disk->ckpt.meta.value("run_id", std::string());
    const std::string flash_run = flash->ckpt.meta.value("run_id", std::string());
    if (flash_run != disk_run) {
      log_warning("ignoring the flash copy {}: it is of run {}, the checkpoints in --output_dir "
                  "of run {}",
                  flash->path, flash_run, disk_run);
      return disk;
    }
    if (steps(*flash) <= steps(*disk)) return disk;
  }
  log_info("the flash copy {} ({} steps) is the newest state{}", flash->path, steps(*flash),
           disk ? " (newer than " + disk->path + ")" : std::string());
  return flash;
}

}  // namespace dlaunch::ckpt
