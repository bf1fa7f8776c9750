// --log_fold: what the console shows when many ranks print the same thing. Identical whole
// lines from different ranks of one stream go out once, with the ranks folded into the prefix:
// "[default0-7]:epoch 3 done".
//
// Lines wait in a queue of folds. A rank's line joins the first fold with the same text that
// lies after the rank's own previous line; else it starts a new fold right there, after its
// previous line. So each rank's lines keep their order, a line that differs is not folded, and
// the ranks' identical lines after it still can be ("[default0-7]:done" after eight different
// "loss" lines). With time stamps shown, a new fold goes last instead: the console then stays
// in time order (a fold shows its first line's time), at the cost of fewer folds when ranks
// run apart. The queue's head goes out when every rank shown on the stream is in it, and
// heads go out while any fold has waited as long as a partial line would (the caller's timer)
// since its latest line, or kMaxWait since its first: a fold that ranks still join keeps
// waiting for the others (ranks tens of milliseconds apart fold into one line), and no line
// waits much longer than that. Anything of the stream that is not a
// whole line (a '\r' update, a tail shown without its '\n') first empties the queue, so it never
// overtakes a line; the end of the last rank's stream empties it too. The log files never see any
// of this (log_router.h).
//
// Pure: no I/O, time is passed in. Shared by the ConsoleLines of one stream, on the agent's loop.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"

namespace dlaunch {

// "[default0-3,5]:" for the local ranks {0, 1, 2, 3, 5} of role "default" (sorted, unique).
std::string folded_prefix(const std::string& role, std::vector<int64_t> ranks);

class ConsoleFold {
 public:
  // `ranks_shown`: how many ranks print to this stream (a fold of all of them is complete).
  ConsoleFold(std::string role, size_t ranks_shown) : role_(std::move(role)), shown_(ranks_shown) {}

  // A whole line from `rank` (without prefix and '\n'). `stamp`: what goes before the prefix
  // (--log_timestamps), kept from the first line of a fold.
  void line(int64_t rank, std::string_view text, std::string_view stamp, TimePoint now,
            std::string& out);
  // Something else of this stream goes out next: everything held goes first.
  void flush(std::string& out);
  // A rank's stream ended (the worker exited): after the last one, everything held goes out.
  void finish_rank(std::string& out);
  // The folds at the head that are complete, or while any fold is due: it waited `min_age`
  // since its latest line, or kMaxWait since its first.
  void flush_due(TimePoint now, Duration min_age, std::string& out);
  // When the wait of the fold due first began (it is due `min_age` later); nullopt when none
  // is held.
  std::optional<TimePoint> pending_since(Duration min_age = Duration::zero()) const;

  // More folds than this held: the head goes out (bounds memory and the delay).
  static constexpr size_t kMaxHeld = 256;
  // The longest a fold that ranks keep joining waits.
  static constexpr Duration kMaxWait = std::chrono::seconds(1);

 private:
  struct Fold {
    std::string text;
    std::string stamp;
    std::vector<int64_t> ranks;
    TimePoint since{};   // its first line
    TimePoint latest{};  // its latest line
    uint64_t id = 0;
  };
  void emit_head(std::string& out);
  // When `f`'s wait of `min_age` began: its latest line, or earlier for one that grew long.
  static TimePoint wait_began(const Fold& f, Duration min_age);

  std::string role_;
  size_t shown_;
  std::deque<Fold> held_;
  size_t finished_ = 0;
  uint64_t next_id_ = 0;
  std::map<int64_t, uint64_t> last_;  // rank -> id of the fold of its previous line
};

}  // namespace dlaunch
