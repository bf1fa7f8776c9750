#include "launcher/slurm/hostlist.h"

#include <fmt/format.h>

#include <cstdint>

#include "common/error.h"

namespace dlaunch {
namespace {

constexpr const char kExample[] = "e.g. \"gpu-[01-04,07],login[1-2]\"";

bool is_separator(char c) {
  return c == ',' || c == ' ' || c == '\t' || c == '\n';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

[[noreturn]] void fail(std::string_view input, size_t pos, const std::string& problem) {
  throw UsageError(fmt::format("bad Slurm hostlist \"{}\": {} at position {}; expected a list {}",
                               input, problem, pos, kExample));
}

// One piece of an item: either fixed text or the expansions of one bracket group.
struct Segment {
  std::vector<std::string> choices;
  bool bracketed = false;
};

uint64_t parse_number(std::string_view input, size_t pos, std::string_view digits) {
  if (digits.empty()) fail(input, pos, "empty range (a number was expected)");
  if (digits.size() > 18) fail(input, pos, fmt::format("number '{}' is too long", digits));
  uint64_t value = 0;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (!is_digit(digits[i])) {
      fail(input, pos + i, fmt::format("'{}' in range '{}' is not a digit", digits[i], digits));
    }
    value = value * 10 + static_cast<uint64_t>(digits[i] - '0');
  }
  return value;
}

// Expands the inside of one bracket group, `body` starting at byte `pos` of `input`.
std::vector<std::string> expand_ranges(std::string_view input, size_t pos, std::string_view body) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = body.find(',', start);
    std::string_view range =
        body.substr(start, comma == std::string_view::npos ? body.npos : comma - start);
    size_t range_pos = pos + start;
    size_t dash = range.find('-');
    std::string_view lo_text = range.substr(0, dash);
    uint64_t lo = parse_number(input, range_pos, lo_text);
    uint64_t hi = lo;
    if (dash != std::string_view::npos) {
      hi = parse_number(input, range_pos + dash + 1, range.substr(dash + 1));
      if (hi < lo) {
        fail(input, range_pos,
             fmt::format("reversed range '{}' (the low end must come first, e.g. [{}-{}])", range,
                         hi, lo));
      }
    }
    if (hi - lo >= kMaxHostlistHosts || out.size() + (hi - lo + 1) > kMaxHostlistHosts) {
      fail(input, range_pos,
           fmt::format("range '{}' expands to more than {} hosts", range, kMaxHostlistHosts));
    }
    // Slurm pads to the width of the low end as written: [01-10] -> 01..10, [1-10] -> 1..10.
    const size_t width = lo_text.size();
    for (uint64_t n = lo; n <= hi; ++n) out.push_back(fmt::format("{:0{}}", n, width));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// Expands one item (no top-level separators) at byte `pos` of `input`, appending to `hosts`.
void expand_item(std::string_view input, size_t pos, std::string_view item,
                 std::vector<std::string>& hosts) {
  std::vector<Segment> segments;
  std::string text;
  uint64_t combinations = 1;
  for (size_t i = 0; i < item.size(); ++i) {
    if (item[i] != '[') {
      text += item[i];
      continue;
    }
    // The caller checked the brackets balance and do not nest.
    size_t close = item.find(']', i);
    if (!text.empty()) segments.push_back({{text}});
    text.clear();
    segments.push_back(
        {expand_ranges(input, pos + i + 1, item.substr(i + 1, close - i - 1)), true});
    combinations *= segments.back().choices.size();
    if (combinations > kMaxHostlistHosts || hosts.size() + combinations > kMaxHostlistHosts) {
      fail(input, pos, fmt::format("'{}' expands to more than {} hosts", item, kMaxHostlistHosts));
    }
    i = close;
  }
  if (!text.empty()) segments.push_back({{text}});

  // Cartesian product in Slurm's order: the last bracket group varies fastest, then the first,
  // the second, ..., the second-to-last slowest (Slurm recurses from the last '[' of the prefix
  // that precedes the final group). An odometer whose wheels turn in that order.
  std::vector<size_t> wheels;  // segment indices, fastest first
  std::vector<size_t> groups;
  for (size_t s = 0; s < segments.size(); ++s) {
    if (segments[s].bracketed) groups.push_back(s);
  }
  if (!groups.empty()) {
    wheels.push_back(groups.back());
    wheels.insert(wheels.end(), groups.begin(), groups.end() - 1);
  }
  std::vector<size_t> index(segments.size(), 0);
  while (true) {
    std::string host;
    for (size_t s = 0; s < segments.size(); ++s) host += segments[s].choices[index[s]];
    hosts.push_back(std::move(host));
    size_t w = 0;
    for (; w < wheels.size(); ++w) {
      if (++index[wheels[w]] < segments[wheels[w]].choices.size()) break;
      index[wheels[w]] = 0;
    }
    if (w == wheels.size()) return;
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view hostlist) {
  std::vector<std::string> hosts;
  size_t item_start = 0;
  size_t open = std::string_view::npos;  // position of the unclosed '[', if any
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const bool end = i == hostlist.size();
    const char c = end ? ',' : hostlist[i];
    if (c == '[') {
      if (open != std::string_view::npos) {
        fail(hostlist, i, fmt::format("'[' inside the bracket group opened at position {}", open));
      }
      open = i;
    } else if (c == ']') {
      if (open == std::string_view::npos) fail(hostlist, i, "']' without a matching '['");
      open = std::string_view::npos;
    } else if (end && open != std::string_view::npos) {
      fail(hostlist, open, "'[' is never closed");
    } else if (is_separator(c) && open == std::string_view::npos) {
      if (i > item_start) {
        expand_item(hostlist, item_start, hostlist.substr(item_start, i - item_start), hosts);
      }
      item_start = i + 1;
    }
  }
  return hosts;
}

std::string first_host(std::string_view hostlist) {
  auto hosts = expand_hostlist(hostlist);
  if (hosts.empty()) {
    throw UsageError(fmt::format("Slurm hostlist \"{}\" names no host; expected at least one, {}",
                                 hostlist, kExample));
  }
  return hosts.front();
}

}  // namespace dlaunch
