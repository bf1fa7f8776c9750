#include "rendezvous/handlers/liveness.h"

namespace dlaunch {
namespace {

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

  void leave() override { store_->set(prefix_ + "/left/" + self_, to_bytes("1")); }

  void restart_windows() override { seen_.clear(); }

 private:
  // The nodes silent for the window; those that left cleanly too when `left_counts`.
  std::vector<std::string> absent(const std::vector<std::string>& node_ids, bool left_counts) {
    std::vector<std::string> result;
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
      // add(0) reads the counter without blocking, creating it at 0 for a node that never beat.
      int64_t count = store_->add(prefix_ + "/hb/" + id, 0);
      auto it = seen_.find(id);
      if (it == seen_.end() || it->second.count != count) {
        seen_[id] = {count, clock_.now()};
        continue;
      }
      // (With left_counts, has_left(id) was false just now.)
      if (asked_at - it->second.changed_at >= window_ && (left_counts || !has_left(id))) {
        result.push_back(id);
      }
    }
    return result;
  }
  bool has_left(const std::string& id) { return store_->check({prefix_ + "/left/" + id}); }

  struct Seen {
    int64_t count;
    TimePoint changed_at;  // when the answer that first showed `count` came
  };
  std::shared_ptr<Store> store_;
  std::string prefix_, self_;
  Duration window_;
  const Clock& clock_;
  std::unordered_map<std::string, Seen> seen_;
};

}  // namespace

std::unique_ptr<Liveness> make_store_liveness(std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              const std::string& self_id, Duration window,
                                              const Clock& clock) {
  return std::make_unique<StoreLiveness>(std::move(store), prefix, self_id, window, clock);
}

}  // namespace dlaunch
