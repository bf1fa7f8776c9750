// Training checkpoints: one self-checking file per epoch (and one at a preemption stop inside an
// epoch), written atomically by rank 0. Each records the run that wrote it (meta "run_id") so
// that two runs sharing an --output_dir never prune or resume each other's files.
//
// File layout (little-endian):
//   0   char[8]  magic "DTRAINCK"
//   8   u32      format version (kCheckpointVersion)
//   12  u32      0 (reserved)
//   16  u64      payload size in bytes
//   24  u32      CRC-32 (zlib) of the payload
//   28  u32      CRC-32 of bytes 0..27 (the header itself)
//   32  payload: u32 meta length, meta (JSON text), u32 array count, then per array
//                u32 name length, name, u64 element count, count float32 values
// The header CRC catches a damaged size field before we trust it; the payload CRC catches
// everything else (truncation, bit rot, a half-written file from an older writer).
//
// Atomicity: write_checkpoint() writes "<path>.tmp.<pid>" in the same directory, fsyncs it,
// renames it over <path> and fsyncs the directory, so a reader sees the old file or the new one,
// never a mix, even across a crash or power loss.
//
// Errors: write_checkpoint throws SystemError (disk full, permissions); read_checkpoint throws
// CheckpointError naming the file and what is wrong with it. Both block on disk I/O.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace dlaunch::ckpt {

inline constexpr char kCheckpointMagic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
inline constexpr uint32_t kCheckpointVersion = 1;

class CheckpointError : public Error {
 public:
  using Error::Error;
};

struct Checkpoint {
  nlohmann::json meta = nlohmann::json::object();  // epoch, step, config, sampler, rng, ...
  std::vector<std::pair<std::string, std::vector<float>>> arrays;  // params, buffers, optimizer

  // nullptr when absent.
  const std::vector<float>* find(const std::string& name) const;
  void add(std::string name, std::vector<float> values) {
    arrays.emplace_back(std::move(name), std::move(values));
  }
};

std::vector<uint8_t> encode_checkpoint(const Checkpoint& ckpt);
// The CRC-32 (zlib's) the format checks its header and payload with; also what a state sent
// from a live peer is checked with (worker/train/peer_state.h).
uint32_t checkpoint_crc32(const uint8_t* data, size_t n);
// `source` names the file in error messages.
Checkpoint decode_checkpoint(const std::vector<uint8_t>& bytes, const std::string& source);

void write_checkpoint(const std::string& path, const Checkpoint& ckpt);
// kFsync: as write_checkpoint (survives a crash of the host). kMemory: the same temporary file
// and rename (a reader never sees a torn file) without the fsyncs, for a memory file system
// where they buy nothing (the flash directory, flash_checkpoint.h).
enum class Durability { kFsync, kMemory };
void write_checkpoint_bytes(const std::string& path, const std::vector<uint8_t>& bytes,
                            Durability durability);
Checkpoint read_checkpoint(const std::string& path);

// "checkpoint_epoch_0007.dtck": the state after 7 complete epochs.
std::string checkpoint_file_name(int64_t epoch);
// "checkpoint_epoch_0007_step_00000123.dtck": a stop inside epoch 8 (a preemption), 7 complete
// epochs and 123 optimizer steps in all. It sorts after epoch 7's file and before epoch 8's.
std::string partial_checkpoint_file_name(int64_t epochs_done, int64_t global_step);
// Checkpoint files in `dir`, newest first (by the numbers in the names: epochs, then a partial
// epoch's step). A `dir` that does not exist holds none. Names whose numbers do not fit in int64
// are skipped with a warning. Throws CheckpointError naming `dir` and the OS error when it exists
// but cannot be read (a silent empty list would make --resume auto start from scratch and
// overwrite the run).
std::vector<std::string> list_checkpoints(const std::string& dir);

// Deletes "<checkpoint name>.tmp.<pid>" files in `dir` left by a writer that died mid-write
// (every pid but a live dtrain process other than this one). Returns the paths removed; failures
// are logged, never thrown (a directory that cannot be read is list_checkpoints' to report).
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

// Throws CheckpointError naming `source` and the array when one of `expected` (name, element
// count) is missing from `ckpt` or has another size.
void require_arrays(const Checkpoint& ckpt, const std::string& source,
                    const std::vector<std::pair<std::string, size_t>>& expected);

struct LoadedCheckpoint {
  std::string path;
  Checkpoint ckpt;
};
// The newest checkpoint in `dir` that reads back valid; corrupt ones are skipped with a warning
// naming the file and the reason. nullopt when there is none (or `dir` does not exist). Throws
// CheckpointError when `dir` cannot be read (see list_checkpoints).
std::optional<LoadedCheckpoint> load_latest_valid(const std::string& dir);

// One checkpoint file as found on disk: valid (its metadata read back) or not (the reason).
struct CheckpointFile {
  std::string path;
  bool valid = false;
  std::string error;                             // why it is not valid
  nlohmann::json meta = nlohmann::json::object();  // when valid
  // The run that wrote it (meta "run_id"); empty when unknown (corrupt, or written by a dtrain
  // older than run identities).
  std::string run_id() const;
};
// Every checkpoint in `dir`, newest first, each read in full and checked. Throws CheckpointError
// when `dir` cannot be read (see list_checkpoints).
std::vector<CheckpointFile> scan_checkpoints(const std::string& dir);

// Keeps the newest `keep` valid checkpoints of run `run_id` in `dir` and deletes that run's
// older ones. Another run's checkpoints are never touched, and corrupt files take no retention
// slot (they are left alone: nothing proves whose they are). Best effort: failures, including a
// directory it cannot read, are logged.
void prune_checkpoints(const std::string& dir, size_t keep, const std::string& run_id);

// A new run identity: "<UTC time>-<16 hex digits of randomness>", e.g. 20261123T110600Z-9f...
std::string new_run_id();

}  // namespace dlaunch::ckpt
