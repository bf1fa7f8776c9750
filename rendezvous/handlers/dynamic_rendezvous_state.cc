#include "rendezvous/handlers/dynamic_rendezvous_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "common/error.h"

namespace dlaunch {

Bytes DynamicState::encode() const {
  const char* s = status == Status::kOpen ? "open" : status == Status::kComplete ? "complete"
                                                                                  : "closed";
  return to_bytes("v1 round=" + std::to_string(round) + " status=" + s +
                  " n=" + std::to_string(participants));
}

std::optional<DynamicState> DynamicState::decode(const Bytes& value) {
  if (value.empty()) return std::nullopt;
  std::string text = to_string(value);
  std::istringstream in(text);
  std::string version, round, status, n;
  in >> version >> round >> status >> n;
  DynamicState s;
  try {
    if (version != "v1" || round.rfind("round=", 0) != 0 || status.rfind("status=", 0) != 0 ||
        n.rfind("n=", 0) != 0) {
      throw std::invalid_argument("fields");
    }
    s.round = std::stoll(round.substr(6));
    s.participants = std::stoll(n.substr(2));
    std::string st = status.substr(7);
    if (st == "open") {
      s.status = Status::kOpen;
    } else if (st == "complete") {
      s.status = Status::kComplete;
    } else if (st == "closed") {
      s.status = Status::kClosed;
    } else {
      throw std::invalid_argument("status");
    }
  } catch (const std::exception&) {
    throw ProtocolError(fmt::format(
        "dynamic rendezvous: malformed state record '{}'; is another program using this "
        "store's rendezvous keys?",
        text));
  }
  return s;
}

const char* join_step_name(JoinStep s) {
  switch (s) {
    case JoinStep::kCreate: return "create";
    case JoinStep::kJoin: return "join";
    case JoinStep::kComplete: return "complete";
    case JoinStep::kOpenNext: return "open-next";
    case JoinStep::kDone: return "done";
    case JoinStep::kWaitNextRound: return "wait-next-round";
    case JoinStep::kWait: return "wait";
    case JoinStep::kClosed: return "closed";
  }
  return "?";
}

JoinDecision decide_join(const std::optional<DynamicState>& state, const DynamicNodeView& v,
                         const DynamicLimits& limits, TimePoint now) {
  JoinDecision d;
  if (!state) {
    d.step = JoinStep::kCreate;
    d.next = DynamicState{0, DynamicState::Status::kOpen, 0};
    return d;
  }
  const DynamicState& s = *state;
  switch (s.status) {
    case DynamicState::Status::kClosed:
      d.step = JoinStep::kClosed;
      return d;
    case DynamicState::Status::kOpen: {
      if (v.joined_round != s.round) {
        d.step = JoinStep::kJoin;
        return d;
      }
      if (v.arrivals >= limits.max_nodes) {
        d.step = JoinStep::kComplete;
        d.participants = limits.max_nodes;
      } else if (v.arrivals >= limits.min_nodes &&
                 (now - v.arrivals_changed_at >= limits.last_call_timeout ||
                  (v.expected_arrivals > 0 && v.arrivals >= v.expected_arrivals))) {
        d.step = JoinStep::kComplete;
        d.participants = v.arrivals;
      } else {
        d.step = JoinStep::kWait;
        d.wake_at = v.arrivals >= limits.min_nodes
                        ? v.arrivals_changed_at + limits.last_call_timeout
                        : TimePoint::max();
        return d;
      }
      d.next = DynamicState{s.round, DynamicState::Status::kComplete, d.participants};
      return d;
    }
    case DynamicState::Status::kComplete: {
      bool joined_this = v.joined_round == s.round;
      if (joined_this && v.arrival_index <= s.participants) {
        if (s.round > v.last_round) {
          d.step = JoinStep::kDone;
          return d;
        }
        // This node ran round r and comes back (membership change or restart): open r+1.
        d.step = JoinStep::kOpenNext;
      } else if (joined_this) {
        // Arrived too late for r. Normally a running node opens r+1 once told; if the whole
        // running group is gone, nobody will, so do it.
        if (!v.running_round_dead) {
          d.step = JoinStep::kWaitNextRound;
          return d;
        }
        d.step = JoinStep::kOpenNext;
      } else {
        d.step = JoinStep::kJoin;  // counts as waiting for r+1 (arrival index > n)
        return d;
      }
      d.next = DynamicState{s.round + 1, DynamicState::Status::kOpen, 0};
      return d;
    }
  }
  return d;
}

Bytes NodeDescriptor::encode() const {
  // "id|host|local_world_size|hint[,previous][;version]" (no ",previous" when there is none, no
  // ";version" when empty). The version goes last, after ';': an older agent parses the numbers
  // with stoll, which stops at the ';', so it reads this form as before.
  return to_bytes(id + "|" + host + "|" + std::to_string(local_world_size) + "|" +
                  std::to_string(rank_hint) +
                  (previous_rank >= 0 ? "," + std::to_string(previous_rank) : "") +
                  (version.empty() ? "" : ";" + version));
}

NodeDescriptor NodeDescriptor::decode(const Bytes& value) {
  std::string s = to_string(value);
  NodeDescriptor d;
  size_t a = s.find('|');
  size_t c = s.rfind('|');
  size_t b = c == std::string::npos || c == 0 ? std::string::npos : s.rfind('|', c - 1);
  if (a == std::string::npos || b == std::string::npos || a >= b) {
    throw ProtocolError(fmt::format("dynamic rendezvous: malformed node descriptor '{}'", s));
  }
  d.id = s.substr(0, a);
  d.host = s.substr(a + 1, b - a - 1);
  try {
    d.local_world_size = std::stoll(s.substr(b + 1, c - b - 1));
    std::string ranks = s.substr(c + 1);
    size_t semicolon = ranks.find(';');
    if (semicolon != std::string::npos) {
      d.version = ranks.substr(semicolon + 1);
      ranks = ranks.substr(0, semicolon);
    }
    size_t comma = ranks.find(',');
    d.rank_hint = std::stoll(ranks.substr(0, comma));
    if (comma != std::string::npos) d.previous_rank = std::stoll(ranks.substr(comma + 1));
  } catch (const std::exception&) {
    throw ProtocolError(fmt::format("dynamic rendezvous: malformed node descriptor '{}'", s));
  }
  return d;
}

std::vector<size_t> assign_ranks(const std::vector<NodeDescriptor>& arrivals) {
  const size_t n = arrivals.size();
  std::vector<size_t> by_rank(n, n);
  std::vector<bool> placed(n, false);
  for (size_t i = 0; i < n; ++i) {
    int64_t h = arrivals[i].rank_hint;
    if (h >= 0 && static_cast<size_t>(h) < n && by_rank[h] == n) {
      by_rank[h] = i;
      placed[i] = true;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    int64_t p = arrivals[i].previous_rank;
    if (!placed[i] && p >= 0 && static_cast<size_t>(p) < n && by_rank[p] == n) {
      by_rank[p] = i;
      placed[i] = true;
    }
  }
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    if (placed[i]) continue;
    while (by_rank[next] != n) ++next;
    by_rank[next] = i;
  }
  return by_rank;
}

std::vector<int64_t> watched_ranks(int64_t my_rank, int64_t n) {
  std::vector<int64_t> out;
  if (n <= 1) return out;
  int64_t next = (my_rank + 1) % n;
  int64_t prev = (my_rank + n - 1) % n;
  out.push_back(next);
  if (prev != next) out.push_back(prev);
  return out;
}

}  // namespace dlaunch
