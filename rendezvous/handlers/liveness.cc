#include "rendezvous/handlers/liveness.h"

#include <fmt/format.h>

#include <optional>

namespace dlaunch {
namespace {

// A counter as WAIT_GET returns it: ASCII decimal (as ADD stores it), or missing (0, as ADD
// counts a missing key).
int64_t counter_value(const std::optional<Bytes>& value, const std::string& key) {
  if (!value) return 0;
  const std::string text = to_string(*value);
  size_t used = 0;
  try {
    int64_t n = std::stoll(text, &used);
    if (used == text.size()) return n;
  } catch (const std::exception&) {
  }
  throw ProtocolError(fmt::format(
      "the store's key '{}' holds '{}', expected a counter (a decimal integer): something "
      "other than dlaunch's keep-alive wrote it",
      key, text.substr(0, 40)));
}

class StoreLiveness final : public Liveness {
 public:
  StoreLiveness(std::shared_ptr<Store> store, std::string prefix, std::string self_id,
                Duration window, const Clock& clock)
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        self_(std::move(self_id)),
        window_(window),
        clock_(clock) {}

  void beat() override { store_->add(prefix_ + "/hb/" + self_, 1); }

  std::vector<std::string> dead(const std::vector<std::string>& node_ids) override {
    return absent(node_ids, false);
  }

  std::vector<std::string> gone(const std::vector<std::string>& node_ids) override {
    return absent(node_ids, true);
  }

  // A clean exit: the will first, so that closing the connection adds nothing, then the mark.
  void leave() override {
    if (wills_) store_->clear_will();
    store_->set(prefix_ + "/left/" + self_, to_bytes("1"));
  }

  void restart_windows() override { seen_.clear(); }

  void use_connection_wills(Duration grace) override {
    grace_ = grace;
    wills_ = store_->set_will(prefix_ + "/closed/" + self_);
    // Counted after the will is in place: a watcher that sees a close matched by as many new
    // connections knows this node came back, whichever of its beats it saw first.
    if (wills_) store_->add(prefix_ + "/opened/" + self_, 1);
  }

  bool found_by_connection_end(const std::string& id) const override {
    return ended_.count(id) > 0;
  }

 private:
  struct Counters {
    int64_t beats = 0, closed = 0, opened = 0;
  };
  // The node's counters: one WAIT_GET for all three when this store has wills (the heartbeat
  // first: it exists once the node beat, so the request is answered at once; for a node that
  // never beat, after its 1 ms), else the heartbeat alone.
  Counters read(const std::string& id) {
    Counters c;
    const std::string hb = prefix_ + "/hb/" + id;
    if (!wills_) {
      // add(0) reads the counter without blocking, creating it at 0 for a node that never beat.
      c.beats = store_->add(hb, 0);
      return c;
    }
    const std::vector<std::string> keys{hb, prefix_ + "/closed/" + id, prefix_ + "/opened/" + id};
    auto r = store_->wait_get(keys, std::chrono::milliseconds(1));
    c.beats = counter_value(r.values.at(0), keys[0]);
    c.closed = counter_value(r.values.at(1), keys[1]);
    c.opened = counter_value(r.values.at(2), keys[2]);
    return c;
  }

  // The nodes silent for the window, or whose connection ended and that did not come back
  // within the grace; those that left cleanly too when `left_counts`.
  std::vector<std::string> absent(const std::vector<std::string>& node_ids, bool left_counts) {
    std::vector<std::string> result;
    ended_.clear();
    for (const auto& id : node_ids) {
      if (id == self_) continue;
      if (left_counts && has_left(id)) {
        result.push_back(id);
        continue;
      }
      // Silence is proven only between answers: from the answer that first showed this count
      // to the asking of this read. A read can take as long as this node's own link is down (a
      // request waiting out TCP's retransmissions); that time is this node's silence, not the
      // neighbour's, whose beats in it simply could not be seen.
      auto asked_at = clock_.now();
      Counters now = read(id);
      auto answered_at = clock_.now();
      auto it = seen_.find(id);
      if (it == seen_.end()) {
        Seen first{now, answered_at, false, {}};
        // No earlier look to compare with (the first of a round): a node whose every counted
        // connection ended already (killed before this look) is taken as ended from this
        // answer. A node that counts none (an older agent, or one still registering) is not.
        if (now.opened > 0 && now.closed >= now.opened) {
          first.ended = true;
          first.ended_seen_at = answered_at;
        }
        seen_[id] = first;
        continue;
      }
      Seen& s = it->second;
      // More ends of its connection than new connections since the last look: it did not come
      // back (yet). A node that reconnected re-registered its will and counted the connection
      // (after the will, so never fewer than the ends it answers), whatever the order in which
      // this look saw its beats.
      if (now.closed - s.counters.closed > now.opened - s.counters.opened) {
        if (!s.ended) {
          s.ended = true;
          s.ended_seen_at = answered_at;
        }
      } else if (now.opened != s.counters.opened || now.beats != s.counters.beats) {
        s.ended = false;  // it is back, or it beat after the end was seen
      }
      const bool beat = now.beats != s.counters.beats;
      s.counters = now;
      if (beat) {
        s.changed_at = answered_at;
        if (!s.ended) continue;
      }
      const bool ended_long_enough = s.ended && asked_at - s.ended_seen_at >= grace_;
      const bool silent_long_enough = asked_at - s.changed_at >= window_;
      if (!ended_long_enough && !silent_long_enough) continue;
      // (With left_counts, has_left(id) was false just now.)
      if (!left_counts && has_left(id)) continue;
      result.push_back(id);
      if (ended_long_enough) ended_.insert(id);
    }
    return result;
  }
  bool has_left(const std::string& id) { return store_->check({prefix_ + "/left/" + id}); }

  struct Seen {
    Counters counters;
    TimePoint changed_at;  // when the answer that first showed `counters.beats` came
    // Its connection ended and it has not come back since: from the answer that showed it.
    bool ended = false;
    TimePoint ended_seen_at{};
  };
  std::shared_ptr<Store> store_;
  std::string prefix_, self_;
  Duration window_;
  const Clock& clock_;
  // use_connection_wills(): this store carries wills out, and how long a node whose connection
  // ended has to come back.
  bool wills_ = false;
  Duration grace_{};
  std::unordered_map<std::string, Seen> seen_;
  std::unordered_set<std::string> ended_;  // the last look's dead by their connection's end
};

}  // namespace

std::unique_ptr<Liveness> make_store_liveness(std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              const std::string& self_id, Duration window,
                                              const Clock& clock) {
  return std::make_unique<StoreLiveness>(std::move(store), prefix, self_id, window, clock);
}

}  // namespace dlaunch
