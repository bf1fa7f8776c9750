// --hang_timeout auto: the hang timeout learned from the workers' own pace. The agent reads each
// heartbeat file's time on every check and records the gap between two successive beats it saw
// (the time is the worker's own beat time; a check slower than the beats only merges gaps, so
// the figure errs long, the safe side). Once the group has shown enough gaps, a worker is hung
// when silent longer than max(floor, factor x the longest gap seen in this group so far); before
// that the start-up timeout applies. An evaluation or a checkpoint write that does not beat
// raises the figure for the rest of the generation. Two kinds of gap are counted but not learned:
//   - a worker's first `worker_gaps` gaps (its first steps after loading, or a replacement's
//     join): the start-up timeout covers them, and one slow first step would otherwise make
//     every later hang cost factor x that step;
//   - once the timeout is learned, a gap longer than half of it: the agent already suspected
//     that silence (hang_investigation.h reads the stacks of workers silent that long). The
//     ranks that wait in a collective for a rank stuck on another node show such a gap when that
//     node replaces it; learned, every hang would raise the timeout for the next one.
//
// The same idea as NVIDIA's resiliency extension (nvidia-resiliency-ext, fault_tolerance:
// RankMonitorClient.calculate_and_set_hb_timeouts sets rank_heartbeat_timeout to safety_factor
// (default 5.0) x the longest heartbeat interval observed, initial_rank_heartbeat_timeout covering
// the start): here it is learned while the job runs, per generation, with no checkpointed state.
//
// Pure bookkeeping, time passed in; the agent's HangWatch (launcher/agent/agent_hangs.h) drives it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/clock.h"

namespace dlaunch {

struct HangPaceParams {
  // Until the pace is known: as a fixed --hang_timeout, from the worker's first beat. The agent
  // passes --hang_timeout auto's (LaunchConfig::kHangAutoStartup when the flag gives none).
  Duration startup = std::chrono::seconds(300);
  // The learned timeout is never shorter: a worker is not hung for missing a few short beats.
  Duration floor = std::chrono::seconds(1);
  double factor = 5;  // nvidia-resiliency-ext's safety_factor
  // Gaps the whole group must have shown before any learned timeout applies.
  int64_t group_gaps = 20;
  // Gaps a worker must have shown itself: a replacement (rank recovery) starts fresh, and its
  // first beats span its join and first steps, whose length the group has not seen.
  int64_t worker_gaps = 3;
  // A check later than this after the previous one (the agent's loop was busy) may have missed
  // beats: the gap it sees spans several, so it is counted but not learned. The agent checks
  // every 100 ms.
  Duration late_check = std::chrono::milliseconds(250);
};

class HangPace {
 public:
  explicit HangPace(HangPaceParams params = {}) : params_(params) {}

  // `worker`'s last beat as read at `now` (nullopt: it never beat). A new `pid` under the same
  // key is a replacement: its own count starts over (the group's longest gap stays). True when
  // the group's longest gap grew.
  bool observe(int64_t worker, int pid, std::optional<TimePoint> beat, TimePoint now);
  // The workers were stopped (SIGTSTP), or waited for a replaced rank, and go on: the time until
  // each one's next beat is no gap of theirs, and the next `worker_gaps` gaps are not learned
  // either (the first steps with a replacement wait for its first steps). The timeouts stay.
  void skip_current_gaps();

  struct Timeout {
    Duration value{0};
    bool learned = false;       // false: the start-up timeout
    Duration longest_gap{0};    // the group's so far
    int64_t group_gaps = 0;     // gaps seen in the group
    int64_t worker_gaps = 0;    // gaps seen of this worker
  };
  Timeout timeout(int64_t worker) const;
  // Why `t`, for logs and reports: "--hang_timeout auto: 5 x the longest gap seen, 0.26 s".
  std::string describe(const Timeout& t) const;
  const HangPaceParams& params() const { return params_; }

 private:
  struct Worker {
    int pid = -1;
    std::optional<TimePoint> last;
    int64_t gaps = 0;
    int64_t unlearned = 0;  // gaps still to count without learning them
    std::optional<TimePoint> checked;  // the previous observe()
  };
  HangPaceParams params_;
  std::map<int64_t, Worker> workers_;
  Duration longest_{0};
  int64_t gaps_ = 0;
};

}  // namespace dlaunch
