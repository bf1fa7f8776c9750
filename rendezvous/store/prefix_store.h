// A Store decorator that namespaces every key as "<prefix>/<key>", so runs, rounds and worker
// attempts share one backend without colliding (c10d's PrefixStore, gloo's PrefixStore).
//
// Blocking, timeouts and errors are the wrapped store's. get()/multi_get() honour this
// wrapper's own timeout(): they wait on the base with it, then read. num_keys() counts the
// whole underlying store, as c10d does. Thread-safe when the base is.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store/store.h"

namespace dlaunch {

class PrefixStore final : public Store {
 public:
  // Inherits the base's timeout at construction.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  WaitGetResult wait_get(const std::vector<std::string>& keys, Duration timeout) override;
  bool can_delete_prefix() const override { return base_->can_delete_prefix(); }
  int64_t delete_prefix(const std::string& prefix) override;
  bool set_will(const std::string& key) override { return base_->set_will(full(key)); }
  void clear_will() override { base_->clear_will(); }
  void interrupt() override { base_->interrupt(); }
  void connect() override { base_->connect(); }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace dlaunch
