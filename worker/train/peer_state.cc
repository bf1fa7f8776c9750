#include "worker/train/peer_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "common/byte_order.h"
#include "common/log.h"
#include "worker/checkpoint/checkpoint.h"

namespace dlaunch::train {

namespace {

using Clock = std::chrono::steady_clock;

// The header the source broadcasts before the bytes: four little-endian u64.
constexpr size_t kHeaderBytes = 32;
constexpr uint64_t kStatusOk = 0;
constexpr uint64_t kStatusSerializeFailed = 1;  // `length` is then the error message's

// A collective of the exchange failed: the group is unusable.
struct CollectiveFailed {
  std::string message;
};

// Runs one collective; its failure (a peer died, or the timeout passed) becomes CollectiveFailed
// saying what the exchange was doing. Nothing else is caught: a test's on_chunk may throw.
template <typename Fn>
void collective(const std::string& doing, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    throw CollectiveFailed{fmt::format("{}: {}", doing, e.what())};
  }
}

struct Header {
  uint64_t status = kStatusOk;
  uint64_t length = 0;
  uint64_t checksum = 0;
  uint64_t chunk_bytes = 0;
};

Header broadcast_header(comm::ProcessGroup& pg, int source, const Header& mine) {
  uint8_t raw[kHeaderBytes];
  store_le<uint64_t>(raw, mine.status);
  store_le<uint64_t>(raw + 8, mine.length);
  store_le<uint64_t>(raw + 16, mine.checksum);
  store_le<uint64_t>(raw + 24, mine.chunk_bytes);
  collective(fmt::format("receiving the state's header from rank {}", source),
             [&] { pg.broadcast(raw, sizeof raw, source); });
  return {load_le<uint64_t>(raw), load_le<uint64_t>(raw + 8), load_le<uint64_t>(raw + 16),
          load_le<uint64_t>(raw + 24)};
}

// Every rank's verdict ("" when it has no complaint), joined; "" when nobody complained.
std::string agree_on_verdicts(comm::ProcessGroup& pg, const std::string& mine) {
  std::vector<std::vector<uint8_t>> all;
  collective("agreeing on the outcome",
             [&] { all = pg.allgather(std::vector<uint8_t>(mine.begin(), mine.end())); });
  std::string joined;
  for (const auto& v : all) {
    if (v.empty()) continue;
    joined += (joined.empty() ? "" : "; ") + std::string(v.begin(), v.end());
  }
  return joined;
}

double ms_since(Clock::time_point t) {
  return 1e3 * std::chrono::duration<double>(Clock::now() - t).count();
}

// The lowest rank holding the newest version, and that version; {-1, kNoState} when no rank
// holds any.
// The source (the lowest rank holding the newest version; -1: none), that version, and whether
// any rank holds an older one (or none) and so needs the bytes.
struct Source {
  int rank = -1;
  int64_t version = kNoState;
  bool someone_behind = false;
};

Source find_source(comm::ProcessGroup& pg, int64_t version) {
  std::vector<uint8_t> mine(8);
  store_le<uint64_t>(mine.data(), static_cast<uint64_t>(version < 0 ? kNoState : version));
  std::vector<std::vector<uint8_t>> all;
  collective("asking which ranks hold the training state", [&] { all = pg.allgather(mine); });
  Source best;
  std::vector<int64_t> versions;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto v = all[r].size() == 8 ? static_cast<int64_t>(load_le<uint64_t>(all[r].data()))
                                      : kNoState;
    versions.push_back(v);
    if (v > best.version) {
      best.rank = r;
      best.version = v;
    }
  }
  for (int64_t v : versions) best.someone_behind = best.someone_behind || v < best.version;
  return best;
}

// The source's header and bytes: the serialized state, or the error message that stopped it.
Header serialize_for_peers(int rank, const SerializeState& serialize,
                           const PeerStateOptions& options, std::vector<uint8_t>& payload) {
  std::string failure;
  try {
    DL_CHECK(serialize) << "rank " << rank << " holds the state but has no serialize";
    payload = serialize();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  Header mine;
  mine.chunk_bytes = std::max<size_t>(options.chunk_bytes, 1);
  if (failure.empty()) {
    mine.length = payload.size();
    mine.checksum = ckpt::checkpoint_crc32(payload.data(), payload.size());
  } else {
    mine.status = kStatusSerializeFailed;
    payload.assign(failure.begin(), failure.end());
    mine.length = payload.size();
  }
  return mine;
}

// The bytes, chunk by chunk, into `payload` (sender and receivers) or a scratch chunk (a rank
// that holds the state itself: the bytes must go through every rank, but it keeps its own).
// `done` counts the bytes through, for the message of a failure halfway.
void broadcast_state(comm::ProcessGroup& pg, const Header& header, int source, bool into_payload,
                     std::vector<uint8_t>& payload, uint64_t& done,
                     const PeerStateOptions& options) {
  std::vector<uint8_t> scratch;
  if (!into_payload) scratch.resize(std::min<uint64_t>(header.chunk_bytes, header.length));
  while (done < header.length) {
    const uint64_t n = std::min<uint64_t>(header.chunk_bytes, header.length - done);
    uint8_t* at = into_payload ? payload.data() + done : scratch.data();
    collective(fmt::format("the state's broadcast from rank {} after {} of {} bytes", source, done,
                           header.length),
               [&] { pg.broadcast(at, n, source); });
    done += n;
    if (options.on_chunk) options.on_chunk(done, header.length);
  }
}

// A receiver's check of the bytes, then its load: "" when both passed, else its complaint.
std::string check_and_load(int rank, int source, const std::vector<uint8_t>& payload,
                           uint32_t checksum, const LoadState& load, bool& loaded) {
  const uint32_t found = ckpt::checkpoint_crc32(payload.data(), payload.size());
  if (found != checksum) {
    return fmt::format(
        "rank {}: the state from rank {} failed its checksum: expected CRC-32 {:08x} over {} "
        "bytes, found {:08x}; nothing was loaded",
        rank, source, checksum, payload.size(), found);
  }
  try {
    DL_CHECK(load) << "rank " << rank << " takes the state but has no load";
    load(payload, source);
    loaded = true;
  } catch (const std::exception& e) {
    return fmt::format("rank {} refused the state from rank {}: {}", rank, source, e.what());
  }
  return "";
}

}  // namespace

const char* peer_state_outcome_name(PeerStateOutcome outcome) {
  switch (outcome) {
    case PeerStateOutcome::kReceived:
      return "received";
    case PeerStateOutcome::kKept:
      return "kept";
    case PeerStateOutcome::kNoSurvivor:
      return "no survivor";
    case PeerStateOutcome::kFailed:
      return "failed";
  }
  return "?";
}

PeerStateResult share_newest_state(comm::ProcessGroup& pg, int64_t version,
                                   const SerializeState& serialize, const LoadState& load,
                                   const PeerStateOptions& options) {
  const int rank = pg.rank();
  const Clock::time_point t0 = Clock::now();
  PeerStateResult result;
  uint64_t done = 0;
  try {
    const Source found = find_source(pg, version);
    result.source = found.rank;
    result.version = found.version;
    if (result.source < 0) {
      result.outcome = PeerStateOutcome::kNoSurvivor;
      return result;
    }
    // Every rank holds the newest version (the survivors of a shrink): nothing to send.
    if (!found.someone_behind) {
      result.outcome = PeerStateOutcome::kKept;
      return result;
    }
    const int source = result.source;
    const bool sending = rank == source;
    std::vector<uint8_t> payload;
    const Header mine = sending ? serialize_for_peers(rank, serialize, options, payload) : Header{};
    const Header header = broadcast_header(pg, source, mine);
    result.bytes = header.length;
    result.checksum = static_cast<uint32_t>(header.checksum);
    if (header.status == kStatusSerializeFailed) {
      std::string message(header.length, '\0');
      if (sending) message.assign(payload.begin(), payload.end());
      if (!message.empty()) {
        collective(fmt::format("receiving rank {}'s serialization error", source),
                   [&] { pg.broadcast(message.data(), message.size(), source); });
      }
      result.error = fmt::format(
          "rank {} holds the training state but could not serialize it: {}; nothing was sent "
          "or loaded",
          source, message);
      return result;
    }
    const bool receiving = version < result.version;
    if (receiving) payload.assign(header.length, 0);
    broadcast_state(pg, header, source, sending || receiving, payload, done, options);
    // A complaint from any rank fails the exchange for all.
    const std::string complaint =
        receiving ? check_and_load(rank, source, payload, result.checksum, load, result.loaded)
                  : "";
    const std::string verdict = agree_on_verdicts(pg, complaint);
    if (!verdict.empty()) {
      result.error = verdict;
      return result;
    }
    result.outcome = receiving ? PeerStateOutcome::kReceived : PeerStateOutcome::kKept;
    if (receiving) {
      log_info("took the training state from rank {}: {} bytes in {:.0f} ms (CRC-32 {:08x})",
               source, header.length, ms_since(t0), result.checksum);
    } else if (sending) {
      log_debug("sent the training state to the ranks without it: {} bytes in {:.0f} ms",
                header.length, ms_since(t0));
    }
    return result;
  } catch (const CollectiveFailed& e) {
    result.outcome = PeerStateOutcome::kFailed;
    result.group_broken = true;
    result.error =
        fmt::format("rank {}: {} ({}); the group must be re-formed", rank, e.message,
                    result.loaded ? "this rank had loaded the complete, checked state before"
                                  : "nothing was loaded");
    return result;
  }
}

}  // namespace dlaunch::train
