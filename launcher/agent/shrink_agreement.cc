#include "launcher/agent/shrink_agreement.h"

#include <fmt/format.h>

#include "rendezvous/store/store.h"

namespace dlaunch {
namespace {

constexpr char kShrink[] = "shrink";
constexpr char kRestart[] = "restart";

std::string kept_before(int64_t old_round) {
  return fmt::format("shrink/after_round_{}/kept", old_round);
}

}  // namespace

void mark_kept_workers(Store& job_store, int64_t old_round) {
  job_store.add(kept_before(old_round), 1);
}

bool agree_to_shrink(Store& job_store, int64_t old_round, int64_t round, int64_t nodes,
                     Duration timeout) {
  const std::string verdict_key = fmt::format("shrink/round_{}/verdict", round);
  const int64_t members_kept = job_store.add(fmt::format("shrink/round_{}/kept", round), 1);
  if (members_kept == nodes) {
    const bool none_missing = job_store.add(kept_before(old_round), 0) == nodes;
    job_store.compare_set(verdict_key, Bytes(), to_bytes(none_missing ? kShrink : kRestart));
  } else {
    try {
      job_store.wait({verdict_key}, timeout);
    } catch (const TimeoutError&) {
      job_store.compare_set(verdict_key, Bytes(), to_bytes(kRestart));
    }
  }
  return to_string(job_store.get(verdict_key)) == kShrink;
}

}  // namespace dlaunch
