// State from a live peer: a rank that joins a running job (the replacement of a failed rank) takes
// the training state from a rank that survived, by broadcast over the job's process group, instead
// of reading a checkpoint. In data-parallel training every survivor holds the state of the
// current step, so no file is needed while one is left.
//
//   every rank:   allgather of the version of the state it holds (8 bytes each: a number that
//                 grows as training goes on, dtrain's global step; negative: none)
//                   nobody holds it -> kNoSurvivor on every rank: the caller falls back (the
//                   flash copy, then the disk checkpoint)
//                   everybody holds the newest (the survivors of a shrink, no new rank) ->
//                   kKept on every rank, nothing serialized or sent
//   source:       the lowest rank holding the newest version serializes its state; every rank
//                 with an older version (or none) receives it
//                 (survivors of a peer's death can be one step apart when the peer died inside
//                 a collective that some of them completed: the ones behind catch up here)
//   source -> all: header (status, length, CRC-32, chunk size), then the bytes in chunks
//   receivers:    CRC-32 of what arrived == the header's ? load(bytes) : nothing loaded
//   every rank:   allgather of each rank's outcome, so that all return the same verdict
//
//   outcome per rank:  kReceived  (held nothing or an older version, loaded the source's state)
//                      kKept      (held the newest version: the source, or another survivor)
//                      kNoSurvivor (nobody held it)
//                      kFailed    (see group_broken)
//
// The checksum is the checkpoint format's CRC-32 (checkpoint.h), over the whole serialized state
// (itself a checkpoint with CRCs of its own when the caller uses encode_checkpoint, as dtrain
// does): the broadcast's check does not depend on what the bytes are.
//
// Receivers load only complete bytes whose checksum matched: a peer lost halfway, a source that
// could not serialize or a checksum mismatch leave the receiver's state as it was. `load` itself
// must check everything before it changes anything (dtrain's decodes and checks the checkpoint,
// then copies).
//
// Blocking: every rank of `pg` must call share_peer_state at the same point (it is a sequence of
// collectives); it returns when the exchange ended. Each collective gives up after the group's
// timeout (dtrain's --collective_timeout), so a source that dies or hangs mid-broadcast makes the
// others return kFailed within about that time (at once when its sockets close). Never throws
// for a failed exchange (kFailed says what happened); exceptions from `serialize` and `load` are
// reported as kFailed too, except those not derived from std::exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/comm/process_group.h"

namespace dlaunch::train {

enum class PeerStateOutcome { kReceived, kKept, kNoSurvivor, kFailed };
const char* peer_state_outcome_name(PeerStateOutcome outcome);

struct PeerStateResult {
  PeerStateOutcome outcome = PeerStateOutcome::kFailed;
  int source = -1;        // the rank that sent the state (-1: none)
  int64_t version = -1;   // the version it sent (the newest held; -1: none)
  uint64_t bytes = 0;     // the state's size, as the source announced it
  uint32_t checksum = 0;  // its CRC-32, as the source announced it
  // This rank loaded the source's state (complete and checked). Also possible with kFailed when
  // another rank complained afterwards: the state loaded here is whole either way.
  bool loaded = false;
  // kFailed: what was expected and what was found, naming the ranks.
  std::string error;
  // kFailed because a collective failed (a peer died or hung past the timeout): the group is
  // unusable and must be re-formed. false after a checksum mismatch, a failed serialize or load
  // (every rank agreed on the verdict; the group can be used again, e.g. to retry).
  bool group_broken = false;
};

struct PeerStateOptions {
  // The bytes go in broadcasts of at most this many bytes (the source's value is used by all).
  size_t chunk_bytes = size_t{16} << 20;
  // Called on every rank after each chunk went through: bytes done so far, bytes in all. For
  // progress logs, and for tests that stop the source halfway; may throw to abandon the exchange
  // (the exception propagates; the group is then out of step and must not be used again).
  std::function<void(uint64_t done, uint64_t total)> on_chunk;
};

// Called on the source only: the state as bytes.
using SerializeState = std::function<std::vector<uint8_t>()>;
// Called on ranks without the newest state, with bytes that passed the checksum, and the
// source's rank.
// Throws to refuse them (reported as kFailed; it must not have changed anything then).
using LoadState = std::function<void(const std::vector<uint8_t>& bytes, int source)>;

// Every rank of `pg`, collectively. `version`: the version of the training state this rank
// holds (kNoState: none, a replacement). `serialize` may be empty on ranks without state, `load`
// on a rank sure to hold the newest.
inline constexpr int64_t kNoState = -1;
PeerStateResult share_newest_state(comm::ProcessGroup& pg, int64_t version,
                                   const SerializeState& serialize, const LoadState& load,
                                   const PeerStateOptions& options = {});

// share_newest_state where every rank holding state holds the same (`has_state`: version 0).
inline PeerStateResult share_peer_state(comm::ProcessGroup& pg, bool has_state,
                                        const SerializeState& serialize, const LoadState& load,
                                        const PeerStateOptions& options = {}) {
  return share_newest_state(pg, has_state ? 0 : kNoState, serialize, load, options);
}

// A replacement rank could not take the state from a live peer (dtrain exits with it, so that the
// job is restarted from the flash or disk checkpoint).
class PeerStateError : public Error {
 public:
  using Error::Error;
};

}  // namespace dlaunch::train
