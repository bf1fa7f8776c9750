// The job's flash directory: memory-backed storage the agent owns for the whole job, given to
// every worker as DLAUNCH_FLASH_DIR. Workers keep their latest training state there (dtrain's
// --flash_every); since the directory outlives any one worker, a restarted worker resumes from
// the step its predecessor died at instead of the last disk checkpoint.
//
// Lifetime: created before the first worker starts, kept across worker restarts and new
// rendezvous rounds, removed when the agent ends (the destructor), and by the orphan guard when
// the agent is killed without cleaning up (main.cc hands the path to the guard), and by the next
// dlaunch on the host when the agent and the guard die together (flash_sweep.h).
//
// Where and how big: a fresh <base>/dlaunch_flash_<run id>_<random> (base /dev/shm). Where the
// agent may mount (CAP_SYS_ADMIN, e.g. root), it mounts a tmpfs of its own there with
// size=<limit>: the kernel then fails a write beyond the limit with ENOSPC in the worker and the
// host's /dev/shm is untouched. Where it may not, the directory is a plain subdirectory of
// /dev/shm and the limit is NOT enforced (a subdirectory of a tmpfs cannot be size-limited by
// itself): writes then fail only when /dev/shm as a whole is full. enforced() says which, and the
// agent logs it.
//
// Threading: one owner. Blocks on the file system only. create() throws SystemError when the
// directory cannot be made; remove() never throws (failures are logged).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dlaunch {

// Where flash directories are made: the memory file system every Linux host mounts.
inline constexpr const char kFlashBase[] = "/dev/shm";

class FlashDir {
 public:
  // `limit_bytes` > 0. `run_id` goes into the name (characters other than [A-Za-z0-9._-] are
  // replaced by '_'). With `guard_pid` > 0 the directory gets an owner record naming this
  // process and its orphan guard (flash_sweep.h), so a later dlaunch can sweep it if both die.
  static FlashDir create(const std::string& base, const std::string& run_id, int64_t limit_bytes,
                         pid_t guard_pid = 0);

  FlashDir() = default;
  ~FlashDir();  // remove()
  FlashDir(FlashDir&& other) noexcept;
  FlashDir& operator=(FlashDir&& other) noexcept;
  FlashDir(const FlashDir&) = delete;
  FlashDir& operator=(const FlashDir&) = delete;

  const std::string& path() const { return path_; }  // empty: none
  bool enforced() const { return mounted_; }          // a tmpfs with size=limit of its own
  int64_t limit_bytes() const { return limit_; }
  // Unmounts (lazily: a worker still holding a file open does not block it) and deletes the
  // directory with its contents. Idempotent.
  void remove();

 private:
  std::string path_;
  bool mounted_ = false;
  int64_t limit_ = 0;
};

// --flash_limit: "0" (no flash directory), a byte count with an optional K/M/G/T suffix (powers
// of 1024; "512M"), or a percentage of `ram_bytes` ("25%"). Throws UsageError naming `what` (the
// flag as the user spelled it) and what is allowed.
int64_t parse_flash_limit(const std::string& text, const std::string& what, int64_t ram_bytes);

// Physical memory of this host in bytes (sysconf), for the percentage form.
int64_t host_ram_bytes();

}  // namespace dlaunch
