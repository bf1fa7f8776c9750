#include "worker/comm/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <string>

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace dlaunch::comm {
namespace {

using Counter = std::atomic<uint32_t>;
static_assert(Counter::is_always_lock_free, "futex needs a lock-free 32-bit atomic");
static_assert(sizeof(Counter) == sizeof(uint32_t), "futex works on a plain 32-bit word");

// Starts just below the 2^32 wrap so every run of more than a few hundred calls crosses it.
constexpr uint32_t kCounterStart = 0u - 1024u;
constexpr size_t kHeaderBytes = 64;  // one cache line, keeps the slots aligned
// Spin this long before sleeping: a peer a few microseconds behind costs no syscall, and on an
// oversubscribed host the sleeping waiter gives its core to the peer it waits for.
constexpr auto kSpin = std::chrono::microseconds(20);
// A sleeping waiter wakes this often to see whether a peer's process died: the time a survivor
// of a SIGKILLed peer takes to notice (rank-level recovery re-forms the group after it).
constexpr auto kSleepSlice = std::chrono::milliseconds(10);
constexpr size_t kNameBytes = 64;

struct Header {
  Counter arrived[2];
  uint64_t nonce;  // proves that every rank mapped rank 0's segment, not a namesake
  // The first rank that abandoned the group, plus one (0: none has). Its pid lives on (it
  // re-forms the group), so the pid check cannot tell the others.
  Counter left;
};
static_assert(sizeof(Header) <= kHeaderBytes, "header must fit its cache line");

Header* header_of(void* base) { return static_cast<Header*>(base); }

uint32_t* futex_word(Counter& c) { return reinterpret_cast<uint32_t*>(&c); }

void futex_wake_all(Counter& c) {
  syscall(SYS_futex, futex_word(c), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while the counter still reads `seen`, at most `slice`; spurious returns are fine.
void futex_wait(Counter& c, uint32_t seen, std::chrono::nanoseconds slice) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(slice.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(slice.count() % 1000000000);
  syscall(SYS_futex, futex_word(c), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;  // wrap-safe: counters only grow
}

// Ranks can share a segment only if they share /dev/shm: same host, same boot.
std::string host_key() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(host) + "/" + boot_id;
}

size_t segment_bytes(int size) { return kHeaderBytes + 2 * static_cast<size_t>(size) * ShmAllreduce::kSlotBytes; }

// Rank 0: creates and maps the segment; on failure logs why, leaves nothing behind and returns
// MAP_FAILED.
void* create_segment(const std::string& name, size_t bytes, uint64_t nonce) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    log_warning("shared-memory allreduce off: shm_open({}) failed: {}; using gloo", name,
                std::strerror(errno));
    return MAP_FAILED;
  }
  // Reserve the pages now: a /dev/shm too small for them must fail here, not SIGBUS later.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = MAP_FAILED;
  if (err != 0) {
    log_warning("shared-memory allreduce off: reserving {} bytes in /dev/shm failed: {}; using gloo",
                bytes, std::strerror(err));
  } else {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      log_warning("shared-memory allreduce off: mmap failed: {}; using gloo", std::strerror(errno));
    }
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return MAP_FAILED;
  }
  auto* h = new (base) Header;
  h->arrived[0].store(kCounterStart, std::memory_order_relaxed);
  h->arrived[1].store(kCounterStart, std::memory_order_relaxed);
  h->nonce = nonce;
  h->left.store(0, std::memory_order_relaxed);
  return base;
}

// Other ranks: maps rank 0's segment and checks it is the one rank 0 made.
void* open_segment(const std::string& name, size_t bytes, uint64_t nonce) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    log_warning("shared-memory allreduce off: shm_open({}) failed: {} (separate /dev/shm?); using gloo",
                name, std::strerror(errno));
    return MAP_FAILED;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) {
    log_warning("shared-memory allreduce off: mapping {} ({} bytes expected) failed; using gloo", name, bytes);
    return MAP_FAILED;
  }
  if (header_of(base)->nonce != nonce) {
    log_warning("shared-memory allreduce off: {} is not rank 0's segment; using gloo", name);
    munmap(base, bytes);
    return MAP_FAILED;
  }
  return base;
}

// "pid:[inode]", or empty when unreadable.
std::string pid_namespace() {
  char buf[128] = {};
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Whether process `pid` still runs (a zombie does not: it died and awaits its parent's wait).
bool process_alive(int pid) {
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  auto close_paren = line.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= line.size() ||
         line[close_paren + 2] != 'Z';
}

}  // namespace

std::unique_ptr<ShmAllreduce> ShmAllreduce::create(ProcessGroup& bootstrap,
                                                   std::chrono::milliseconds timeout) {
  const int rank = bootstrap.rank();
  const int size = bootstrap.size();
  if (size < 2) return nullptr;

  // 1. Agree on eligibility: every rank enabled and on the same host and boot.
  const bool enabled = get_env_bool("DLAUNCH_SHM_ALLREDUCE").value_or(true);
  std::string mine = std::string(enabled ? "1" : "0") + host_key();
  auto all = bootstrap.allgather(std::vector<uint8_t>(mine.begin(), mine.end()));
  bool any_disabled = false;
  bool same_host = true;
  for (const auto& other : all) {
    std::string s(other.begin(), other.end());
    if (s.empty() || s[0] != '1') any_disabled = true;
    if (s.size() != mine.size() || s.compare(1, std::string::npos, mine, 1, std::string::npos) != 0) {
      same_host = false;
    }
  }
  if (any_disabled || !same_host) {
    if (rank == 0) {
      log_info("shared-memory allreduce off ({}); small allreduces use gloo",
               any_disabled ? "DLAUNCH_SHM_ALLREDUCE=0 on some rank" : "ranks span hosts");
    }
    return nullptr;
  }

  // 2. Rank 0 creates the segment and sends its name (empty on failure) and nonce.
  const size_t bytes = segment_bytes(size);
  std::random_device rd;
  uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char msg[kNameBytes + sizeof(uint64_t)] = {};
  void* base = MAP_FAILED;
  if (rank == 0) {
    std::string name = fmt::format("/dlaunch-shm-{}-{:016x}", getpid(), nonce);
    base = create_segment(name, bytes, nonce);
    if (base != MAP_FAILED) {
      std::memcpy(msg, name.data(), std::min(name.size(), kNameBytes - 1));
      std::memcpy(msg + kNameBytes, &nonce, sizeof(nonce));
    }
  }
  bootstrap.broadcast(msg, sizeof(msg), 0);
  const std::string name(msg, strnlen(msg, kNameBytes));
  std::memcpy(&nonce, msg + kNameBytes, sizeof(nonce));
  if (rank != 0 && !name.empty()) base = open_segment(name, bytes, nonce);

  // 3. Everyone confirms (with its pid); then the name goes away, the mappings stay.
  const int32_t my_pid = getpid();
  const std::string my_pid_ns = pid_namespace();
  std::vector<uint8_t> ok(1 + sizeof(my_pid) + my_pid_ns.size());
  ok[0] = static_cast<uint8_t>(base != MAP_FAILED);
  std::memcpy(ok.data() + 1, &my_pid, sizeof(my_pid));
  std::copy(my_pid_ns.begin(), my_pid_ns.end(), ok.begin() + 1 + sizeof(my_pid));
  auto oks = bootstrap.allgather(ok);
  if (rank == 0 && !name.empty()) shm_unlink(name.c_str());
  bool all_ok = std::all_of(oks.begin(), oks.end(), [&](const std::vector<uint8_t>& v) {
    return v.size() >= 1 + sizeof(my_pid) && v[0] == 1;
  });
  if (!all_ok) {
    if (base != MAP_FAILED) munmap(base, bytes);
    if (rank == 0) log_info("shared-memory allreduce off: not every rank could map the segment");
    return nullptr;
  }
  if (rank == 0) {
    log_debug("shared-memory allreduce on: {} ranks, {} bytes per rank", size, kSlotBytes);
  }
  // Peers' pids, to tell a dead peer from a slow one while waiting. Only if every rank is in
  // our pid namespace (elsewhere a live peer's pid means nothing here): else only the timeout.
  auto shm = std::unique_ptr<ShmAllreduce>(new ShmAllreduce(base, bytes, rank, size, timeout));
  bool same_pid_ns = !my_pid_ns.empty();
  for (const auto& v : oks) {
    int32_t pid = 0;
    std::memcpy(&pid, v.data() + 1, sizeof(pid));
    if (std::string(v.begin() + 1 + sizeof(pid), v.end()) != my_pid_ns) same_pid_ns = false;
    if (pid == my_pid) continue;  // ranks as threads of one process (tests)
    shm->peer_pids_.push_back(pid);
  }
  if (!same_pid_ns) shm->peer_pids_.clear();
  return shm;
}

ShmAllreduce::ShmAllreduce(void* base, size_t bytes, int rank, int size,
                           std::chrono::milliseconds timeout)
    : base_(base), bytes_(bytes), rank_(rank), size_(size), timeout_(timeout) {
  target_[0] = kCounterStart + static_cast<uint32_t>(size);
  target_[1] = kCounterStart + static_cast<uint32_t>(size);
}

ShmAllreduce::~ShmAllreduce() { munmap(base_, bytes_); }

void ShmAllreduce::allreduce(float* data, size_t count, ReduceOp op) { run(data, count, op); }
void ShmAllreduce::allreduce(double* data, size_t count, ReduceOp op) { run(data, count, op); }

void ShmAllreduce::abandon() {
  Header* h = header_of(base_);
  uint32_t none = 0;
  h->left.compare_exchange_strong(none, static_cast<uint32_t>(rank_) + 1, std::memory_order_acq_rel);
  futex_wake_all(h->arrived[0]);
  futex_wake_all(h->arrived[1]);
}

void ShmAllreduce::wait_for(unsigned buffer, uint32_t target) {
  Counter& c = header_of(base_)->arrived[buffer];
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 0;; ++i) {
    if (reached(c.load(std::memory_order_acquire), target)) return;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > kSpin) break;
  }
  const auto deadline = start + timeout_;
  auto last_check = start;
  for (;;) {
    uint32_t seen = c.load(std::memory_order_acquire);
    if (reached(seen, target)) return;
    // After the counter: a call every rank arrived at completes even if a rank left after it.
    if (const uint32_t left = header_of(base_)->left.load(std::memory_order_acquire); left != 0) {
      throw ConnectionError(fmt::format(
          "shared-memory allreduce (call {}, rank {} of {}): rank {} left the group after a "
          "failure while {} of {} ranks had arrived (the group is unusable)",
          calls_, rank_, size_, left - 1,
          static_cast<int64_t>(size_) - static_cast<int32_t>(target - seen), size_));
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw TimeoutError(fmt::format(
          "shared-memory allreduce (call {}) on rank {} of {} did not complete within the "
          "collective timeout ({} ms, --collective_timeout): {} of {} ranks arrived; {} is stuck "
          "or gone (the group is unusable: this worker exits so the launcher restarts the group)",
          calls_, rank_, size_, timeout_.count(),
          static_cast<int64_t>(size_) - static_cast<int32_t>(target - seen), size_,
          size_ == 2 ? fmt::format("rank {}", 1 - rank_) : std::string("a peer rank")));
    }
    if (now - last_check >= kSleepSlice) {
      last_check = now;
      for (int pid : peer_pids_) {
        if (!process_alive(pid)) {
          throw ConnectionError(fmt::format(
              "shared-memory allreduce (call {}, rank {} of {}): peer process {} exited while {} of "
              "{} ranks had arrived (the group is unusable; restart the job)",
              calls_, rank_, size_, pid,
              static_cast<int64_t>(size_) - static_cast<int32_t>(target - seen), size_));
        }
      }
    }
    futex_wait(c, seen, std::min<std::chrono::nanoseconds>(deadline - now, kSleepSlice));
  }
}

template <typename T>
void ShmAllreduce::run(T* data, size_t count, ReduceOp op) {
  if (count == 0) return;
  DL_CHECK(fits(count, sizeof(T))) << "count=" << count << " elem=" << sizeof(T);
  const unsigned b = static_cast<unsigned>(calls_ & 1);
  ++calls_;
  auto slot = [&](int r) {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + kHeaderBytes +
                                (static_cast<size_t>(b) * size_ + r) * kSlotBytes);
  };
  std::memcpy(slot(rank_), data, count * sizeof(T));
  const uint32_t target = target_[b];
  target_[b] += static_cast<uint32_t>(size_);
  Counter& c = header_of(base_)->arrived[b];
  // Release publishes our slot; acquire (on the last arrival) sees everyone's.
  const uint32_t now = c.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now == target) {
    futex_wake_all(c);
  } else {
    wait_for(b, target);
  }
  // Rank order on every rank: bit-identical results everywhere.
  std::memcpy(data, slot(0), count * sizeof(T));
  for (int r = 1; r < size_; ++r) {
    const T* s = slot(r);
    if (op == ReduceOp::kMax) {
      for (size_t i = 0; i < count; ++i) data[i] = std::max(data[i], s[i]);
    } else {
      for (size_t i = 0; i < count; ++i) data[i] += s[i];
    }
  }
  if (op == ReduceOp::kAvg) {
    const T inv = T(1) / static_cast<T>(size_);
    for (size_t i = 0; i < count; ++i) data[i] *= inv;
  }
}

}  // namespace dlaunch::comm
