// The proxy's next write to the store: the workers' requests received since the previous
// write, as channel frames (rendezvous/tcp/channel_frames.h), with concurrent GETs, MULTI_GETs,
// CHECKs, WAITs and ADDs of the same keys gathered into GROUPs. Pure logic: no I/O, no clock.
//
// Why grouping keeps every worker's view: the requests in one batch were all received before
// any of them is sent, so none is answered yet and each worker's earlier requests went out in
// an earlier batch or sit earlier in this one: they are concurrent, and any order of them that
// keeps each worker's own order is one the store could have taken. A request joins a group only
// when that keeps the worker's order (the group comes after the worker's earlier entries) and
// moves it past no entry on its keys (the group is the latest entry touching each of them)
// nor past an entry whose keys are not known here (GETNUMKEYS, LIST_KEYS, DELETE_PREFIX, bytes
// that did not decode): those are barriers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/tcp/channel_frames.h"
#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {

class RequestBatch {
 public:
  explicit RequestBatch(bool group_requests) : group_requests_(group_requests) {}

  void open(uint32_t channel);
  void close(uint32_t channel);
  // One whole decoded request of `channel`, its bytes as received.
  void request(uint32_t channel, const wire::Request& q, const uint8_t* data, size_t size);
  // Bytes of `channel` that are no request the proxy decoded (the 2.x VALIDATE, a frame the
  // codec refused: the store will say what is wrong with it).
  void raw(uint32_t channel, const uint8_t* data, size_t size);

  // The store reads GROUP_SAME: a group whose members sent the same bytes goes up with them
  // once (the key lists of the NCCL ids, the same from every rank of a node).
  void send_same_bytes_once(bool on) { same_bytes_once_ = on; }

  bool empty() const { return entries_.empty(); }
  // Appends the batch's frames to `out` and empties it; counts the requests sent in a GROUP of
  // two or more into *grouped.
  void encode(Bytes& out, int64_t* grouped);

 private:
  struct Member {
    uint32_t channel;
    Bytes bytes;
  };
  struct Entry {
    wire::ChannelFrameKind kind;
    uint32_t channel = 0;       // OPEN, DATA, CLOSE
    Bytes data;                 // DATA
    wire::Op op = wire::Op::kPing;  // GROUP
    std::vector<std::string> keys;  // GROUP
    std::vector<Member> members;    // GROUP
  };

  static bool all_the_same_bytes(const std::vector<Member>& members);
  size_t append_data(uint32_t channel, const uint8_t* data, size_t size);
  bool can_join(uint32_t channel, const wire::Request& q, size_t* at) const;
  void touch(const wire::Request& q, size_t at);

  bool group_requests_;
  bool same_bytes_once_ = false;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> last_touch_;   // key -> latest entry touching it
  std::unordered_map<uint32_t, size_t> last_of_channel_;  // channel -> its latest entry
  size_t barrier_ = 0;  // no entry before this one may be joined
};

}  // namespace dlaunch
