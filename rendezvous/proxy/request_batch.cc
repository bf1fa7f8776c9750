#include "rendezvous/proxy/request_batch.h"

namespace dlaunch {

using wire::ChannelFrameKind;
using wire::Op;

namespace {

bool groupable(const wire::Request& q) {
  switch (q.op) {
    case Op::kGet:
    case Op::kAdd:
      return q.keys.size() == 1;
    case Op::kWait:
    case Op::kMultiGet:
    case Op::kCheck:
      return !q.keys.empty();
    default:
      return false;
  }
}

// Whether the request's effect is confined to the keys it names (a WILL's comes later, when its
// connection ends).
bool keys_say_it_all(const wire::Request& q) {
  return !q.keys.empty() && q.op != Op::kDeletePrefix && q.op != Op::kDeclareRun &&
         q.op != Op::kWill;
}

}  // namespace

bool RequestBatch::all_the_same_bytes(const std::vector<Member>& members) {
  for (const Member& m : members) {
    if (m.bytes != members[0].bytes) return false;
  }
  return true;
}

void RequestBatch::open(uint32_t channel) {
  entries_.push_back(Entry{ChannelFrameKind::kOpen, channel, {}, Op::kPing, {}, {}});
  last_of_channel_[channel] = entries_.size() - 1;
}

void RequestBatch::close(uint32_t channel) {
  entries_.push_back(Entry{ChannelFrameKind::kClose, channel, {}, Op::kPing, {}, {}});
  last_of_channel_[channel] = entries_.size() - 1;
}

size_t RequestBatch::append_data(uint32_t channel, const uint8_t* data, size_t size) {
  if (entries_.empty() || entries_.back().kind != ChannelFrameKind::kData ||
      entries_.back().channel != channel) {
    entries_.push_back(Entry{ChannelFrameKind::kData, channel, {}, Op::kPing, {}, {}});
  }
  Bytes& bytes = entries_.back().data;
  bytes.insert(bytes.end(), data, data + size);
  const size_t at = entries_.size() - 1;
  last_of_channel_[channel] = at;
  return at;
}

void RequestBatch::raw(uint32_t channel, const uint8_t* data, size_t size) {
  append_data(channel, data, size);
  barrier_ = entries_.size();
}

void RequestBatch::touch(const wire::Request& q, size_t at) {
  for (const auto& key : q.keys) last_touch_[key] = at;
}

bool RequestBatch::can_join(uint32_t channel, const wire::Request& q, size_t* at) const {
  auto it = last_touch_.find(q.keys[0]);
  if (it == last_touch_.end() || it->second < barrier_) return false;
  const Entry& e = entries_[it->second];
  if (e.kind != ChannelFrameKind::kGroup || e.op != q.op || e.keys != q.keys) return false;
  for (const auto& key : q.keys) {
    auto t = last_touch_.find(key);
    if (t == last_touch_.end() || t->second != it->second) return false;
  }
  auto mine = last_of_channel_.find(channel);
  if (mine != last_of_channel_.end() && mine->second >= it->second) return false;
  *at = it->second;
  return true;
}

void RequestBatch::request(uint32_t channel, const wire::Request& q, const uint8_t* data,
                           size_t size) {
  if (!group_requests_ || !groupable(q)) {
    const size_t at = append_data(channel, data, size);
    if (keys_say_it_all(q)) {
      touch(q, at);
    } else if (q.op == Op::kDeletePrefix || q.op == Op::kNumKeys || q.op == Op::kListKeys) {
      barrier_ = entries_.size();
    }
    return;
  }
  size_t at = 0;
  if (!can_join(channel, q, &at)) {
    entries_.push_back(Entry{ChannelFrameKind::kGroup, 0, {}, q.op, q.keys, {}});
    at = entries_.size() - 1;
    touch(q, at);
  }
  entries_[at].members.push_back(Member{channel, Bytes(data, data + size)});
  last_of_channel_[channel] = at;
}

void RequestBatch::encode(Bytes& out, int64_t* grouped) {
  std::vector<wire::ChannelPayload> payloads;
  std::vector<uint32_t> channels;
  for (const Entry& e : entries_) {
    switch (e.kind) {
      case ChannelFrameKind::kOpen:
        wire::put_channel_open(out, e.channel);
        break;
      case ChannelFrameKind::kClose:
        wire::put_channel_close(out, e.channel);
        break;
      case ChannelFrameKind::kData:
        wire::put_channel_data(out, e.channel, e.data.data(), e.data.size());
        break;
      case ChannelFrameKind::kGroup:
        if (e.members.size() == 1) {
          const Member& m = e.members[0];
          wire::put_channel_data(out, m.channel, m.bytes.data(), m.bytes.size());
          break;
        }
        if (same_bytes_once_ && all_the_same_bytes(e.members)) {
          channels.clear();
          for (const Member& m : e.members) channels.push_back(m.channel);
          const Bytes& bytes = e.members[0].bytes;
          wire::put_channel_group_of_same_bytes(out, channels, bytes.data(), bytes.size());
          *grouped += static_cast<int64_t>(e.members.size());
          break;
        }
        payloads.clear();
        for (const Member& m : e.members) {
          payloads.push_back(wire::ChannelPayload{m.channel, m.bytes.data(), m.bytes.size()});
        }
        wire::put_channel_group(out, payloads);
        *grouped += static_cast<int64_t>(e.members.size());
        break;
      case ChannelFrameKind::kShared:  // the store's reply frame; the batch makes none
        break;
    }
  }
  entries_.clear();
  last_touch_.clear();
  last_of_channel_.clear();
  barrier_ = 0;
}

}  // namespace dlaunch
