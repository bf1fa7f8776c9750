// State from a live peer (worker/train/peer_state.h, resume_from_peer in train/resume.h): ranks
// as threads, each with its own client of a real TcpStoreServer (the agent's store) and a gloo
// group bootstrapped through it, as dtrain's ranks are.
//
// - a replacement takes a real model's state (weights, BN statistics, momentum, EMA, fp16's loss
//   scale, the position in the epoch) from the lowest surviving rank: its state's checksum then
//   equals the survivors', and the steps all ranks train next are bit for bit the same;
// - no rank holding state: every rank is told to fall back, and resume() takes the checkpoint;
// - the source lost halfway (its group closed, its process killed, or hung past the collective
//   timeout): the others get "failed" and have loaded nothing;
// - corrupt bytes: the checksum says so on every rank, nothing is loaded, the group stays usable.
#include "worker/train/peer_state.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "rendezvous/tcp/tcp_store_client.h"
#include "rendezvous/tcp/tcp_store_server.h"
#include "tests/support/subprocess.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/comm/process_group_gloo.h"
#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"
#include "worker/ddp/data_parallel.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/weight_ema.h"
#include "worker/train/checkpointing.h"
#include "worker/train/precision.h"
#include "worker/train/resume.h"

namespace dlaunch::train {
namespace {

using namespace std::chrono_literals;
using GroupPtr = std::unique_ptr<comm::ProcessGroup>;

// `world` ranks as threads; each joins a gloo group through its own TCP client of one real
// store server and runs `fn(rank, group)`. `fn` may reset the group (the rank leaves: its sockets
// close). Rethrows the first rank's failure after all have joined.
void run_ranks(int world, std::chrono::milliseconds collective_timeout,
               const std::function<void(int rank, GroupPtr& pg)>& fn) {
  TcpStoreServer server(TcpStoreServerOptions{});
  const uint16_t port = server.start();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        TcpStoreClientOptions client_options;
        client_options.port = port;
        TcpStoreClient store(client_options);
        comm::GlooOptions options;
        options.timeout = collective_timeout;
        options.connect_timeout = 60s;
        GroupPtr pg = comm::make_gloo_process_group(store, r, world, options);
        fn(r, pg);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

// ---- the training state of a real model --------------------------------------------------

constexpr int kWorld = 3;
constexpr int kBatch = 4;  // per rank

TrainConfig small_config(const std::string& output_dir) {
  TrainConfig c;
  c.width = 4;
  c.batch_size = kBatch;
  c.sync_bn = true;
  c.ema = 0.9;           // an EMA of the weights and BN statistics, in the state
  c.precision = "fp16";  // a loss scale, in the state
  c.momentum = 0.9;
  c.nesterov = true;
  c.seed = 7;
  c.output_dir = output_dir;
  return c;
}

const data::ImageDataset& train_set() {
  static const data::ImageDataset ds = data::make_synthetic(3, true);
  return ds;
}

// One rank's trainer objects, as dtrain's Trainer builds them, and its training step.
struct RankTrainer {
  RankTrainer(const TrainConfig& config, comm::ProcessGroup& pg, uint64_t init_seed)
      : config_(config),
        pg_(pg),
        model(model_config(config), init_seed),
        data_parallel(model, pg, config.sync_bn),
        optimizer(optim_config()),
        precision(kernels::Dtype::kF16, kernels::cpu_backend()) {}

  static model::ResNetConfig model_config(const TrainConfig& config) {
    model::ResNetConfig m;
    m.depth = 18;
    m.width = config.width;
    m.precision = kernels::Dtype::kF16;
    return m;
  }
  optim::OptimConfig optim_config() const {
    optim::OptimConfig o;
    o.momentum = config_.momentum;
    o.nesterov = config_.nesterov;
    o.weight_decay = config_.weight_decay;
    return o;
  }
  void start_ema(const std::vector<float>& resumed) {
    ema = std::make_unique<optim::WeightEma>(model, config_.ema, config_.ema_every,
                                             config_.ema_warmup);
    if (!resumed.empty()) ema->load_state(resumed);
  }

  // Global step `step`: this rank's share of samples [kWorld * kBatch * step, ...).
  void train_step() {
    std::vector<int64_t> idx;
    for (int i = 0; i < kBatch; ++i)
      idx.push_back((global_step * kWorld + pg_.rank()) * kBatch + i);
    const data::Batch b = data::make_batch(train_set(), idx, /*augment=*/true, config_.seed, 0);
    Tensor images({b.size, 3, 32, 32});
    std::memcpy(images.data(), b.images.data(), b.images.size() * sizeof(float));
    data_parallel.train_step(images, b.labels.data(), precision.loss_scale());
    if (precision.finish_step(model.grads(), model.num_params())) {
      optimizer.step(model.params(), model.grads(), model.num_params(), 0.05f, model.param_info());
      if (ema) ema->after_step(optimizer.step_count());
    }
    ++global_step;
  }

  std::vector<uint8_t> encode(const std::string& run_id, const CheckpointPosition& at) {
    const TrainingState state{model,       optimizer,   ema.get(), precision,
                              train_set(), global_step, 1.25,      0.375};
    return encode_training_state(config_, run_id, pg_.size(), state, at);
  }

  const TrainConfig& config_;
  comm::ProcessGroup& pg_;
  model::ResNet model;
  ddp::DataParallel data_parallel;
  optim::Optimizer optimizer;
  MixedPrecision precision;
  std::unique_ptr<optim::WeightEma> ema;
  int64_t global_step = 0;
};

uint32_t crc(const std::vector<uint8_t>& bytes) {
  return ckpt::checkpoint_crc32(bytes.data(), bytes.size());
}

// Rank 0 dies after a few steps and is replaced by a fresh process (another initialisation, no
// optimizer state, the initial loss scale); ranks 1 and 2 survive and rank 1, the lowest of
// them, sends. The replacement's state then serializes to the very bytes the survivors hold, and
// the next steps leave all three ranks bit for bit equal (on the CPU, same seeds). Without the
// load (or with any part of the state left behind) the checksums differ.
TEST(PeerState, ReplacementTakesTheLowestSurvivorsStateAndTrainsOnBitForBit) {
  kernels::cpu::set_num_threads(1);
  testing::TempDir dir;
  const TrainConfig config = small_config(dir.path());
  const std::string run_id = "20261129T030000Z-0123456789abcdef";
  const EpochTotals totals{12.5, 3, 24};
  std::vector<uint32_t> sent_crc(kWorld), state_crc(kWorld), next_crc(kWorld);
  std::vector<PeerStateResult> results(kWorld);
  std::vector<int64_t> steps(kWorld);
  run_ranks(kWorld, 60s, [&](int rank, GroupPtr& pg) {
    auto trainer = std::make_unique<RankTrainer>(config, *pg, 11);
    trainer->data_parallel.broadcast_state();
    trainer->start_ema({});
    for (int s = 0; s < 3; ++s) trainer->train_step();
    const CheckpointPosition at{0, trainer->global_step, 0, totals};
    if (rank == 0) {
      // The replacement: a new process knows nothing of the run.
      trainer = std::make_unique<RankTrainer>(config, *pg, 99);
      ResumeTargets targets{trainer->model, trainer->data_parallel, trainer->optimizer,
                            trainer->precision};
      std::optional<ResumePoint> point = resume_from_peer(config, *pg, train_set(), targets);
      ASSERT_TRUE(point.has_value());
      EXPECT_TRUE(point->resumed);
      EXPECT_EQ(point->checkpoint, "the training state of rank 1 (a live peer)");
      EXPECT_EQ(point->run_id, run_id);
      EXPECT_EQ(point->global_step, 3);
      EXPECT_EQ(point->inside_epoch.skip_steps, 3);  // the sampler goes on after step 3
      EXPECT_EQ(point->inside_epoch.totals.samples, 24);
      trainer->global_step = point->global_step;
      trainer->start_ema(point->ema);
      const CheckpointPosition resumed_at{point->epochs_done, point->inside_epoch.skip_steps,
                                          point->inside_epoch.seen, point->inside_epoch.totals};
      state_crc[rank] = crc(trainer->encode(run_id, resumed_at));
    } else {
      const std::vector<uint8_t> mine = trainer->encode(run_id, at);
      sent_crc[rank] = crc(mine);
      state_crc[rank] = sent_crc[rank];
      results[rank] = share_peer_state(*pg, /*has_state=*/true, [&] { return mine; }, {});
    }
    for (int s = 0; s < 2; ++s) trainer->train_step();
    steps[rank] = trainer->global_step;
    next_crc[rank] =
        crc(trainer->encode(run_id, CheckpointPosition{0, trainer->global_step, 0, totals}));
  });
  EXPECT_EQ(results[1].outcome, PeerStateOutcome::kKept) << results[1].error;
  EXPECT_EQ(results[2].outcome, PeerStateOutcome::kKept) << results[2].error;
  EXPECT_EQ(results[1].source, 1);
  EXPECT_EQ(results[1].checksum, sent_crc[1]);
  // Every survivor holds the same state (SyncBN: the same BN statistics too).
  EXPECT_EQ(sent_crc[1], sent_crc[2]);
  EXPECT_EQ(state_crc[0], sent_crc[1]) << "the replacement's state is not the survivors'";
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 5, 5}));
  EXPECT_EQ(next_crc[0], next_crc[1]) << "the replacement trained on differently";
  EXPECT_EQ(next_crc[1], next_crc[2]);
  EXPECT_NE(next_crc[1], sent_crc[1]);  // the next steps changed the state
}

// Nobody holds state (every rank is new: the whole job was restarted): every rank hears so, with
// nothing loaded, and resume() for replacements goes on to the checkpoint as before.
TEST(PeerState, NoRankHoldingStateMeansFallBack) {
  std::vector<PeerStateResult> results(kWorld);
  std::atomic<int> loads{0};
  run_ranks(kWorld, 60s, [&](int rank, GroupPtr& pg) {
    results[rank] = share_peer_state(*pg, /*has_state=*/false, {},
                                     [&](const std::vector<uint8_t>&, int) { ++loads; });
  });
  for (const auto& r : results) {
    EXPECT_EQ(r.outcome, PeerStateOutcome::kNoSurvivor) << r.error;
    EXPECT_EQ(r.source, -1);
    EXPECT_FALSE(r.loaded);
  }
  EXPECT_EQ(loads, 0);
}

TEST(PeerState, ReplacementsWithoutSurvivorsResumeFromTheDiskCheckpoint) {
  kernels::cpu::set_num_threads(1);
  testing::TempDir dir;
  const TrainConfig config = small_config(dir.path());
  const std::string run_id = "20261129T030000Z-fedcba9876543210";
  std::string written;
  std::vector<ResumePoint> points(2);
  run_ranks(2, 60s, [&](int rank, GroupPtr& pg) {
    RankTrainer trainer(config, *pg, 11);
    trainer.data_parallel.broadcast_state();
    trainer.start_ema({});
    trainer.train_step();
    if (rank == 0) {
      written = dir.file(ckpt::checkpoint_file_name(1));
      ckpt::write_checkpoint_bytes(written, trainer.encode(run_id, CheckpointPosition{1}),
                                   ckpt::Durability::kMemory);
    }
    pg->barrier();
    RankTrainer fresh(config, *pg, 99);
    points[rank] = resume(config, *pg, train_set(),
                          {fresh.model, fresh.data_parallel, fresh.optimizer, fresh.precision},
                          /*flash_dir=*/"", /*replacement=*/true);
  });
  for (const auto& p : points) {
    EXPECT_TRUE(p.resumed);
    EXPECT_EQ(p.checkpoint, written);
    EXPECT_EQ(p.epochs_done, 1);
    EXPECT_EQ(p.global_step, 1);
  }
  // Every rank knows the run (not only rank 0): any of them may later be the one a replacement
  // takes the state from, and each node's local rank 0 records it in its flash copies.
  EXPECT_EQ(points[0].run_id, run_id);
  EXPECT_EQ(points[1].run_id, run_id);
}

// A state of other settings (another --width here) is refused by the replacement before it
// changes anything, and every rank hears why.
TEST(PeerState, AStateOfOtherSettingsIsRefusedByTheReplacement) {
  kernels::cpu::set_num_threads(1);
  testing::TempDir dir;
  const TrainConfig config = small_config(dir.path());
  TrainConfig wider = config;
  wider.width = 8;
  std::vector<PeerStateResult> results(2);
  std::string error;
  std::vector<float> params_before, params_after;
  run_ranks(2, 60s, [&](int rank, GroupPtr& pg) {
    if (rank == 0) {
      RankTrainer survivor(wider, *pg, 11);
      const std::vector<uint8_t> mine = survivor.encode("run", CheckpointPosition{1});
      results[0] = share_peer_state(*pg, true, [&] { return mine; }, {});
      return;
    }
    RankTrainer fresh(config, *pg, 99);
    params_before = fresh.model.params_tensor().to_host();
    try {
      resume_from_peer(config, *pg, train_set(),
                       {fresh.model, fresh.data_parallel, fresh.optimizer, fresh.precision});
    } catch (const PeerStateError& e) {
      error = e.what();
    }
    params_after = fresh.model.params_tensor().to_host();
  });
  EXPECT_EQ(results[0].outcome, PeerStateOutcome::kFailed);
  EXPECT_FALSE(results[0].group_broken);
  EXPECT_NE(results[0].error.find("rank 1 refused the state from rank 0"), std::string::npos)
      << results[0].error;
  EXPECT_NE(error.find("--width is 8 in the checkpoint but 4 here"), std::string::npos) << error;
  EXPECT_EQ(params_before, params_after) << "a refused state must leave the model as it was";
}

// Survivors one step apart (a peer died inside a collective that only some of them completed):
// the lowest rank holding the newest version sends, and the survivor with the older version
// loads it like the replacement does; a survivor holding the newest keeps its own.
TEST(PeerState, TheNewestVersionWinsAndOlderSurvivorsReceiveIt) {
  const std::vector<int64_t> versions = {5, kNoState, 6, 6};
  std::vector<PeerStateResult> results(versions.size());
  std::vector<std::vector<uint8_t>> loaded(versions.size());
  run_ranks(static_cast<int>(versions.size()), 60s, [&](int rank, GroupPtr& pg) {
    results[rank] = share_newest_state(
        *pg, versions[rank], [&] { return random_bytes(1000, static_cast<uint32_t>(rank)); },
        [&, rank](const std::vector<uint8_t>& bytes, int) { loaded[rank] = bytes; });
  });
  for (size_t rank = 0; rank < versions.size(); ++rank) {
    EXPECT_EQ(results[rank].source, 2) << "rank " << rank;
    EXPECT_EQ(results[rank].version, 6) << "rank " << rank;
  }
  for (int rank : {0, 1}) {
    EXPECT_EQ(results[rank].outcome, PeerStateOutcome::kReceived) << results[rank].error;
    EXPECT_EQ(loaded[rank], random_bytes(1000, 2)) << "rank " << rank;
  }
  for (int rank : {2, 3}) {
    EXPECT_EQ(results[rank].outcome, PeerStateOutcome::kKept) << results[rank].error;
    EXPECT_TRUE(loaded[rank].empty());
  }
}

// Every rank holds the newest version (the survivors of a group that shrank, no new rank): the
// versions agree, nothing is serialized, sent or loaded.
TEST(PeerState, WhenEveryRankHoldsTheNewestNothingIsSent) {
  std::vector<PeerStateResult> results(3);
  std::atomic<int> serialized{0};
  run_ranks(3, 60s, [&](int rank, GroupPtr& pg) {
    results[rank] = share_newest_state(
        *pg, 9,
        [&] {
          ++serialized;
          return random_bytes(1000, 1);
        },
        [](const std::vector<uint8_t>&, int) { ADD_FAILURE() << "nothing is loaded"; });
  });
  EXPECT_EQ(serialized, 0);
  for (const PeerStateResult& r : results) {
    EXPECT_EQ(r.outcome, PeerStateOutcome::kKept) << r.error;
    EXPECT_EQ(r.source, 0);
    EXPECT_EQ(r.version, 9);
    EXPECT_EQ(r.bytes, 0u);
  }
}

// ---- failures of the exchange itself ------------------------------------------------------

constexpr size_t kStateBytes = 1 << 20;
constexpr size_t kChunk = 64 << 10;

struct SourceLeft {};  // thrown by the source's on_chunk: it stops sending

// The source's group closes after the first chunk (what the others see of a process that died:
// its sockets close). The other ranks, the survivor that kept its state and the replacement,
// both return "failed" naming the source and how far it got; the replacement loaded nothing.
TEST(PeerState, SourceLostHalfwayFailsTheOthersWithNothingLoaded) {
  std::vector<PeerStateResult> results(kWorld);
  std::atomic<int> loads{0};
  run_ranks(kWorld, 60s, [&](int rank, GroupPtr& pg) {
    PeerStateOptions options;
    options.chunk_bytes = kChunk;
    if (rank == 0) {
      options.on_chunk = [](uint64_t, uint64_t) { throw SourceLeft{}; };
      const std::vector<uint8_t> state = random_bytes(kStateBytes, 1);
      try {
        share_peer_state(
            *pg, true, [&] { return state; }, {}, options);
        ADD_FAILURE() << "on_chunk did not stop the source";
      } catch (const SourceLeft&) {
        pg.reset();  // closes its connections, as the death of its process would
      }
      return;
    }
    results[rank] = share_peer_state(
        *pg, /*has_state=*/rank == 1, [] { return random_bytes(kStateBytes, 2); },
        [&](const std::vector<uint8_t>&, int) { ++loads; }, options);
  });
  EXPECT_EQ(loads, 0) << "a receiver loaded part of a state";
  for (int rank : {1, 2}) {
    const PeerStateResult& r = results[rank];
    EXPECT_EQ(r.outcome, PeerStateOutcome::kFailed) << "rank " << rank;
    EXPECT_TRUE(r.group_broken) << "rank " << rank;
    EXPECT_FALSE(r.loaded);
    EXPECT_EQ(r.source, 0);
    EXPECT_EQ(r.bytes, kStateBytes);
    EXPECT_NE(r.error.find("the state's broadcast from rank 0 after"), std::string::npos)
        << r.error;
    EXPECT_NE(r.error.find("nothing was loaded"), std::string::npos) << r.error;
  }
}

// The same with a real death: the source is a process of its own that SIGKILLs itself after the
// first chunk (tests/worker/peer_state_rank.cc). The survivor and the replacement, processes too,
// return "failed" with nothing loaded, and exit normally: the failure is an answer, not a crash.
TEST(PeerState, SourceProcessKilledHalfwayFailsTheOthersWithNothingLoaded) {
  TcpStoreServer server(TcpStoreServerOptions{});
  const uint16_t port = server.start();
  testing::TempDir dir;
  const std::vector<std::string> roles = {"source-killed", "survivor", "replacement"};
  std::vector<std::unique_ptr<testing::Subprocess>> procs;
  for (int rank = 0; rank < kWorld; ++rank) {
    procs.push_back(std::make_unique<testing::Subprocess>(std::vector<std::string>{
        PEER_STATE_RANK_BINARY, std::to_string(port), std::to_string(rank), std::to_string(kWorld),
        roles[rank], dir.file("result." + std::to_string(rank))}));
  }
  std::vector<testing::ExitInfo> exits;
  for (auto& p : procs) {
    const std::optional<testing::ExitInfo> exit = p->wait(120s);
    ASSERT_TRUE(exit.has_value()) << "a rank did not finish: " << p->err();
    exits.push_back(*exit);
  }
  EXPECT_TRUE(exits[0].signaled && exits[0].code == SIGKILL) << procs[0]->err();
  for (int rank : {1, 2}) {
    ASSERT_EQ(exits[rank].shell_code(), 0) << procs[rank]->err();
    const nlohmann::json r =
        nlohmann::json::parse(testing::read_file(dir.file("result." + std::to_string(rank))));
    EXPECT_EQ(r["outcome"], "failed") << r.dump();
    EXPECT_EQ(r["group_broken"], true) << r.dump();
    EXPECT_EQ(r["loaded"], false);
    EXPECT_EQ(r["loads"], 0) << "rank " << rank << " loaded part of a state";
    EXPECT_EQ(r["source"], 0);
    EXPECT_NE(r["error"].get<std::string>().find("the state's broadcast from rank 0 after 65536 "
                                                 "of 1048576 bytes"),
              std::string::npos)
        << r.dump();
  }
}

// The source hangs after the first chunk (a SIGSTOP, a stuck device): the others give up after
// the collective timeout with "failed" and nothing loaded. The source is released afterwards.
TEST(PeerState, SourceHungHalfwayFailsTheOthersAfterTheCollectiveTimeout) {
  std::vector<PeerStateResult> results(kWorld);
  std::atomic<int> loads{0};
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  run_ranks(kWorld, 2s, [&](int rank, GroupPtr& pg) {
    PeerStateOptions options;
    options.chunk_bytes = kChunk;
    if (rank == 0) {
      options.on_chunk = [&](uint64_t, uint64_t) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return finished == kWorld - 1; });
        throw SourceLeft{};
      };
      const std::vector<uint8_t> state = random_bytes(kStateBytes, 1);
      try {
        share_peer_state(
            *pg, true, [&] { return state; }, {}, options);
      } catch (const SourceLeft&) {
        pg.reset();
      }
      return;
    }
    // Released whatever this rank's exchange does (a throw included), so the test cannot hang.
    struct Release {
      std::mutex& mu;
      std::condition_variable& cv;
      int& finished;
      ~Release() {
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
        cv.notify_all();
      }
    } release{mu, cv, finished};
    results[rank] = share_peer_state(
        *pg, /*has_state=*/false, {}, [&](const std::vector<uint8_t>&, int) { ++loads; }, options);
  });
  EXPECT_EQ(loads, 0);
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].outcome, PeerStateOutcome::kFailed) << "rank " << rank;
    EXPECT_TRUE(results[rank].group_broken);
    EXPECT_NE(results[rank].error.find("collective timeout"), std::string::npos)
        << results[rank].error;
  }
}

// A group that flips one byte of the `nth` broadcast this rank receives (a fault on the way: a
// fake for the corruption only, over the real group).
class CorruptingGroup : public comm::ProcessGroup {
 public:
  CorruptingGroup(comm::ProcessGroup& inner, int nth) : inner_(inner), nth_(nth) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  void allreduce(float* data, size_t count, comm::ReduceOp op) override {
    inner_.allreduce(data, count, op);
  }
  void allreduce(double* data, size_t count, comm::ReduceOp op) override {
    inner_.allreduce(data, count, op);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    inner_.broadcast(data, bytes, root);
    if (root != rank() && ++received_ == nth_ && bytes > 0) {
      static_cast<uint8_t*>(data)[bytes / 2] ^= 0x10;
    }
  }
  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine) override {
    return inner_.allgather(mine);
  }
  void barrier() override { inner_.barrier(); }
  std::shared_ptr<comm::Work> allreduce_async(float* data, size_t count,
                                              comm::ReduceOp op) override {
    return inner_.allreduce_async(data, count, op);
  }

 private:
  comm::ProcessGroup& inner_;
  int nth_;
  int received_ = 0;
};

// A byte flipped on its way to rank 2 (the third broadcast it receives: header, chunk 1, chunk
// 2): rank 2 finds another CRC-32 and loads nothing, and every rank returns "failed" saying
// what was expected and found. The group is still in step: the exchange then succeeds.
TEST(PeerState, CorruptBytesFailTheChecksumOnEveryRankAndLoadNothing) {
  const std::vector<uint8_t> state = random_bytes(kStateBytes, 3);
  const uint32_t expected = crc(state);
  std::vector<PeerStateResult> results(kWorld), retried(kWorld);
  std::vector<std::vector<uint8_t>> loaded(kWorld);
  run_ranks(kWorld, 60s, [&](int rank, GroupPtr& pg) {
    PeerStateOptions options;
    options.chunk_bytes = kChunk;
    CorruptingGroup corrupting(*pg, rank == 2 ? 3 : -1);
    auto load = [&, rank](const std::vector<uint8_t>& bytes, int) { loaded[rank] = bytes; };
    results[rank] = share_peer_state(
        corrupting, rank == 0, [&] { return state; }, load, options);
    retried[rank] = share_peer_state(
        *pg, rank == 0, [&] { return state; }, load, options);
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    const PeerStateResult& r = results[rank];
    EXPECT_EQ(r.outcome, PeerStateOutcome::kFailed) << "rank " << rank;
    EXPECT_FALSE(r.group_broken);
    EXPECT_EQ(r.checksum, expected);
    EXPECT_NE(r.error.find(fmt::format("rank 2: the state from rank 0 failed its checksum: "
                                       "expected CRC-32 {:08x} over {} bytes, found ",
                                       expected, kStateBytes)),
              std::string::npos)
        << r.error;
    EXPECT_NE(r.error.find("nothing was loaded"), std::string::npos) << r.error;
  }
  EXPECT_FALSE(results[2].loaded);
  // Rank 1 got whole bytes and loaded them; it says so though the exchange failed.
  EXPECT_TRUE(results[1].loaded);
  EXPECT_EQ(retried[0].outcome, PeerStateOutcome::kKept) << retried[0].error;
  for (int rank : {1, 2}) {
    EXPECT_EQ(retried[rank].outcome, PeerStateOutcome::kReceived) << retried[rank].error;
    EXPECT_EQ(loaded[rank], state) << "rank " << rank;
  }
}

// A source that cannot serialize its state says why to every rank; nothing is sent.
TEST(PeerState, ASourceThatCannotSerializeFailsEveryRankWithItsReason) {
  std::vector<PeerStateResult> results(2);
  run_ranks(2, 60s, [&](int rank, GroupPtr& pg) {
    results[rank] = share_peer_state(
        *pg, rank == 0,
        []() -> std::vector<uint8_t> { throw SystemError("out of memory for the state"); },
        [](const std::vector<uint8_t>&, int) { ADD_FAILURE() << "nothing was sent"; });
  });
  for (const auto& r : results) {
    EXPECT_EQ(r.outcome, PeerStateOutcome::kFailed);
    EXPECT_FALSE(r.group_broken);
    EXPECT_NE(r.error.find("rank 0 holds the training state but could not serialize it: out of "
                           "memory for the state"),
              std::string::npos)
        << r.error;
  }
}

}  // namespace
}  // namespace dlaunch::train
