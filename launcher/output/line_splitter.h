// Cuts a byte stream into lines for the failure report's stderr tail. A line longer than
// kMaxLine is delivered in pieces (a runaway progress bar must not grow the agent without
// bound). Pure; never throws (but bad_alloc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace dlaunch {

class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  // Calls emit(line) for each line `data` completes, without its '\n'.
  template <typename Emit>
  void feed(std::string_view data, Emit&& emit) {
    while (!data.empty()) {
      size_t nl = data.find('\n');
      size_t take = nl == std::string_view::npos ? data.size() : nl;
      take = std::min(take, kMaxLine - pending_.size());
      pending_.append(data.data(), take);
      data.remove_prefix(take);
      bool ended = !data.empty() && data.front() == '\n';
      if (ended) data.remove_prefix(1);
      if (ended || pending_.size() >= kMaxLine) {
        emit(std::string_view(pending_));
        pending_.clear();
      }
    }
  }
  // Delivers an unterminated last line, if any.
  template <typename Emit>
  void flush(Emit&& emit) {
    if (pending_.empty()) return;
    emit(std::string_view(pending_));
    pending_.clear();
  }

 private:
  std::string pending_;
};

}  // namespace dlaunch
