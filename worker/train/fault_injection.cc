#include "worker/train/fault_injection.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/env.h"

namespace dlaunch::train {

namespace {

// "N" or "N1,N2,..." (parse_int's message names the variable and the item).
std::vector<int64_t> parse_list(const std::string& text, const char* name) {
  std::vector<int64_t> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    out.push_back(parse_int(item, name));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

std::vector<FaultPoint> parse_fault_points(const std::string& steps, const std::string& ranks,
                                           int64_t default_rank) {
  if (steps.empty()) return {};
  const std::vector<int64_t> at = parse_list(steps, "DTRAIN_FAIL_AT_STEP");
  std::vector<int64_t> who =
      ranks.empty() ? std::vector<int64_t>{default_rank} : parse_list(ranks, "DTRAIN_FAIL_RANK");
  if (who.size() == 1) who.resize(at.size(), who.front());
  if (who.size() != at.size()) {
    throw UsageError(fmt::format(
        "DTRAIN_FAIL_RANK={} names {} ranks for the {} steps of DTRAIN_FAIL_AT_STEP={}: give one "
        "rank, or one per step",
        ranks, who.size(), at.size(), steps));
  }
  std::vector<FaultPoint> points;
  for (size_t i = 0; i < at.size(); ++i) {
    if (at[i] >= 0) points.push_back({at[i], who[i]});  // a negative step is none (-1: off)
  }
  return points;
}

}  // namespace dlaunch::train
