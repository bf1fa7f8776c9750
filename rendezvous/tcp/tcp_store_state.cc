#include "rendezvous/tcp/tcp_store_state.h"

#include <algorithm>

#include "common/error.h"
#include "rendezvous/tcp/worker_namespace.h"

namespace dlaunch {

using wire::Op;
using wire::Request;

// ---- the requests -------------------------------------------------------------------------

// A flat switch over the op set: one case per op, read top to bottom.
TcpStoreState::Handled TcpStoreState::handle(StoreSession& s, Request& q, std::string& error) {
  if (!q.keys.empty()) scope_keys(s, q);
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
    case Op::kCompareSet:
      wire::put_bytes(reply, table_.compare_set(q.keys[0], q.values[0], q.values[1]));
      break;
    case Op::kWaitGet:
      if (q.keys.empty()) {
        error = "WAIT_GET without keys (the first is the one to wait for)";
        return Handled::kBadRequest;
      }
      [[fallthrough]];
    case Op::kGet:
    case Op::kWait:
    case Op::kMultiGet:
      if (park_if_missing(s, q)) return Handled::kQuiet;
      answer_ready(s, q);
      break;
    case Op::kAdd: {
      int64_t value = 0;
      try {
        value = table_.add(q.keys[0], q.delta);
      } catch (const Error& e) {
        error = std::string("ADD: ") + e.what();
        return Handled::kBadRequest;
      }
      wire::put_i64(reply, value);
      break;
    }
    case Op::kCheck: {
      bool ready = true;
      for (const auto& k : q.keys) ready = ready && exists(k);
      wire::put_u8(reply, ready ? wire::kCheckReady : wire::kCheckNotReady);
      break;
    }
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
      wire::put_u8(reply, wire::kWaitCanceled);
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
    case Op::kAuthBegin:
    case Op::kAuthProof:
    case Op::kDeclareRun:
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

void TcpStoreState::scope_keys(StoreSession& s, Request& q) {
  if (s.agent_) return;
  if (!s.scope_known_) {
    s.scope_known_ = true;
    if (const Bytes* ns = table_.find(kWorkerNamespaceKey)) s.scope_.assign(ns->begin(), ns->end());
  }
  if (s.scope_.empty()) return;
  for (auto& key : q.keys) key.insert(0, s.scope_);
}

bool TcpStoreState::exists(const std::string& key) const {
  if (table_.contains(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
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
  std::vector<SessionPtr> woken = std::move(it->second);
  waiters_.erase(it);
  for (auto& s : woken) {
    if (s->closed || !s->parked_) continue;
    if (s->awaiting_ > 0) --s->awaiting_;
    if (s->awaiting_ == 0) try_complete_parked(*s);
  }
}

// A QUEUE_PUSH on `key`: as PyTorch 2.x's server does (TCPStoreLibUvBackend's
// wakeupOneWaitingClient), one item answers one waiter, the first in arrival order for which
// this key was the last one missing; the other waiters stay parked even though the queue is
// not empty (the woken one is expected to pop the item). Waiters that still miss other keys
// count this one as present and leave its list (PyTorch leaves them on it and counts them
// down again at every push; completion re-checks every key anyway, see try_complete_parked).
void TcpStoreState::wake_one(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<SessionPtr>& list = it->second;
  SessionPtr chosen;
  size_t kept = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    SessionPtr& s = list[i];
    if (s->closed || !s->parked_) continue;  // stale entry: drop it
    if (!chosen && s->awaiting_ <= 1) {
      chosen = s;
      continue;
    }
    if (!chosen && s->awaiting_ > 1) {
      --s->awaiting_;  // passed over: this key counts as present for it
      continue;
    }
    list[kept++] = std::move(s);  // after the chosen one: still waiting for this key
  }
  list.resize(kept);
  if (list.empty()) waiters_.erase(it);
  if (chosen) {
    chosen->awaiting_ = 0;
    try_complete_parked(*chosen);
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
  if (!s.parked_ || s.parked_request_.op != Op::kWaitGet) return false;
  SessionPtr keep = s.shared_from_this();
  Request q = std::move(s.parked_request_);
  unpark(s);
  wire::put_u8(s.out, wire::kWaitTimedOut);
  put_marked_values(s.out, q);
  s.replied();
  s.resumed();
  return true;
}

void TcpStoreState::cancel_wait(StoreSession& s) {
  unpark(s);
  wire::put_u8(s.out, wire::kWaitCanceled);
}

void TcpStoreState::drop(StoreSession& s) {
  if (s.parked_) unpark(s);
}

void TcpStoreState::forget_clients() {
  waiters_.clear();
  watchers_.clear();
}

// The keys a parked request waits for: all of them, but only the first of a WAIT_GET (the
// others are read as they are when it is answered).
static size_t awaited_keys(const Request& q) {
  return q.op == Op::kWaitGet ? std::min<size_t>(1, q.keys.size()) : q.keys.size();
}

// Removes `s` from every wait list it is on.
void TcpStoreState::unpark(StoreSession& s) {
  const auto& keys = s.parked_request_.keys;
  for (size_t i = 0; i < awaited_keys(s.parked_request_); ++i) {
    const auto& key = keys[i];
    auto it = waiters_.find(key);
    if (it == waiters_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const SessionPtr& p) { return p.get() == &s; }),
               list.end());
    if (list.empty()) waiters_.erase(it);
  }
  s.parked_ = false;
  s.awaiting_ = 0;
  s.parked_request_ = Request();
}

// Parks `s` on the keys of `q` that are missing; false when none is missing.
bool TcpStoreState::park_if_missing(StoreSession& s, const Request& q) {
  // One wait-list entry per missing key occurrence, counted in `awaiting_`; no duplicate
  // search, which would make a WAIT on N keys by N clients cost N^3.
  size_t missing = 0;
  SessionPtr self;
  for (size_t i = 0; i < awaited_keys(q); ++i) {
    const auto& key = q.keys[i];
    if (!exists(key)) {
      if (!self) self = s.shared_from_this();
      waiters_[key].push_back(self);
      ++missing;
    }
  }
  if (missing == 0) return false;
  s.parked_ = true;
  s.awaiting_ = missing;
  s.parked_request_ = q;
  return true;
}

void TcpStoreState::try_complete_parked(StoreSession& s) {
  // Hold the session: unpark() may drop the last wait-list reference to it.
  SessionPtr keep = s.shared_from_this();
  Request q = std::move(s.parked_request_);
  unpark(s);
  // A key may have been deleted between its set and now: park again on what is missing.
  if (park_if_missing(s, q)) return;
  answer_ready(s, q);
  s.replied();
  s.resumed();
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

}  // namespace dlaunch
