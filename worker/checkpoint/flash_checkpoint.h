// Flash checkpoints: dtrain's latest training state kept in the job's flash directory
// (DLAUNCH_FLASH_DIR, a memory file system the dlaunch agent keeps across worker restarts), and
// disk persistence moved off the training thread.
//
// FlashWriter keeps one file, <flash dir>/dtrain/<checkpoint name>, replaced atomically (temporary
// file, rename; no fsync: it is memory) by each write; a reader sees the previous state or the
// new one, never a torn file, and the checkpoint format's CRCs catch anything else. The files
// carry the same names and format as disk checkpoints (checkpoint.h), so the newest valid state
// among the flash copy and --output_dir is picked by the same code.
//
// BackgroundPersister writes encoded checkpoints to disk (fsync, rename, fsync of the directory:
// write_checkpoint's durability) on a thread of its own, in submission order, and runs a
// follow-up (pruning) after each. The training thread hands it the bytes it already encoded for
// the flash copy and goes on.
//
// Threading: FlashWriter has one owner (the training thread). BackgroundPersister's submit() and
// wait() are for one owner thread; its work runs on its own thread. Errors: FlashWriter::write
// throws SystemError (ENOSPC beyond --flash_limit); a failed disk write is rethrown (SystemError)
// by the next submit() or wait(), never lost.
//
// newest_with_flash() picks what a restarted dtrain continues from: the flash copy wins only when
// it is newer (more optimizer steps) and, when a disk checkpoint was chosen, belongs to the same
// run (meta "run_id"); a torn or corrupt flash copy is skipped with a warning naming it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "worker/checkpoint/checkpoint.h"

namespace dlaunch::ckpt {

using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

class FlashWriter {
 public:
  // `flash_dir` empty: disabled (enabled() is false, write() must not be called). Creates
  // <flash_dir>/dtrain; throws SystemError when it cannot. With `persist_to` (an absolute
  // directory: the run's --output_dir), asks the agent to write the copies there if the job
  // ends without success (<flash_dir>/dtrain/.persist_to, launcher/flash/flash_persist.h), so the
  // state of a stop cut short or a failure is on disk for the next run's resume.
  explicit FlashWriter(const std::string& flash_dir, const std::string& persist_to = "");

  bool enabled() const { return !dir_.empty(); }
  // <flash_dir>/dtrain: where the copies are (and where resuming looks).
  const std::string& dir() const { return dir_; }
  // Writes `bytes` as <dir>/<name> and then removes the file the previous write left (when its
  // name differs). Returns the path written. Blocks on a memory copy.
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes);

 private:
  std::string dir_;
  std::string last_;  // the file of the previous write
};

class BackgroundPersister {
 public:
  BackgroundPersister() = default;
  ~BackgroundPersister();  // finishes what was submitted (errors logged), then joins
  BackgroundPersister(const BackgroundPersister&) = delete;
  BackgroundPersister& operator=(const BackgroundPersister&) = delete;

  // Queues `bytes` for `path`; `after` runs on the persister's thread once the file is on disk
  // (not after a failure). Starts the thread on first use. Rethrows an earlier failure.
  void submit(Bytes bytes, std::string path, std::function<void()> after = {});
  // Blocks until everything submitted is on disk; rethrows the first failure.
  void wait();

 private:
  struct Job {
    Bytes bytes;
    std::string path;
    std::function<void()> after;
  };
  void loop();
  void rethrow_failure();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::thread thread_;
};

// `flash_dir`: a FlashWriter's dir(); empty: none. Blocks on reading it; throws CheckpointError
// only when it exists but cannot be read.
std::optional<LoadedCheckpoint> newest_with_flash(std::optional<LoadedCheckpoint> disk,
                                                  const std::string& flash_dir);

}  // namespace dlaunch::ckpt
