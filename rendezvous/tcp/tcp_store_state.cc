#include "rendezvous/tcp/tcp_store_state.h"

#include <algorithm>
#include <optional>

#include "common/error.h"
#include "rendezvous/tcp/worker_namespace.h"

namespace dlaunch {

using wire::Op;
using wire::Request;

// ---- the requests -------------------------------------------------------------------------

// The reply to a change goes before what the change itself appended to the same session since
// `at` (its own pending WAIT answered, its watch event), as PyTorch's server (1.13, and 2.x's
// classic backend) sends the reply first: a 1.13 client whose wait on a counter timed out then
// reads ADD's value, and the late STOP_WAITING after it.
template <typename Put>
void TcpStoreState::put_reply_first(Bytes& out, size_t at, Put put) {
  if (out.size() == at) return put(out);
  Bytes reply;
  put(reply);
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), reply.begin(), reply.end());
}

// A flat switch over the op set: one case per op, read top to bottom.
TcpStoreState::Handled TcpStoreState::handle(StoreSession& s, Request& q, std::string& error) {
  // WILL's empty key clears the will: it names no key to scope.
  if (!q.keys.empty() && !(q.op == Op::kWill && q.keys[0].empty())) scope_keys(s, q);
  Bytes& reply = s.out;
  switch (q.op) {
    case Op::kValidate:
      error = "VALIDATE after the first message";
      return Handled::kBadRequest;
    case Op::kPing:
      wire::put_u32(reply, q.u32);
      break;
    case Op::kSet:
      // The request's buffer goes into the table; the table's old buffer comes back to the
      // reused request, to be filled by the next decode.
      table_.exchange(q.keys[0], q.values[0]);
      return Handled::kQuiet;
    case Op::kCompareSet: {
      const size_t at = reply.size();
      auto&& now = table_.compare_set(q.keys[0], q.values[0], q.values[1]);
      put_reply_first(reply, at, [&](Bytes& b) { wire::put_bytes(b, now); });
      break;
    }
    case Op::kWaitGet:
      if (q.keys.empty()) {
        error = "WAIT_GET without keys (the first is the one to wait for)";
        return Handled::kBadRequest;
      }
      [[fallthrough]];
    case Op::kGet:
    case Op::kMultiGet:
      if (wait_if_missing(s, q, /*pending_wait=*/false)) return Handled::kQuiet;
      answer_ready(s, q);
      break;
    case Op::kWait:
      // As PyTorch's servers do, the session goes on while its WAIT is pending. A WAIT that
      // must wait replaces an older pending one (a client whose wait timed out waits again):
      // one STOP_WAITING comes for the keys of the latest.
      if (s.pending_wait_.active && !all_exist(q.keys)) forget(s, /*pending_wait=*/true);
      if (wait_if_missing(s, q, /*pending_wait=*/true)) return Handled::kQuiet;
      answer_ready(s, q);
      break;
    case Op::kAdd: {
      const size_t at = reply.size();
      int64_t value = 0;
      try {
        value = table_.add(q.keys[0], q.delta);
      } catch (const Error& e) {
        error = std::string("ADD: ") + e.what();
        return Handled::kBadRequest;
      }
      put_reply_first(reply, at, [&](Bytes& b) { wire::put_i64(b, value); });
      break;
    }
    case Op::kCheck:
      wire::put_u8(reply, all_exist(q.keys) ? wire::kCheckReady : wire::kCheckNotReady);
      break;
    case Op::kNumKeys:
      wire::put_i64(reply, static_cast<int64_t>(table_.size()));
      break;
    case Op::kWatchKey:
      watchers_[q.keys[0]].push_back(s.weak_from_this());
      wire::put_u8(reply, wire::kWatchCallbackRegistered);
      break;
    case Op::kDeleteKey:
      wire::put_i64(reply, table_.erase(q.keys[0]) ? 1 : 0);
      break;
    case Op::kAppend:
      table_.append(q.keys[0], q.values[0]);
      return Handled::kQuiet;
    case Op::kMultiSet:
      for (size_t i = 0; i < q.keys.size(); ++i) table_.exchange(q.keys[i], q.values[i]);
      return Handled::kQuiet;
    case Op::kCancelWait:
      cancel_wait(s);
      break;
    case Op::kQueuePush:
      queues_[q.keys[0]].push_back(std::move(q.values[0]));
      wake_one(q.keys[0]);
      return Handled::kQuiet;
    case Op::kQueuePop:
      queue_pop(s, q.keys[0]);
      break;
    case Op::kQueueLen: {
      auto it = queues_.find(q.keys[0]);
      wire::put_i64(reply, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case Op::kListKeys:
      list_keys(s);
      break;
    case Op::kBarrier:
      return barrier(s, q, error);
    case Op::kDeletePrefix:
      // dlaunch's extension: clears a finished generation's keys (e.g. PyTorch's
      // "/worker/attempt_N/...") before the next one starts.
      wire::put_i64(reply, table_.erase_prefix(q.keys[0]));
      break;
    case Op::kDeclareAgent:
      s.agent_ = true;
      wire::put_u8(reply, 0);
      break;
    case Op::kFeatures:
      wire::put_u32(reply, wire::kServerFeatures);
      break;
    case Op::kWill:
      if (q.keys[0].empty()) {
        clear_will(s);
      } else {
        set_will(s, q.keys[0]);
      }
      wire::put_u8(reply, 0);
      break;
    case Op::kAuthBegin:
    case Op::kAuthProof:
    case Op::kDeclareRun:
    case Op::kChannels:
      // The connection's business; never passed here.
      return Handled::kQuiet;
  }
  return Handled::kReplied;
}

void TcpStoreState::queue_pop(StoreSession& s, const std::string& key) {
  auto& queue = queues_[key];
  wire::put_i64(s.out, static_cast<int64_t>(queue.size()));
  if (!queue.empty()) {
    wire::put_bytes(s.out, queue.front());
    queue.pop_front();
  }
  if (queue.empty()) queues_.erase(key);
}

// The keys in the table (not the queues, as PyTorch's server), in the session's namespace with
// the namespace taken off; sorted, so that the answer does not depend on the hash table.
void TcpStoreState::list_keys(StoreSession& s) {
  Request none;
  scope_keys(s, none);  // a worker's namespace is fixed by its first look at the keys
  std::vector<std::string> keys;
  table_.for_each_key([&](const std::string& key) {
    if (key.compare(0, s.scope_.size(), s.scope_) == 0) keys.push_back(key.substr(s.scope_.size()));
  });
  std::sort(keys.begin(), keys.end());
  wire::put_i64(s.out, static_cast<int64_t>(keys.size()));
  for (const auto& key : keys) wire::put_string(s.out, key);
}

// PyTorch 2.x's BARRIER: adds 1 to the key's counter; when the count reaches the world size
// the request names, answers STOP_WAITING at once, else waits (pending, as a WAIT) until
// a change brings the counter there. Every waiter whose world size the count now reaches is
// answered by that change, after the change's own reply. A key that holds no counter is a bad
// request, as for ADD.
TcpStoreState::Handled TcpStoreState::barrier(StoreSession& s, Request& q, std::string& error) {
  const std::string& key = q.keys[0];
  const size_t at = s.out.size();
  int64_t count = 0;
  try {
    count = table_.add(key, 1);
  } catch (const Error& e) {
    error = std::string("BARRIER: ") + e.what();
    return Handled::kBadRequest;
  }
  if (count >= q.delta) {
    put_reply_first(s.out, at, [](Bytes& b) { wire::put_u8(b, wire::kStopWaiting); });
    return Handled::kReplied;
  }
  if (s.pending_wait_.active) forget(s, /*pending_wait=*/true);
  barrier_waiters_[key].push_back(s.shared_from_this());
  s.pending_wait_.active = true;
  s.pending_wait_.awaiting = 1;
  s.pending_wait_.request = q;
  return Handled::kQuiet;
}

// The key's value changed to `count`: answers the BARRIERs waiting on it whose world size
// that reaches. A value that is no counter answers none.
void TcpStoreState::release_barrier_waiters(const std::string& key, const Bytes& count) {
  auto it = barrier_waiters_.find(key);
  if (it == barrier_waiters_.end()) return;
  int64_t now = 0;
  try {
    now = parse_counter(count, key);
  } catch (const Error&) {
    return;
  }
  std::vector<SessionPtr> released;
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const SessionPtr& w) {
                              const auto& waiting = w->pending_wait_;
                              bool stale = w->closed || !waiting.active ||
                                           waiting.request.op != Op::kBarrier ||
                                           waiting.request.keys[0] != key;
                              bool reached = !stale && now >= waiting.request.delta;
                              if (reached) released.push_back(w);
                              return stale || reached;
                            }),
             list.end());
  if (list.empty()) barrier_waiters_.erase(it);
  for (auto& w : released) {
    w->pending_wait_ = StoreSession::Waiting();
    wire::put_u8(w->out, wire::kStopWaiting);
    w->replied();
  }
}

// The namespace of the session's keys: none for an agent's; a worker's is fixed at its first
// key operation.
const std::string& TcpStoreState::scope_of(StoreSession& s) {
  static const std::string kNone;
  if (s.agent_) return kNone;
  if (!s.scope_known_) {
    s.scope_known_ = true;
    if (const Bytes* ns = table_.find(kWorkerNamespaceKey)) s.scope_.assign(ns->begin(), ns->end());
  }
  return s.scope_;
}

void TcpStoreState::scope_keys(StoreSession& s, Request& q) {
  const std::string& scope = scope_of(s);
  if (scope.empty()) return;
  for (auto& key : q.keys) key.insert(0, scope);
}

// Why combining is exact: the requests were all received before this runs and none is answered
// yet, and nothing else runs in between (one thread), so taking them one after the other now is
// a valid order. A GET, MULTI_GET or WAIT of keys that all exist changes nothing, so each
// answer is the same as the first's; a CHECK changes nothing whatever it finds. An ADD to an
// existing counter with no watcher and no barrier on it wakes
// no one (waiters wait only for missing keys), so one ADD of the sum leaves the table, and every
// other session, as the sequence would; each session gets the value its own ADD would have
// returned in the sequence (the counter before, plus the deltas up to and including its own).
bool TcpStoreState::handle_group(const std::vector<StoreSession*>& sessions,
                                 const std::vector<Request>& requests) {
  if (sessions.empty() || sessions.size() != requests.size()) return false;
  const Request& first = requests[0];
  const bool one_key = first.op == Op::kGet || first.op == Op::kAdd;
  const bool any_keys = first.op == Op::kWait || first.op == Op::kMultiGet || first.op == Op::kCheck;
  if (!one_key && !any_keys) return false;
  if (first.keys.empty() || (one_key && first.keys.size() != 1)) return false;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (sessions[i]->closed || sessions[i]->parked()) return false;
    if (requests[i].op != first.op || requests[i].keys != first.keys) return false;
  }
  // Fixing a worker's namespace here is what its own first key operation would do now.
  const std::string scope = scope_of(*sessions[0]);
  for (StoreSession* s : sessions) {
    if (scope_of(*s) != scope) return false;
  }
  std::vector<std::string> keys;
  keys.reserve(first.keys.size());
  for (const auto& key : first.keys) keys.push_back(scope + key);
  switch (first.op) {
    case Op::kGet:
    case Op::kMultiGet: {
      // A missing key would make the member wait: that is the one-by-one path's.
      Bytes reply;
      for (const auto& key : keys) {
        const Bytes* value = table_.find(key);
        if (!value) return false;
        wire::put_bytes(reply, *value);
      }
      for (StoreSession* s : sessions) s->out.insert(s->out.end(), reply.begin(), reply.end());
      return true;
    }
    case Op::kCheck: {
      const uint8_t ready = all_exist(keys) ? wire::kCheckReady : wire::kCheckNotReady;
      for (StoreSession* s : sessions) wire::put_u8(s->out, ready);
      return true;
    }
    case Op::kWait:
      if (!all_exist(keys)) return false;
      for (StoreSession* s : sessions) wire::put_u8(s->out, wire::kStopWaiting);
      return true;
    case Op::kAdd: {
      const std::string& key = keys[0];
      const Bytes* current = table_.find(key);
      if (!current || watchers_.count(key) > 0 || barrier_waiters_.count(key) > 0) return false;
      int64_t value = 0, total = 0;
      try {
        value = parse_counter(*current, key);
      } catch (const Error&) {
        return false;  // each ADD then fails as it would alone
      }
      std::vector<int64_t> values;
      values.reserve(requests.size());
      for (const Request& q : requests) {
        if (__builtin_add_overflow(value, q.delta, &value) ||
            __builtin_add_overflow(total, q.delta, &total)) {
          return false;
        }
        values.push_back(value);
      }
      table_.add(key, total);
      for (size_t i = 0; i < sessions.size(); ++i) wire::put_i64(sessions[i]->out, values[i]);
      return true;
    }
    default:
      return false;
  }
}

bool TcpStoreState::exists(const std::string& key) const {
  if (table_.contains(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool TcpStoreState::all_exist(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!exists(k)) return false;
  }
  return true;
}

// ---- watchers -----------------------------------------------------------------------------

bool TcpStoreState::wants_old_value(const std::string& key) const {
  return !watchers_.empty() && watchers_.count(key) > 0;
}

void TcpStoreState::changed(const std::string& key, bool created, const Bytes* old,
                            const Bytes& now) {
  if (old) {
    notify_watchers(key, created ? wire::kWatchKeyCreated : wire::kWatchKeyUpdated, *old, now);
  }
  wake_all(key);
  if (!barrier_waiters_.empty()) release_barrier_waiters(key, now);
}

void TcpStoreState::erased(const std::string& key, const Bytes& old) {
  if (!watchers_.empty()) notify_watchers(key, wire::kWatchKeyDeleted, old, Bytes());
}

void TcpStoreState::notify_watchers(const std::string& key, uint8_t kind, const Bytes& old_value,
                                    const Bytes& new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  auto& list = it->second;
  for (auto w = list.begin(); w != list.end();) {
    auto s = w->lock();
    if (!s || s->closed) {
      w = list.erase(w);
      continue;
    }
    Bytes& msg = s->out;
    wire::put_u8(msg, kind);
    wire::put_string(msg, key);
    wire::put_bytes(msg, old_value);
    wire::put_bytes(msg, new_value);
    s->replied();
    ++w;
  }
  if (list.empty()) watchers_.erase(it);
}

// ---- waiters ------------------------------------------------------------------------------

// Wakes every waiter on `key` (a set, add, compare_set or append created or changed it).
void TcpStoreState::wake_all(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<Waiter> woken = std::move(it->second);
  waiters_.erase(it);
  for (auto& w : woken) {
    StoreSession::Waiting& waiting = w.waiting();
    if (w.session->closed || !waiting.active) continue;
    if (waiting.awaiting > 0) --waiting.awaiting;
    if (waiting.awaiting == 0) try_complete(*w.session, w.pending_wait);
  }
}

// A QUEUE_PUSH on `key`: as PyTorch 2.x's server does (TCPStoreLibUvBackend's
// wakeupOneWaitingClient), one item answers one waiter, the first in arrival order for which
// this key was the last one missing; the other waiters stay parked even though the queue is
// not empty (the woken one is expected to pop the item). Waiters that still miss other keys
// count this one as present and leave its list (PyTorch leaves them on it and counts them
// down again at every push; completion re-checks every key anyway, see try_complete).
void TcpStoreState::wake_one(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<Waiter>& list = it->second;
  std::optional<Waiter> chosen;
  size_t kept = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    Waiter& w = list[i];
    StoreSession::Waiting& waiting = w.waiting();
    if (w.session->closed || !waiting.active) continue;  // stale entry: drop it
    if (!chosen && waiting.awaiting <= 1) {
      chosen = std::move(w);
      continue;
    }
    if (!chosen && waiting.awaiting > 1) {
      --waiting.awaiting;  // passed over: this key counts as present for it
      continue;
    }
    list[kept++] = std::move(w);  // after the chosen one: still waiting for this key
  }
  list.resize(kept, Waiter{nullptr, false});
  if (list.empty()) waiters_.erase(it);
  if (chosen) {
    chosen->waiting().awaiting = 0;
    try_complete(*chosen->session, chosen->pending_wait);
  }
}

// Each key's value, marked present (1, then the value) or absent (0): WAIT_GET's answer.
void TcpStoreState::put_marked_values(Bytes& reply, const Request& q) const {
  for (const auto& key : q.keys) {
    const Bytes* value = table_.find(key);
    wire::put_u8(reply, value ? 1 : 0);
    if (value) wire::put_bytes(reply, *value);
  }
}

bool TcpStoreState::expire_wait(StoreSession& s) {
  if (!s.parked_.active || s.parked_.request.op != Op::kWaitGet) return false;
  SessionPtr keep = s.shared_from_this();
  Request q = std::move(s.parked_.request);
  forget(s, /*pending_wait=*/false);
  wire::put_u8(s.out, wire::kWaitTimedOut);
  put_marked_values(s.out, q);
  s.replied();
  s.resumed();
  return true;
}

void TcpStoreState::cancel_wait(StoreSession& s) {
  if (s.pending_wait_.active) forget(s, /*pending_wait=*/true);
  if (s.parked_.active) forget(s, /*pending_wait=*/false);
  wire::put_u8(s.out, wire::kWaitCanceled);
}

void TcpStoreState::drop(StoreSession& s) {
  if (s.pending_wait_.active) forget(s, /*pending_wait=*/true);
  if (s.parked_.active) forget(s, /*pending_wait=*/false);
  if (s.will_.empty()) return;
  const std::string key = s.will_;
  clear_will(s);
  try {
    table_.add(key, 1);  // wakes the key's waiters and watchers as any ADD
  } catch (const Error&) {
    // The key holds no counter (someone SET it): the will cannot be carried out, and the
    // connection is gone, so there is nobody to tell; its watchers keep their window.
  }
}

// A session has at most one will; naming another replaces it. A counter that is another
// session's will becomes this one's (a client that reconnected takes over its will).
void TcpStoreState::set_will(StoreSession& s, const std::string& key) {
  clear_will(s);
  auto [it, inserted] = wills_.try_emplace(key, &s);
  if (!inserted) {
    it->second->will_.clear();
    it->second = &s;
  }
  s.will_ = key;
}

void TcpStoreState::clear_will(StoreSession& s) {
  if (s.will_.empty()) return;
  auto it = wills_.find(s.will_);
  if (it != wills_.end() && it->second == &s) wills_.erase(it);
  s.will_.clear();
}

void TcpStoreState::forget_wills() {
  for (auto& [key, session] : wills_) session->will_.clear();
  wills_.clear();
}

void TcpStoreState::forget_clients() {
  waiters_.clear();
  barrier_waiters_.clear();
  watchers_.clear();
}

// The keys a waiting request waits for (on waiters_): all of them, but only the first of a
// WAIT_GET (the others are read as they are when it is answered), and none of a BARRIER (its
// key exists; it is on barrier_waiters_).
static size_t awaited_keys(const Request& q) {
  if (q.op == Op::kBarrier) return 0;
  return q.op == Op::kWaitGet ? std::min<size_t>(1, q.keys.size()) : q.keys.size();
}

// Takes one of the session's waiting requests off every wait list it is on.
void TcpStoreState::forget(StoreSession& s, bool pending_wait) {
  StoreSession::Waiting& waiting = pending_wait ? s.pending_wait_ : s.parked_;
  const auto& keys = waiting.request.keys;
  if (waiting.request.op == Op::kBarrier) {
    auto it = barrier_waiters_.find(keys[0]);
    if (it != barrier_waiters_.end()) {
      auto& list = it->second;
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const SessionPtr& w) { return w.get() == &s; }),
                 list.end());
      if (list.empty()) barrier_waiters_.erase(it);
    }
  }
  for (size_t i = 0; i < awaited_keys(waiting.request); ++i) {
    auto it = waiters_.find(keys[i]);
    if (it == waiters_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Waiter& w) {
                                return w.session.get() == &s && w.pending_wait == pending_wait;
                              }),
               list.end());
    if (list.empty()) waiters_.erase(it);
  }
  waiting.active = false;
  waiting.awaiting = 0;
  waiting.request = Request();
}

// Makes `q` wait on its keys that are missing (as the session's pending WAIT or its parked
// request); false when none is missing.
bool TcpStoreState::wait_if_missing(StoreSession& s, const Request& q, bool pending_wait) {
  // One wait-list entry per missing key occurrence, counted in `awaiting`; no duplicate
  // search, which would make a WAIT on N keys by N clients cost N^3.
  size_t missing = 0;
  SessionPtr self;
  for (size_t i = 0; i < awaited_keys(q); ++i) {
    const auto& key = q.keys[i];
    if (!exists(key)) {
      if (!self) self = s.shared_from_this();
      waiters_[key].push_back(Waiter{self, pending_wait});
      ++missing;
    }
  }
  if (missing == 0) return false;
  StoreSession::Waiting& waiting = pending_wait ? s.pending_wait_ : s.parked_;
  waiting.active = true;
  waiting.awaiting = missing;
  waiting.request = q;
  return true;
}

void TcpStoreState::try_complete(StoreSession& s, bool pending_wait) {
  // Hold the session: forget() may drop the last wait-list reference to it.
  SessionPtr keep = s.shared_from_this();
  StoreSession::Waiting& waiting = pending_wait ? s.pending_wait_ : s.parked_;
  Request q = std::move(waiting.request);
  forget(s, pending_wait);
  // A key may have been deleted between its set and now: wait again on what is missing.
  if (wait_if_missing(s, q, pending_wait)) return;
  answer_ready(s, q);
  s.replied();
  // Requests decoded behind a parked one go on; a pending WAIT held none up.
  if (!pending_wait) s.resumed();
}

// Answers a GET/WAIT/MULTI_GET whose keys all exist, or a WAIT_GET whose first key does.
void TcpStoreState::answer_ready(StoreSession& s, const Request& q) {
  Bytes& reply = s.out;
  if (q.op == Op::kWait) {
    wire::put_u8(reply, wire::kStopWaiting);
    return;
  }
  if (q.op == Op::kWaitGet) {
    // Like WAIT's answer, so a CANCEL_WAIT that crossed it is told apart the same way.
    wire::put_u8(reply, wire::kStopWaiting);
    put_marked_values(reply, q);
    return;
  }
  for (const auto& key : q.keys) {
    const Bytes* value = table_.find(key);
    if (value) {
      wire::put_bytes(reply, *value);
    } else {
      wire::put_u64(reply, 0);
    }
  }
}

void TcpStoreState::local_begin_worker_namespace(const std::string& ns) {
  if (const Bytes* old = table_.find(kWorkerNamespaceKey)) {
    const std::string previous = to_string(*old);
    if (!previous.empty() && previous != ns) table_.erase_prefix(previous);
  }
  table_.set(kWorkerNamespaceKey, to_bytes(ns));
}

}  // namespace dlaunch
