// Rank-level recovery, the worker's half (worker/train/rank_recovery.h), with dtrain as real
// processes: three ranks of real gloo bootstrapped through a real TcpStoreServer, and this test
// playing the agent's part of the contract (docs/env.md, "Rank-level recovery"): when a rank dies
// (its own SIGKILL, DTRAIN_FAIL_AT_STEP) it bumps the generation counter, writes the verdict and
// spawns the replacement with DLAUNCH_REPLACEMENT=1 and the same environment.
//
// - a rank killed mid-epoch and replaced: the survivors keep running (the same processes), and
//   the per-step losses and the final checkpoint's arrays equal a run without the death, bit
//   for bit; rank 0 too (it writes the metrics); three deaths, two in one epoch;
// - a death after a step's optimizer step: the step is not redone, the training still equal;
// - verdict restart: the survivors exit at once with the original error;
// - no DLAUNCH_RECOVERY_KEY, or --rank_recovery off: the survivors exit as before;
// - a node lost (4 ranks as 2 nodes of 2, both ranks of one SIGKILLed mid-epoch, the test writing
//   the verdict `shrink 2 <round>` and the new ranks as the agents would): the 2 survivors (the
//   same processes) re-form in process and finish, every sample of each epoch trained exactly
//   once (DTRAIN_LOG_SAMPLES), with each rank's batch or the global batch kept
//   (--elastic_batch; a global batch that does not divide is rounded down per rank); rank 0's
//   duties move when its node is the one lost; a single rank of the shrunk world is still
//   replaced in process.
// The time from a death to the survivors' next completed step is printed (not asserted).
#include <gtest/gtest.h>
#include <signal.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <set>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "tests/support/subprocess.h"
#include "worker/checkpoint/checkpoint.h"

namespace dlaunch {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kTrainSamples = 192;
constexpr int kBatch = 8;
const char kRecoveryKey[] = "dlaunch/recovery/test-run/attempt_0";

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<json> records(const fs::path& metrics, const std::string& kind) {
  std::vector<json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("kind", "") == kind) out.push_back(j);
  }
  return out;
}

// A rank's death, planned through DTRAIN_FAIL_AT_STEP: the `incarnation`-th process of `rank`
// (0: the first one) SIGKILLs itself after global step `step` (or its optimizer step).
// Or, with `outside_after_us` >= 0, the test SIGKILLs it that many microseconds after rank 0
// recorded step `step`: at whatever point of the next step it is then.
struct Death {
  int rank = 0;
  int64_t step = 0;
  int incarnation = 0;
  bool after_optimizer = false;
  int64_t outside_after_us = -1;
};

// How the test agent answers a death.
enum class Verdict { kReplace, kRestart, kNone };

struct Outcome {
  std::vector<testing::ExitInfo> exits;  // the last process of each rank
  std::vector<std::string> logs;         // the last process of each rank: stdout + stderr
  std::vector<int> processes;            // processes each rank had
  std::vector<double> death_to_next_step_ms;  // per replaced death of a rank other than 0
  bool finished = false;
};

class RankRecoveryTest : public ::testing::Test {
 protected:
  // The same flags and data for every run; `out` is the run's --output_dir.
  std::vector<std::string> args(const std::string& out) const {
    std::vector<std::string> a = {DTRAIN_BINARY,      "--width=4",        "--batch_size=" + std::to_string(kBatch),
                                  "--epochs=2",       "--log_every=1",    "--sync_bn",
                                  "--eval_every=1",   "--tensorboard=false",
                                  "--collective_timeout=600", "--output_dir=" + dir_.file(out)};
    a.insert(a.end(), extra_args_.begin(), extra_args_.end());
    return a;
  }

  std::map<std::string, std::string> env(int rank, const std::string& run) const {
    // One node of world_ ranks, or nodes of nproc_per_node_ (GROUP_RANK the node's index).
    const int per_node = nproc_per_node_ > 0 ? nproc_per_node_ : world_;
    std::map<std::string, std::string> e = {{"RANK", std::to_string(rank)},
            {"LOCAL_RANK", std::to_string(rank % per_node)},
            {"WORLD_SIZE", std::to_string(world_)},
            {"LOCAL_WORLD_SIZE", std::to_string(per_node)},
            {"GROUP_RANK", std::to_string(rank / per_node)},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", std::to_string(port_)},
            {"TORCHELASTIC_RESTART_COUNT", "0"},
            {"TORCHELASTIC_RUN_ID", run},
            {"DLAUNCH_RECOVERY_KEY", recovery_key_},
            {"DLAUNCH_HEARTBEAT_FILE", dir_.file(run + ".hb" + std::to_string(rank))},
            {"DLAUNCH_REPLACEMENT", "0"},
            // As under dlaunch: the data loaded once is kept there, so a replacement reads it
            // back instead of generating the synthetic set again.
            {"DLAUNCH_FLASH_DIR", dir_.file(run + ".flash")},
            {"DTRAIN_LIMIT_TRAIN_SAMPLES", std::to_string(kTrainSamples)},
            {"DTRAIN_LIMIT_TEST_SAMPLES", "48"},
            {"DTRAIN_FAIL_AT_STEP", "-1"},
            {"DTRAIN_FAIL_POINT", ""},
            // Convolutions that never tune: timed choices could differ between the runs compared.
            {"DLAUNCH_CONV_ALGO", "direct"},
            {"DLAUNCH_CONV_CACHE", "off"},
            {"OMP_NUM_THREADS", "1"}};
    for (const auto& [k, v] : extra_env_) e[k] = v;
    return e;
  }

  // Runs the job `run` with `deaths`, answering each with `verdict`. Each run has a store of its
  // own, as each job has its agent's.
  Outcome run_job(const std::string& run, const std::vector<Death>& deaths, Verdict verdict) {
    TcpStoreServer server{TcpStoreServerOptions{}};
    port_ = server.start();
    Outcome outcome;
    std::vector<std::unique_ptr<testing::Subprocess>> procs(world_);
    outcome.processes.assign(world_, 0);
    auto spawn = [&](int rank, bool replacement) {
      std::map<std::string, std::string> e = env(rank, run);
      e["DLAUNCH_REPLACEMENT"] = replacement ? "1" : "0";
      for (const Death& d : deaths) {
        if (d.rank == rank && d.incarnation == outcome.processes[rank] && d.outside_after_us < 0) {
          e["DTRAIN_FAIL_AT_STEP"] = std::to_string(d.step);
          e["DTRAIN_FAIL_RANK"] = std::to_string(rank);
          if (d.after_optimizer) e["DTRAIN_FAIL_POINT"] = "after_optimizer";
        }
      }
      ++outcome.processes[rank];
      procs[rank] = std::make_unique<testing::Subprocess>(args(run), e);
    };
    for (int r = 0; r < world_; ++r) spawn(r, false);

    TcpStoreClientOptions client_options;
    client_options.port = port_;
    TcpStoreClient agent_store(client_options);
    const fs::path metrics = fs::path(dir_.file(run)) / "metrics.jsonl";
    std::vector<std::optional<testing::ExitInfo>> exits(world_);
    std::vector<std::string> logs(world_);
    // Measuring: a death of a rank other than 0 is followed by rank 0's record of the next step.
    std::optional<std::pair<Clock::time_point, int64_t>> measuring;
    std::vector<Death> outside;
    for (const Death& d : deaths) {
      if (d.outside_after_us >= 0) outside.push_back(d);
    }
    const auto deadline = Clock::now() + 300s;
    while (Clock::now() < deadline) {
      if (announce_after_step_ >= 0) {
        const auto steps = records(metrics, "step");
        if (!steps.empty() && steps.back()["step"].get<int64_t>() >= announce_after_step_) {
          // A replacement announced while every rank lives: only the announcement can make
          // them abandon their step.
          announce_after_step_ = -1;
          const int64_t g = agent_store.add(recovery_key_, 1);
          agent_store.set(fmt::format("{}/{}", recovery_key_, g), to_bytes("replace"));
        }
      }
      for (auto it = outside.begin(); it != outside.end(); ++it) {
        const auto steps = records(metrics, "step");
        if (it->incarnation + 1 != outcome.processes[it->rank] || steps.empty() ||
            steps.back()["step"].get<int64_t>() < it->step) {
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(it->outside_after_us));
        procs[it->rank]->signal(SIGKILL);
        outside.erase(it);
        break;
      }
      bool all_done = true;
      for (int r = 0; r < world_; ++r) {
        if (exits[r]) continue;
        std::optional<testing::ExitInfo> exit = procs[r]->wait(0ms);
        if (!exit) {
          all_done = false;
          continue;
        }
        const bool killed = exit->signaled && exit->code == SIGKILL;
        if (killed && verdict != Verdict::kNone) {
          const Clock::time_point died = Clock::now();
          const int64_t g = agent_store.add(recovery_key_, 1);
          const std::string said = verdict == Verdict::kReplace ? "replace" : "restart";
          agent_store.set(fmt::format("{}/{}", recovery_key_, g), Bytes(said.begin(), said.end()));
          if (verdict == Verdict::kReplace) {
            const auto steps = records(metrics, "step");
            if (r != 0 && !steps.empty() && second_death_during_reform_ < 0) {
              measuring.emplace(died, steps.back()["step"].get<int64_t>());
            }
            if (second_death_during_reform_ >= 0) {
              // Another rank dies while the survivors re-form at this generation (before the
              // replacement joins it): the agent announces the next one and replaces both.
              const int second = std::exchange(second_death_during_reform_, -1);
              std::this_thread::sleep_for(300ms);
              procs[second]->signal(SIGKILL);
              EXPECT_TRUE(procs[second]->wait(60s).has_value());
              const int64_t g2 = agent_store.add(recovery_key_, 1);
              agent_store.set(fmt::format("{}/{}", recovery_key_, g2),
                              Bytes(said.begin(), said.end()));
              spawn(second, true);
            }
            spawn(r, true);
            all_done = false;
            continue;
          }
        }
        exits[r] = exit;
        logs[r] = procs[r]->out() + procs[r]->err();
      }
      if (measuring) {
        const auto steps = records(metrics, "step");
        if (!steps.empty() && steps.back()["step"].get<int64_t>() > measuring->second) {
          outcome.death_to_next_step_ms.push_back(
              1e3 * std::chrono::duration<double>(Clock::now() - measuring->first).count());
          measuring.reset();
        }
      }
      if (all_done) {
        outcome.finished = true;
        break;
      }
      std::this_thread::sleep_for(measuring ? 1ms : 10ms);
    }
    for (int r = 0; r < world_; ++r) {
      if (!exits[r]) {
        ADD_FAILURE() << "rank " << r << " did not finish: " << procs[r]->err();
        continue;
      }
      outcome.exits.push_back(*exits[r]);
      outcome.logs.push_back(logs[r]);
    }
    for (double ms : outcome.death_to_next_step_ms) {
      std::printf("[ measure  ] %s: %.0f ms from a rank's SIGKILL to the survivors' next step\n",
                  run.c_str(), ms);
    }
    return outcome;
  }

  // The training without any death, to compare with.
  void run_reference() {
    const Outcome ref = run_job("reference", {}, Verdict::kNone);
    ASSERT_TRUE(ref.finished);
    for (int r = 0; r < world_; ++r) ASSERT_EQ(ref.exits[r].shell_code(), 0) << ref.logs[r];
  }

  // Every step record's figures of `run` equal the reference's, bit for bit, except `skipped`.
  void expect_same_losses(const std::string& run, const std::vector<int64_t>& skipped = {}) {
    const auto want = records(fs::path(dir_.file("reference")) / "metrics.jsonl", "step");
    const auto got = records(fs::path(dir_.file(run)) / "metrics.jsonl", "step");
    // Two epochs of 192 samples in batches of 8 per rank: 16 steps with 3 ranks, 12 with 4.
    ASSERT_EQ(want.size(), static_cast<size_t>(2 * kTrainSamples / (world_ * kBatch)));
    std::map<int64_t, json> by_step;
    for (const json& j : got) by_step[j["step"].get<int64_t>()] = j;  // a redone step: the last
    for (const json& w : want) {
      const int64_t step = w["step"].get<int64_t>();
      if (std::find(skipped.begin(), skipped.end(), step) != skipped.end()) continue;
      ASSERT_TRUE(by_step.count(step)) << run << " has no record of step " << step;
      const json& g = by_step[step];
      for (const char* key : {"loss", "train_accuracy", "lr", "epoch", "world_size"}) {
        EXPECT_EQ(g[key], w[key]) << run << ", step " << step << ", " << key;
      }
    }
    // Evaluation sees the final weights and BN statistics.
    const auto want_epochs = records(fs::path(dir_.file("reference")) / "metrics.jsonl", "epoch");
    const auto got_epochs = records(fs::path(dir_.file(run)) / "metrics.jsonl", "epoch");
    ASSERT_EQ(got_epochs.size(), want_epochs.size());
    for (size_t i = 0; i < want_epochs.size(); ++i) {
      EXPECT_EQ(got_epochs[i]["test_loss"], want_epochs[i]["test_loss"]) << "epoch " << i + 1;
      EXPECT_EQ(got_epochs[i]["test_accuracy"], want_epochs[i]["test_accuracy"]);
    }
  }

  // The final checkpoint's arrays (weights, BN statistics, optimizer state) equal the
  // reference's, bit for bit (the run ids in the metadata differ).
  void expect_same_final_state(const std::string& run) {
    const std::string name = ckpt::checkpoint_file_name(2);
    const ckpt::Checkpoint want = ckpt::read_checkpoint((fs::path(dir_.file("reference")) / name).string());
    const ckpt::Checkpoint got = ckpt::read_checkpoint((fs::path(dir_.file(run)) / name).string());
    ASSERT_EQ(got.arrays.size(), want.arrays.size());
    for (size_t i = 0; i < want.arrays.size(); ++i) {
      EXPECT_EQ(got.arrays[i].first, want.arrays[i].first);
      EXPECT_TRUE(got.arrays[i].second == want.arrays[i].second)
          << run << ": array " << want.arrays[i].first << " differs";
    }
    EXPECT_EQ(got.meta["step"], want.meta["step"]);
  }

  void expect_survived(const Outcome& o, const std::vector<int>& processes) {
    ASSERT_TRUE(o.finished);
    EXPECT_EQ(o.processes, processes);
    for (int r = 0; r < world_; ++r) EXPECT_EQ(o.exits[r].shell_code(), 0) << o.logs[r];
  }

  uint16_t port_ = 0;
  testing::TempDir dir_;
  std::string recovery_key_ = kRecoveryKey;
  std::vector<std::string> extra_args_;
  std::map<std::string, std::string> extra_env_;
  int world_ = 3;
  int nproc_per_node_ = 0;  // 0: every rank on one node
  // >= 0: this rank is SIGKILLed while the survivors re-form after the first death.
  int second_death_during_reform_ = -1;
  // >= 0: the test agent announces generation 1 with the verdict replace (no rank died) once
  // rank 0 recorded this step.
  int64_t announce_after_step_ = -1;
};

// A node of an elastic job lost: 4 ranks as 2 nodes of 2 (or, with nodes_ and per_node_, 4 of
// 1). The ranks of `lost_node` SIGKILL themselves after global step `step` (in the first epoch);
// once all are gone the test does what the surviving agents do (docs/env.md, "Rank-level
// recovery"): it announces generation 1 with the verdict `shrink <W'> <round>` and gives each
// survivor its new rank (the nodes after the lost one move down by one). With
// `later_death_step` > 0 the survivor that is rank 1 after the shrink dies after that step and
// is replaced alone in the smaller world (RANK=1, WORLD_SIZE=W').
class ShrinkTest : public RankRecoveryTest {
 protected:
  const std::string kRound = "7";
  int nodes_ = 2;
  int per_node_ = 2;
  int world() const { return nodes_ * per_node_; }
  int shrunk() const { return (nodes_ - 1) * per_node_; }

  struct ShrinkOutcome {
    std::vector<testing::ExitInfo> exits;  // the survivors (by their rank after the shrink), then
    std::vector<std::string> logs;         // the replacement if any
    std::vector<pid_t> survivor_pids_before, survivor_pids_after;
    bool finished = false;
  };

  ShrinkOutcome run_shrink(const std::string& run, int lost_node, int64_t step,
                           int64_t later_death_step = 0) {
    world_ = world();
    nproc_per_node_ = per_node_;
    const int before = world();
    const int after = shrunk();
    TcpStoreServer server{TcpStoreServerOptions{}};
    port_ = server.start();
    const std::string samples = dir_.file(run + ".samples");
    fs::create_directories(samples);
    auto environment = [&](int rank) {
      std::map<std::string, std::string> e = env(rank, run);
      e["DLAUNCH_FLASH_DIR"] = dir_.file(run + ".flash" + std::to_string(rank / per_node_));
      e["DTRAIN_LOG_SAMPLES"] = samples;
      return e;
    };
    std::vector<std::unique_ptr<testing::Subprocess>> procs(before);
    std::vector<int> new_rank(before, -1);
    for (int r = 0; r < before; ++r) {
      std::map<std::string, std::string> e = environment(r);
      if (r / per_node_ == lost_node) {
        e["DTRAIN_FAIL_AT_STEP"] = std::to_string(step);
        e["DTRAIN_FAIL_RANK"] = std::to_string(r);
      } else {
        const int node = r / per_node_;
        new_rank[r] = (node < lost_node ? node : node - 1) * per_node_ + r % per_node_;
        if (later_death_step > 0 && new_rank[r] == 1) {
          e["DTRAIN_FAIL_AT_STEP"] = std::to_string(later_death_step);
          e["DTRAIN_FAIL_RANK"] = "1";  // its rank after the shrink
        }
      }
      procs[r] = std::make_unique<testing::Subprocess>(args(run), e);
    }
    ShrinkOutcome outcome;
    for (int r = 0; r < before; ++r) {
      if (new_rank[r] >= 0) outcome.survivor_pids_before.push_back(procs[r]->pid());
    }

    TcpStoreClientOptions client_options;
    client_options.port = port_;
    TcpStoreClient agent_store(client_options);
    auto set = [&](const std::string& key, const std::string& value) {
      agent_store.set(key, Bytes(value.begin(), value.end()));
    };
    std::unique_ptr<testing::Subprocess> replacement;
    std::vector<std::optional<testing::ExitInfo>> exits(before);
    std::optional<testing::ExitInfo> replacement_exit;
    int lost = 0;
    bool announced = false;
    const auto deadline = Clock::now() + 300s;
    while (Clock::now() < deadline) {
      bool all_done = true;
      for (int r = 0; r < before; ++r) {
        if (exits[r]) continue;
        exits[r] = procs[r]->wait(0ms);
        if (!exits[r]) {
          all_done = false;
          continue;
        }
        const bool killed = exits[r]->signaled && exits[r]->code == SIGKILL;
        if (killed && new_rank[r] < 0) ++lost;
        if (killed && new_rank[r] == 1 && later_death_step > 0 && !replacement) {
          // A rank of the shrunk world: replaced alone, as the agent does.
          const int64_t g = agent_store.add(recovery_key_, 1);
          set(fmt::format("{}/{}", recovery_key_, g), "replace");
          std::map<std::string, std::string> e = environment(r);
          e["RANK"] = "1";
          e["WORLD_SIZE"] = std::to_string(after);
          e["LOCAL_RANK"] = std::to_string(1 % per_node_);
          e["GROUP_RANK"] = std::to_string(1 / per_node_);
          e["DLAUNCH_REPLACEMENT"] = "1";
          replacement = std::make_unique<testing::Subprocess>(args(run), e);
          all_done = false;
        }
      }
      if (lost == per_node_ && !announced) {
        // The new round's leader announces the shrink, then every surviving agent gives its
        // workers their new ranks (the order between the two does not matter).
        announced = true;
        const int64_t g = agent_store.add(recovery_key_, 1);
        set(fmt::format("{}/{}", recovery_key_, g), fmt::format("shrink {} {}", after, kRound));
        std::this_thread::sleep_for(200ms);
        for (int r = 0; r < before; ++r) {
          if (new_rank[r] < 0) continue;
          set(fmt::format("{}/shrink_{}/rank_{}", recovery_key_, kRound, r),
              std::to_string(new_rank[r]));
        }
      }
      if (replacement && !replacement_exit) {
        replacement_exit = replacement->wait(0ms);
        if (!replacement_exit) all_done = false;
      }
      if (all_done) {
        outcome.finished = true;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    for (int k = 0; k < after; ++k) {
      for (int r = 0; r < before; ++r) {
        if (new_rank[r] != k) continue;
        outcome.survivor_pids_after.push_back(procs[r]->pid());
        if (!exits[r]) {
          ADD_FAILURE() << "rank " << r << " did not finish: " << procs[r]->err();
          continue;
        }
        outcome.exits.push_back(*exits[r]);
        outcome.logs.push_back(procs[r]->out() + procs[r]->err());
      }
    }
    if (replacement) {
      if (!replacement_exit) {
        ADD_FAILURE() << "the replacement did not finish: " << replacement->err();
      } else {
        outcome.exits.push_back(*replacement_exit);
        outcome.logs.push_back(replacement->out() + replacement->err());
      }
    }
    return outcome;
  }

  // Every sample of each of the 2 epochs trained exactly once, by all the processes together,
  // but for the padding of an epoch's rest to a multiple of the smaller world (the
  // permutation's first samples once more, as the sampler pads; none at 4 ranks nor at 2 for
  // 192 samples). `step`: the steps done at the old size; `per_rank_batch_after` the size of
  // each step's batch at the smaller world (an epoch's last may be smaller).
  void expect_each_sample_once(const std::string& run, int64_t step, size_t per_rank_batch_after) {
    const int before = world();
    const int after = shrunk();
    std::map<int64_t, std::map<int64_t, int>> trained;  // epoch -> sample -> times
    int lines_after = 0;
    for (const auto& f : fs::directory_iterator(dir_.file(run + ".samples"))) {
      std::istringstream in(slurp(f.path()));
      for (std::string line; std::getline(in, line);) {
        std::istringstream words(line);
        int64_t epoch = 0, step = 0, world = 0;
        ASSERT_TRUE(words >> epoch >> step >> world) << line;
        std::vector<int64_t> ids;
        for (int64_t id; words >> id;) ids.push_back(id);
        if (world == before) {
          ASSERT_EQ(ids.size(), static_cast<size_t>(kBatch)) << line;
        } else {
          ASSERT_EQ(world, after) << line;
          ASSERT_LE(ids.size(), per_rank_batch_after) << line;
          if (ids.size() == per_rank_batch_after) ++lines_after;
        }
        for (int64_t id : ids) ++trained[epoch][id];
      }
    }
    EXPECT_GT(lines_after, 0);
    ASSERT_EQ(trained.size(), 2u);
    const int64_t rest = kTrainSamples - step * kBatch * before;
    const std::vector<int64_t> padding = {(after - rest % after) % after,
                                          (after - kTrainSamples % after) % after};
    for (const auto& [epoch, times] : trained) {
      EXPECT_EQ(times.size(), static_cast<size_t>(kTrainSamples)) << "epoch " << epoch + 1;
      int64_t twice = 0;
      for (const auto& [id, n] : times) {
        if (n == 2) ++twice;
        EXPECT_LE(n, 2) << "epoch " << epoch + 1 << ": sample " << id << " trained " << n << " times";
      }
      EXPECT_EQ(twice, padding[epoch]) << "epoch " << epoch + 1;
    }
  }

  // The run's steps: `step` at 4 ranks of kBatch, then the first epoch's rest and the second
  // epoch at 2 ranks of `per_rank_batch_after`, as the final checkpoint and the metrics say.
  void expect_steps(const std::string& run, int64_t step, int64_t per_rank_batch_after) {
    const int after = shrunk();
    const int64_t rest = kTrainSamples - step * kBatch * world();
    // Each rank's share (padded to whole samples), in batches (the last may be smaller).
    auto steps_for = [&](int64_t samples) {
      const int64_t per_rank = (samples + after - 1) / after;
      return (per_rank + per_rank_batch_after - 1) / per_rank_batch_after;
    };
    const int64_t steps = step + steps_for(rest) + steps_for(kTrainSamples);
    const ckpt::Checkpoint final_state = ckpt::read_checkpoint(
        (fs::path(dir_.file(run)) / ckpt::checkpoint_file_name(2)).string());
    EXPECT_EQ(final_state.meta["step"], steps);
    EXPECT_EQ(final_state.meta["world_size"], after);
    EXPECT_EQ(final_state.meta["batch_size"], per_rank_batch_after);
    const auto steps_recorded = records(fs::path(dir_.file(run)) / "metrics.jsonl", "step");
    ASSERT_FALSE(steps_recorded.empty());
    EXPECT_EQ(steps_recorded.back()["step"], steps);
    EXPECT_EQ(steps_recorded.back()["world_size"], after);
    const auto epochs = records(fs::path(dir_.file(run)) / "metrics.jsonl", "epoch");
    ASSERT_EQ(epochs.size(), 2u);
    EXPECT_EQ(epochs.back()["world_size"], after);
  }

  void expect_survivors_finished(const ShrinkOutcome& o, size_t processes) {
    ASSERT_TRUE(o.finished);
    ASSERT_EQ(o.exits.size(), processes);
    for (size_t i = 0; i < o.exits.size(); ++i) {
      EXPECT_EQ(o.exits[i].shell_code(), 0) << o.logs[i];
    }
  }
};

// Node 0 lost, rank 0 with it: the ranks 2 and 3 go on as 0 and 1 with their batch of 8 (the
// global batch 32 becomes 16), and the new rank 0 takes over the metrics and the checkpoints.
TEST_F(ShrinkTest, NodeLostPerRankBatchEverySampleOnceAndRankZeroMoves) {
  const ShrinkOutcome o = run_shrink("per_rank", /*lost_node=*/0, /*step=*/2);
  expect_survivors_finished(o, 2);
  EXPECT_EQ(o.survivor_pids_after, o.survivor_pids_before);
  expect_each_sample_once("per_rank", 2, kBatch);
  expect_steps("per_rank", 2, kBatch);
  EXPECT_NE(o.logs[0].find("shrinks the group from world size 4 to 2 (round 7): this worker goes "
                           "on as rank 0 (was 2)"),
            std::string::npos)
      << o.logs[0];
  EXPECT_NE(o.logs[0].find("this worker is rank 0 now"), std::string::npos) << o.logs[0];
  EXPECT_NE(o.logs[0].find("epoch 1 goes on after 64 of its 192 samples, shared among 2 ranks"),
            std::string::npos)
      << o.logs[0];
}

// --elastic_batch global: node 1 lost; the survivors keep the global batch of 32, 16 each.
TEST_F(ShrinkTest, NodeLostGlobalBatchKeptEverySampleOnce) {
  extra_args_ = {"--elastic_batch=global"};
  const ShrinkOutcome o = run_shrink("global", /*lost_node=*/1, /*step=*/3);
  expect_survivors_finished(o, 2);
  EXPECT_EQ(o.survivor_pids_after, o.survivor_pids_before);
  expect_each_sample_once("global", 3, 2 * kBatch);
  expect_steps("global", 3, 2 * kBatch);
  EXPECT_NE(o.logs[0].find("each rank's batch is now 16 (was 8), the global batch 32 kept"),
            std::string::npos)
      << o.logs[0];
}

// After the shrink a single rank of the world of 2 dies and is replaced in process: the
// replacement trains with its peer's batch (16, --elastic_batch global) from its position.
TEST_F(ShrinkTest, ARankOfTheShrunkWorldIsStillReplacedAlone) {
  extra_args_ = {"--elastic_batch=global"};
  const ShrinkOutcome o = run_shrink("replaced", /*lost_node=*/1, /*step=*/2,
                                     /*later_death_step=*/4);
  ASSERT_TRUE(o.finished);
  ASSERT_EQ(o.exits.size(), 3u);
  EXPECT_EQ(o.exits[0].shell_code(), 0) << o.logs[0];
  EXPECT_EQ(o.exits[1].shell_code(), 128 + SIGKILL) << o.logs[1];
  EXPECT_EQ(o.exits[2].shell_code(), 0) << o.logs[2];
  expect_each_sample_once("replaced", 2, 2 * kBatch);
  expect_steps("replaced", 2, 2 * kBatch);
  EXPECT_NE(o.logs[0].find("re-formed the group at generation 2 (rank 0 of 2)"), std::string::npos)
      << o.logs[0];
}

TEST_F(RankRecoveryTest, RankKilledMidEpochIsReplacedAndTheTrainingIsBitIdentical) {
  run_reference();
  const Outcome o = run_job("recovered", {{1, 5}}, Verdict::kReplace);
  // Ranks 0 and 2 are the processes started first: they survived.
  expect_survived(o, {1, 2, 1});
  expect_same_losses("recovered");
  expect_same_final_state("recovered");
  EXPECT_NE(o.logs[0].find("re-formed the group at generation 1"), std::string::npos) << o.logs[0];
  EXPECT_NE(o.logs[1].find("took the training state from rank 0"), std::string::npos) << o.logs[1];
  EXPECT_EQ(slurp(dir_.file("recovered.hb0")), "rank_recovery\n");
}

// Without SyncBN the first collective of a step is the gradients' asynchronous all-reduce (gloo,
// on the communication thread): the survivors' failure comes from there (or from the agent's
// announcement, whichever reaches them first), and the group's
// teardown must not wait for the collective timeout (600 s) on the all-reduces in flight. The BN
// statistics are each rank's own then; those of rank 0 are the ones checkpointed, unchanged.
TEST_F(RankRecoveryTest, WithoutSyncBnTheFailedGradientAllReduceIsRedone) {
  extra_args_ = {"--sync_bn=false"};
  run_reference();
  const Outcome o = run_job("recovered", {{2, 7}}, Verdict::kReplace);
  expect_survived(o, {1, 1, 2});
  expect_same_losses("recovered");
  expect_same_final_state("recovered");
  // Whichever came first: the gradient all-reduce's failure, or the agent's announcement read by
  // the survivor's watch (it then abandons the step with that all-reduce in flight, whose
  // teardown must not wait for the timeout either).
  const bool all_reduce_failed = o.logs[0].find("gloo allreduce") != std::string::npos;
  const bool announced = o.logs[0].find("the agent announced generation 1") != std::string::npos;
  EXPECT_TRUE(all_reduce_failed || announced) << o.logs[0];
}

// SIGKILLed from outside at moments inside a step (in a collective, maybe, that some survivors
// complete and others do not: they then agree on the newest state). Wherever the death lands the
// training goes on to the same final state; the records of the steps around the death may lack
// the dead rank's share (a death after a step's optimizer step loses its logging window).
TEST_F(RankRecoveryTest, KilledFromOutsideAnywhereInAStep) {
  run_reference();
  const std::vector<int64_t> delays_us = {0, 700, 2500, 6000};
  for (size_t i = 0; i < delays_us.size(); ++i) {
    Death death{static_cast<int>(1 + i % 2), static_cast<int64_t>(3 + 3 * i)};
    death.outside_after_us = delays_us[i];
    const std::string run = "outside" + std::to_string(i);
    const Outcome o = run_job(run, {death}, Verdict::kReplace);
    std::vector<int> processes = {1, 1, 1};
    processes[death.rank] = 2;
    expect_survived(o, processes);
    expect_same_losses(run, {death.step, death.step + 1, death.step + 2});
    expect_same_final_state(run);
  }
}

// A second rank dies while the group re-forms (the agent already announced generation 1 for the
// first): the last survivor gives up joining generation 1 as soon as generation 2 is announced,
// instead of waiting for the dead rank until the join timeout (600 s here), and re-forms with
// both replacements.
TEST_F(RankRecoveryTest, SecondDeathDuringTheReFormMovesOnToTheNextGeneration) {
  run_reference();
  second_death_during_reform_ = 2;
  const Outcome o = run_job("recovered", {{1, 5}}, Verdict::kReplace);
  expect_survived(o, {1, 2, 2});
  expect_same_losses("recovered");
  expect_same_final_state("recovered");
  EXPECT_NE(o.logs[0].find("re-formed the group at generation 2"), std::string::npos) << o.logs[0];
}

// Four ranks: in gloo's ring, rank 3's neighbours (2 and 0) both survive rank 1's death, so its
// all-reduce in flight ends only when a neighbour abandons the group (closes its connections),
// not by the dead rank's closed sockets.
TEST_F(RankRecoveryTest, FourRanksWithoutSyncBnASurvivorAwayFromTheDeadRankRecoversToo) {
  world_ = 4;
  extra_args_ = {"--sync_bn=false"};
  run_reference();
  const Outcome o = run_job("recovered", {{1, 4}}, Verdict::kReplace);
  expect_survived(o, {1, 2, 1, 1});
  expect_same_losses("recovered");
  expect_same_final_state("recovered");
}

TEST_F(RankRecoveryTest, RankZeroIsReplacedAndItsMetricsGoOn) {
  run_reference();
  const Outcome o = run_job("recovered", {{0, 6}}, Verdict::kReplace);
  expect_survived(o, {2, 1, 1});
  expect_same_losses("recovered");
  expect_same_final_state("recovered");
  EXPECT_NE(o.logs[0].find("took the training state from rank 1"), std::string::npos) << o.logs[0];
}

TEST_F(RankRecoveryTest, ThreeDeathsTwoInOneEpoch) {
  run_reference();
  const Outcome o =
      run_job("recovered", {{1, 2}, {2, 5}, {0, 11}}, Verdict::kReplace);
  expect_survived(o, {2, 2, 2});
  expect_same_losses("recovered");
  expect_same_final_state("recovered");
  EXPECT_NE(o.logs[1].find("re-formed the group at generation 3"), std::string::npos) << o.logs[1];
}

// The rank dies after its optimizer step, before the stop-signal agreement: the survivors'
// step is complete, so it is not redone; that step's logging window is lost (the dead rank's
// share of it), so its record and the next one differ, and nothing else.
TEST_F(RankRecoveryTest, DeathAfterTheOptimizerStepIsNotRedone) {
  run_reference();
  Death death{2, 4};
  death.after_optimizer = true;
  const Outcome o = run_job("recovered", {death}, Verdict::kReplace);
  expect_survived(o, {1, 1, 2});
  expect_same_losses("recovered", {4, 5});
  expect_same_final_state("recovered");
  EXPECT_NE(o.logs[0].find("step 4 was complete when the peer failed"), std::string::npos)
      << o.logs[0];
}

// A replacement's data, model and kernels are made ready while it joins the group, not after:
// its start-up phases (debug lines) say so, and the survivors, which are no replacements, do
// nothing of the kind. (That the warm-up pass leaves no trace is the bit-identical tests'.)
TEST_F(RankRecoveryTest, ReplacementPreparesItsDataModelAndKernelsWhileJoining) {
  extra_env_ = {{"DLAUNCH_LOG_LEVEL", "debug"}};
  const Outcome o = run_job("prepared", {{1, 5}}, Verdict::kReplace);
  expect_survived(o, {1, 2, 1});
  for (const char* phase : {"start-up: data ready (prepared while joining)",
                            "start-up: model built (prepared while joining)"}) {
    EXPECT_NE(o.logs[1].find(phase), std::string::npos) << o.logs[1];
  }
  // The warm-up pass, whole or cut short at the join (which of the two depends on the timing).
  EXPECT_TRUE(o.logs[1].find("start-up: kernels warmed up (prepared while joining)") !=
                  std::string::npos ||
              o.logs[1].find("start-up: warm-up cut short: the group was joined") !=
                  std::string::npos)
      << o.logs[1];
  for (int r : {0, 2}) {
    EXPECT_EQ(o.logs[r].find("prepared while joining"), std::string::npos) << o.logs[r];
  }
}

// The agent announces a replacement while the ranks compute (here with no rank dead, so that
// nothing else can end their step): each rank in a training step abandons it at its next layer,
// as soon as the announcement reaches it, rather than when a collective fails, which after a
// real death can be a whole step later (no SyncBN: the first collective of a step is the
// gradient all-reduce's end). They re-form among themselves at generation 1 and redo the step;
// the training is the same as without it.
TEST_F(RankRecoveryTest, AnnouncedReplacementAbandonsTheStepBeforeAnyCollectiveFails) {
  extra_args_ = {"--sync_bn=false", "--width=16"};
  run_reference();
  announce_after_step_ = 3;
  const Outcome o = run_job("announced", {}, Verdict::kNone);
  expect_survived(o, {1, 1, 1});
  // The final state, not every step record: a rank that finished a logging window's all-reduce
  // and abandoned the next step can leave a peer whose all-reduce failed, whose window is then
  // reported with the next one (as after a death).
  expect_same_final_state("announced");
  int abandoned = 0;
  for (int r = 0; r < world_; ++r) {
    EXPECT_NE(o.logs[r].find("re-formed the group at generation 1"), std::string::npos)
        << o.logs[r];
    if (o.logs[r].find("the agent announced generation 1: it re-forms this group (a rank "
                       "replaced or a node lost), so the step in progress is abandoned") !=
        std::string::npos) {
      ++abandoned;
    }
  }
  // A rank the announcement reached between two steps' collectives fails in the next one, when
  // the others abandoned the group; at least one was computing.
  EXPECT_GE(abandoned, 1) << o.logs[0] << o.logs[1] << o.logs[2];
}

// The agent restarts the whole group instead: the survivors exit 1 with the error that ended
// their step, without waiting for the collective timeout (600 s here).
TEST_F(RankRecoveryTest, VerdictRestartEndsTheSurvivorsWithTheOriginalError) {
  const Outcome o = run_job("restarted", {{1, 5}}, Verdict::kRestart);
  ASSERT_TRUE(o.finished);
  EXPECT_EQ(o.processes, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(o.exits[1].shell_code(), 128 + SIGKILL);
  for (int r : {0, 2}) {
    EXPECT_EQ(o.exits[r].shell_code(), 1) << o.logs[r];
    EXPECT_NE(o.logs[r].find("the agent restarts the whole group (generation 1): exiting"),
              std::string::npos)
        << o.logs[r];
    EXPECT_NE(o.logs[r].find("ConnectionError: "), std::string::npos) << o.logs[r];
  }
}

// Without DLAUNCH_RECOVERY_KEY (the agent restarts whole groups) the survivors exit at once as
// before, and announce nothing.
TEST_F(RankRecoveryTest, WithoutTheRecoveryKeySurvivorsExitAsBefore) {
  recovery_key_ = "";
  const Outcome o = run_job("plain", {{1, 5}}, Verdict::kNone);
  ASSERT_TRUE(o.finished);
  for (int r : {0, 2}) {
    EXPECT_EQ(o.exits[r].shell_code(), 1) << o.logs[r];
    EXPECT_EQ(o.logs[r].find("waiting for the agent"), std::string::npos) << o.logs[r];
    EXPECT_EQ(slurp(dir_.file("plain.hb" + std::to_string(r))), "");
  }
}

TEST_F(RankRecoveryTest, RankRecoveryOffSurvivorsExitAsBefore) {
  extra_args_ = {"--rank_recovery", "off"};
  const Outcome o = run_job("off", {{1, 5}}, Verdict::kNone);
  ASSERT_TRUE(o.finished);
  for (int r : {0, 2}) {
    EXPECT_EQ(o.exits[r].shell_code(), 1) << o.logs[r];
    EXPECT_EQ(o.logs[r].find("waiting for the agent"), std::string::npos) << o.logs[r];
    EXPECT_EQ(slurp(dir_.file("off.hb" + std::to_string(r))), "");
  }
}

// --elastic_batch global where the global batch does not divide: 4 nodes of 1, one lost; the
// global batch 32 among 3 ranks is 10 each (30 in all), said in the log; the epoch's rest is
// padded to a multiple of 3 as the sampler pads an epoch, and every other sample trained once.
TEST_F(ShrinkTest, GlobalBatchThatDoesNotDivideIsRoundedDownPerRank) {
  extra_args_ = {"--elastic_batch=global"};
  nodes_ = 4;
  per_node_ = 1;
  const ShrinkOutcome o = run_shrink("rounded", /*lost_node=*/3, /*step=*/2);
  expect_survivors_finished(o, 3);
  EXPECT_EQ(o.survivor_pids_after, o.survivor_pids_before);
  expect_each_sample_once("rounded", 2, 10);
  expect_steps("rounded", 2, 10);
  EXPECT_NE(o.logs[0].find("each rank's batch is now 10 (was 8); the global batch 32 does not "
                           "divide among 3 ranks, so it is 30 now"),
            std::string::npos)
      << o.logs[0];
}

}  // namespace
}  // namespace dlaunch
