// The shared-memory allreduce inside the gloo process group: ranks as threads (HashStore) and as
// forked processes (FileStore), compared bit for bit with the gloo path.
#include <gtest/gtest.h>
#include <gloo/rendezvous/file_store.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "common/error.h"
#include "tests/worker/gloo_ranks.h"
#include "worker/comm/process_group_gloo.h"
#include "worker/comm/shm_allreduce.h"

namespace dlaunch::comm {
namespace {

constexpr size_t kCapDoubles = ShmAllreduce::kSlotBytes / sizeof(double);
constexpr size_t kCapFloats = ShmAllreduce::kSlotBytes / sizeof(float);

// Sets DLAUNCH_SHM_ALLREDUCE for a scope (tests run their ranks as threads of this process).
class ScopedShmEnv {
 public:
  explicit ScopedShmEnv(const char* value) {
    if (value) {
      setenv("DLAUNCH_SHM_ALLREDUCE", value, 1);
    } else {
      unsetenv("DLAUNCH_SHM_ALLREDUCE");
    }
  }
  ~ScopedShmEnv() { unsetenv("DLAUNCH_SHM_ALLREDUCE"); }
};

using test::run_gloo_ranks;

template <typename T>
std::vector<T> rank_data(int rank, size_t count, uint32_t salt) {
  std::mt19937_64 gen(rank * 7919 + salt);
  std::uniform_real_distribution<double> dist(-1000.0, 1000.0);
  std::vector<T> v(count);
  for (auto& x : v) x = static_cast<T>(dist(gen));  // not integers: the sum order shows
  return v;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

// Every rank's result for each (op, size) case, flattened in a fixed order.
struct Results {
  std::vector<std::vector<std::vector<double>>> doubles;  // [rank][case]
  std::vector<std::vector<std::vector<float>>> floats;
};

Results run_cases(int world, const std::vector<size_t>& sizes, bool expect_shm) {
  Results res;
  res.doubles.resize(world);
  res.floats.resize(world);
  run_gloo_ranks(world, [&](ProcessGroup& pg) {
    EXPECT_EQ(gloo_uses_shared_memory(pg), expect_shm);
    uint32_t salt = 0;
    for (ReduceOp op : kOps) {
      for (size_t n : sizes) {
        auto d = rank_data<double>(pg.rank(), n, ++salt);
        pg.allreduce(d.data(), d.size(), op);
        res.doubles[pg.rank()].push_back(d);
        auto f = rank_data<float>(pg.rank(), n * 2, ++salt);
        pg.allreduce(f.data(), f.size(), op);
        res.floats[pg.rank()].push_back(f);
      }
    }
  });
  return res;
}

TEST(ShmAllreduce, TwoRanksBitwiseEqualToGloo) {
  // 1 element up to the cap (floats: twice as many, up to the cap too), and one over it (gloo).
  const std::vector<size_t> sizes = {1, 7, 1000, kCapDoubles / 2, kCapDoubles, kCapDoubles + 1};
  Results shm, gloo;
  {
    ScopedShmEnv env(nullptr);
    shm = run_cases(2, sizes, true);
  }
  {
    ScopedShmEnv env("0");
    gloo = run_cases(2, sizes, false);
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(shm.doubles[r].size(), gloo.doubles[r].size());
    for (size_t c = 0; c < shm.doubles[r].size(); ++c) {
      EXPECT_TRUE(bitwise_equal(shm.doubles[r][c], gloo.doubles[r][c])) << "rank " << r << " case " << c;
      EXPECT_TRUE(bitwise_equal(shm.floats[r][c], gloo.floats[r][c])) << "rank " << r << " case " << c;
      EXPECT_TRUE(bitwise_equal(shm.doubles[r][c], shm.doubles[0][c]));
      EXPECT_TRUE(bitwise_equal(shm.floats[r][c], shm.floats[0][c]));
    }
  }
}

// With 3+ ranks gloo's ring sums in a chunk-dependent order; ours is rank order on every rank.
TEST(ShmAllreduce, ThreeAndFourRanksSumInRankOrderOnEveryRank) {
  ScopedShmEnv env(nullptr);
  for (int world : {3, 4}) {
    run_gloo_ranks(world, [&](ProcessGroup& pg) {
      ASSERT_TRUE(gloo_uses_shared_memory(pg));
      uint32_t salt = 100;
      for (ReduceOp op : kOps) {
        for (size_t n : {size_t{1}, size_t{33}, kCapDoubles}) {
          ++salt;
          auto d = rank_data<double>(pg.rank(), n, salt);
          pg.allreduce(d.data(), d.size(), op);
          std::vector<double> want = rank_data<double>(0, n, salt);
          for (int r = 1; r < world; ++r) {
            auto other = rank_data<double>(r, n, salt);
            for (size_t i = 0; i < n; ++i) {
              want[i] = op == ReduceOp::kMax ? std::max(want[i], other[i]) : want[i] + other[i];
            }
          }
          if (op == ReduceOp::kAvg) {
            for (auto& x : want) x *= 1.0 / world;
          }
          ASSERT_TRUE(bitwise_equal(d, want)) << "world " << world << " n " << n;
        }
      }
      // Floats over the cap take gloo, interleaved with shared-memory calls.
      std::vector<float> big(kCapFloats + 1, 1.0f + pg.rank());
      pg.allreduce(big.data(), big.size(), ReduceOp::kSum);
      const float want_big = world * (world + 1) / 2.0f;
      for (float x : big) ASSERT_EQ(x, want_big);
    });
  }
}

// Thousands of calls: both buffers are reused many times and the counters wrap 2^32.
TEST(ShmAllreduce, ManyConsecutiveCallsCrossTheCounterWrap) {
  ScopedShmEnv env(nullptr);
  run_gloo_ranks(2, [](ProcessGroup& pg) {
    ASSERT_TRUE(gloo_uses_shared_memory(pg));
    for (int i = 0; i < 3000; ++i) {
      std::vector<double> v = {static_cast<double>(i) * (pg.rank() + 1), 1.0, -0.5 * pg.rank()};
      pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
      ASSERT_EQ(v, (std::vector<double>{3.0 * i, 2.0, -0.5})) << "call " << i;
      if (i % 700 == 0) {  // a gloo collective in between must not disturb the sequence
        pg.barrier();
        std::vector<float> big(kCapFloats + 1, static_cast<float>(pg.rank()));
        pg.allreduce(big.data(), big.size(), ReduceOp::kMax);
        ASSERT_EQ(big.front(), 1.0f);
      }
    }
  });
}

// A rank that abandons the group after a failure of its own lives on (it re-forms the group), so
// its pid says nothing: its abandon() ends the others' waits at once with ConnectionError naming
// it, long before the collective timeout (60 s here). A call every rank had arrived at still
// completes.
TEST(ShmAllreduce, ARankThatAbandonsTheGroupEndsThePeersWaitsAtOnce) {
  ScopedShmEnv env(nullptr);
  std::atomic<bool> waiting{false};
  std::exception_ptr error;
  double waited_s = 0;
  run_gloo_ranks(
      3,
      [&](ProcessGroup& pg) {
        ASSERT_TRUE(gloo_uses_shared_memory(pg));
        std::vector<double> v(4, 1.0);
        pg.allreduce(v.data(), v.size(), ReduceOp::kSum);  // every rank arrives
        EXPECT_EQ(v[0], 3.0);
        if (pg.rank() == 2) {
          while (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          pg.abandon();
          return;
        }
        if (pg.rank() == 1) {
          waiting = true;
          try {
            pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
          } catch (const ConnectionError&) {
          }
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        try {
          pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
        } catch (...) {
          error = std::current_exception();
        }
        waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      std::chrono::milliseconds(60000));
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 left the group after a failure"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(waited_s, 30.0) << "the wait should end at the abandonment, not the timeout";
}

TEST(ShmAllreduce, PeerThatNeverCallsTimesOut) {
  ScopedShmEnv env(nullptr);
  std::atomic<bool> done{false};
  std::exception_ptr error;
  double waited_s = 0;
  run_gloo_ranks(
      2,
      [&](ProcessGroup& pg) {
        ASSERT_TRUE(gloo_uses_shared_memory(pg));
        if (pg.rank() == 1) {  // alive but never calls
          while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        auto start = std::chrono::steady_clock::now();
        std::vector<double> v(5, 1.0);
        try {
          pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
        } catch (...) {
          error = std::current_exception();
        }
        waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        done = true;
      },
      std::chrono::milliseconds(1500));
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 ranks arrived"), std::string::npos) << e.what();
  }
  EXPECT_GE(waited_s, 1.4);
  EXPECT_LT(waited_s, 30.0);
}

TEST(ShmAllreduce, OffViaEnvAndForAWorldOfOne) {
  {
    ScopedShmEnv env("0");
    run_gloo_ranks(2, [](ProcessGroup& pg) {
      EXPECT_FALSE(gloo_uses_shared_memory(pg));
      std::vector<double> v = {1.0 + pg.rank()};
      pg.allreduce(v.data(), 1, ReduceOp::kAvg);
      EXPECT_EQ(v[0], 1.5);
    });
  }
  {
    ScopedShmEnv env("1");
    run_gloo_ranks(1, [](ProcessGroup& pg) {
      EXPECT_FALSE(gloo_uses_shared_memory(pg));
      std::vector<double> v = {4.0};
      pg.allreduce(v.data(), 1, ReduceOp::kSum);
      EXPECT_EQ(v[0], 4.0);
    });
  }
}

// Forks `world` processes that meet through a file store in `dir`; each runs body(pg, rank) and
// exits with its result (1 when it throws). Returns the pids, rank order, for the caller to reap.
std::vector<pid_t> fork_ranks(int world, const std::filesystem::path& dir,
                              const std::function<int(ProcessGroup&, int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
    if (pid == 0) {
      int rc = 1;
      try {
        gloo::rendezvous::FileStore store(dir.string());
        GlooOptions opts;
        opts.timeout = std::chrono::seconds(60);
        auto pg = make_gloo_process_group(store, r, world, opts);
        rc = body(*pg, r);
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      _exit(rc);
    }
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

void expect_exit_zero(pid_t pid) {
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

// Real processes: the segment is shared across address spaces, and it is unlinked once mapped.
TEST(ShmAllreduce, ForkedProcessesShareTheSegment) {
  ScopedShmEnv env(nullptr);
  auto dir = std::filesystem::temp_directory_path() /
             ("dlaunch_shm_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const int world = 3;
  std::vector<pid_t> pids = fork_ranks(world, dir, [](ProcessGroup& pg, int r) {
    bool ok = gloo_uses_shared_memory(pg);
    for (int i = 0; i < 200 && ok; ++i) {
      std::vector<double> v = {static_cast<double>(r + i), 0.25};
      pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
      ok = v[0] == 3.0 * i + 3.0 && v[1] == 0.75;
    }
    pg.barrier();
    return ok ? 0 : 2;
  });
  ASSERT_EQ(pids.size(), static_cast<size_t>(world));
  for (pid_t pid : pids) expect_exit_zero(pid);
  std::filesystem::remove_all(dir);
  // Nothing of ours is left in /dev/shm.
  const std::string prefix = "dlaunch-shm-" + std::to_string(pids[0]) + "-";
  if (std::filesystem::exists("/dev/shm")) {
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      EXPECT_NE(e.path().filename().string().rfind(prefix, 0), 0u) << e.path();
    }
  }
}

// A peer process that exits is noticed long before the timeout, even while still a zombie.
TEST(ShmAllreduce, ExitedPeerProcessSurfacesAsConnectionError) {
  ScopedShmEnv env(nullptr);
  auto dir = std::filesystem::temp_directory_path() /
             ("dlaunch_shm_exit_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids = fork_ranks(2, dir, [](ProcessGroup& pg, int r) {
    if (!gloo_uses_shared_memory(pg)) return 3;
    if (r == 1) return 0;  // gone without a word; the parent reaps it only later
    auto start = std::chrono::steady_clock::now();
    std::vector<double> v(4, 1.0);
    try {
      pg.allreduce(v.data(), v.size(), ReduceOp::kSum);
      return 4;
    } catch (const ConnectionError& e) {
      auto waited = std::chrono::steady_clock::now() - start;
      fprintf(stderr, "rank 0 (expected): %s\n", e.what());
      return waited < std::chrono::seconds(20) ? 0 : 5;
    }
  });
  ASSERT_EQ(pids.size(), 2u);
  expect_exit_zero(pids[0]);  // rank 1 stays a zombie meanwhile
  expect_exit_zero(pids[1]);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlaunch::comm
