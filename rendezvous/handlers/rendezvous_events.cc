#include "rendezvous/handlers/rendezvous_events.h"

#include "common/error.h"
#include "common/log.h"

namespace dlaunch {

namespace {
char kind_char(RendezvousEvent::Kind k) {
  switch (k) {
    case RendezvousEvent::Kind::kRestartRequested: return 'R';
    case RendezvousEvent::Kind::kMembershipChanged: return 'M';
    case RendezvousEvent::Kind::kShutdownRequested: return 'S';
    case RendezvousEvent::Kind::kStoreLost: return '?';  // local only, never published
  }
  return '?';
}
}  // namespace

Bytes encode_event(const EventRecord& e) {
  return to_bytes(std::string(1, kind_char(e.kind)) + "|" + e.origin + "|" + e.reason);
}

std::optional<EventRecord> decode_event(const Bytes& value) {
  std::string s = to_string(value);
  if (s.size() < 2 || s[1] != '|') return std::nullopt;
  size_t bar = s.find('|', 2);
  if (bar == std::string::npos) return std::nullopt;
  EventRecord e;
  switch (s[0]) {
    case 'R': e.kind = RendezvousEvent::Kind::kRestartRequested; break;
    case 'M': e.kind = RendezvousEvent::Kind::kMembershipChanged; break;
    case 'S': e.kind = RendezvousEvent::Kind::kShutdownRequested; break;
    default: return std::nullopt;
  }
  e.origin = s.substr(2, bar - 2);
  e.reason = s.substr(bar + 1);
  return e;
}

std::string event_key(const std::string& prefix, int64_t round) {
  return prefix + "/round/" + std::to_string(round) + "/event";
}

bool publish_event(Store& store, const std::string& prefix, int64_t round, const EventRecord& e) {
  Bytes mine = encode_event(e);
  return store.compare_set(event_key(prefix, round), Bytes(), mine) == mine;
}

EventWatcher::EventWatcher(std::function<std::shared_ptr<Store>()> open_store, std::string prefix,
                           std::string self_id, Duration slice)
    : open_store_(std::move(open_store)),
      prefix_(std::move(prefix)),
      self_(std::move(self_id)),
      slice_(slice) {}

EventWatcher::~EventWatcher() { stop(); }

void EventWatcher::prepare() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_ || thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void EventWatcher::watch(int64_t round, std::function<void(const RendezvousEvent&)> on_event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    round_ = round;
    on_event_ = std::move(on_event);
    armed_ = true;
    ++generation_;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  changed_.notify_all();
}

void EventWatcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (!thread_.joinable()) return;
  // The thread may be blocked in a store wait: end that call now instead of at the slice's
  // end. Repeat until the thread is out, since an interrupt that lands just before it enters
  // its next call finds no call to end (and then the call sees stopping_ only afterwards).
  std::unique_lock<std::mutex> lock(mutex_);
  while (!exited_) {
    std::shared_ptr<Store> client = watched_store_;
    if (client) {
      lock.unlock();
      client->interrupt();
      lock.lock();
    }
    changed_.wait_for(lock, std::chrono::milliseconds(10), [&] { return exited_; });
  }
  lock.unlock();
  thread_.join();
}

void EventWatcher::run() {
  run_loop();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_ = true;
    watched_store_.reset();
  }
  changed_.notify_all();
}

bool EventWatcher::open(std::shared_ptr<Store>& store) {
  store = open_store_();
  std::lock_guard<std::mutex> lock(mutex_);
  watched_store_ = store;
  return !stopping_;
}

void EventWatcher::run_loop() {
  std::shared_ptr<Store> store;
  // Connected before the first watch() (prepare()): with N agents released by one round, N
  // connects there would compete with their spawns. A failure here is not reported: the
  // watcher tries again when armed, and says so then.
  try {
    if (!open(store)) return;
    store->connect();  // a lazy client would connect at the first wait, after the round
  } catch (const StoreInterruptedError&) {
    // stop() ended the connect; the loop sees stopping_ (a dropped client connects again).
  } catch (const Error&) {
    std::lock_guard<std::mutex> lock(mutex_);
    watched_store_.reset();
    store.reset();
  }
  // A store outage is reported by the keep-alive (once, and once more when it is back); here
  // one retry per slice would add a warning per second per agent.
  bool failing = false;
  while (true) {
    int64_t round;
    uint64_t generation;
    std::function<void(const RendezvousEvent&)> callback;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || armed_; });
      if (stopping_) return;
      round = round_;
      generation = generation_;
      callback = on_event_;
    }
    std::optional<EventRecord> event;
    try {
      if (!store && !open(store)) return;
      std::string key = event_key(prefix_, round);
      store->wait({key}, slice_);
      event = decode_event(store->get(key));
      failing = false;
    } catch (const TimeoutError&) {
      failing = false;
      continue;
    } catch (const StoreInterruptedError&) {
      continue;  // stop() ended the call; the loop sees stopping_
    } catch (const Error& e) {
      if (!failing) log_info("rendezvous event watcher: {}; retrying", e.what());
      failing = true;
      store.reset();
      std::unique_lock<std::mutex> lock(mutex_);
      watched_store_.reset();
      changed_.wait_for(lock, slice_, [&] { return stopping_; });
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation != generation_) continue;  // re-armed meanwhile: look at the new round
      armed_ = false;                           // one event per round
    }
    // A node that asked for a restart knows already; membership and shutdown events also go to
    // the node that published them (its keep-alive thread found the dead peer).
    bool own_restart = event && event->origin == self_ &&
                       event->kind == RendezvousEvent::Kind::kRestartRequested;
    if (event && !own_restart && callback) {
      callback(RendezvousEvent{event->kind, event->reason});
    }
  }
}

}  // namespace dlaunch
