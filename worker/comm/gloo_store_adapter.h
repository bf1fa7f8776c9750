// Lets gloo bootstrap through one of our stores (the agent's TCP store): gloo's Store interface
// mapped onto dlaunch::Store. Blocking behaviour and errors are the wrapped store's (get/wait
// block until the key exists or the timeout passes, then TimeoutError).
#pragma once

#include <gloo/rendezvous/store.h>

#include "rendezvous/store/store.h"

namespace dlaunch::comm {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(dlaunch::Store& store) : store_(store) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = store_.get(key);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, std::chrono::duration_cast<Duration>(timeout));
  }

 private:
  dlaunch::Store& store_;
};

}  // namespace dlaunch::comm
