#include "kernels/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

namespace dlaunch::kernels {
namespace {

std::atomic<bool> g_on{false};
std::mutex g_mu;
struct Entry {
  long calls = 0;
  double seconds = 0;
};
std::map<std::string, Entry>& totals() {
  static std::map<std::string, Entry> t;
  return t;
}

}  // namespace

void set_profiling(bool on) { g_on.store(on, std::memory_order_relaxed); }
bool profiling() { return g_on.load(std::memory_order_relaxed); }

void profile_add(const char* op, double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry& e = totals()[op];
  ++e.calls;
  e.seconds += seconds;
}

std::string profile_report(bool reset) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::pair<std::string, Entry>> rows(totals().begin(), totals().end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  double sum = 0;
  for (auto& r : rows) sum += r.second.seconds;
  std::string out = fmt::format("{:<28} {:>7} {:>10} {:>7}\n", "op", "calls", "total_ms", "share");
  for (auto& r : rows)
    out += fmt::format("{:<28} {:>7} {:>10.1f} {:>6.1f}%\n", r.first, r.second.calls,
                       r.second.seconds * 1e3, sum > 0 ? 100 * r.second.seconds / sum : 0.0);
  if (reset) totals().clear();
  return out;
}

}  // namespace dlaunch::kernels
