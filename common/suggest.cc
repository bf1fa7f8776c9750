#include "common/suggest.h"

#include <algorithm>

namespace dlaunch {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_word(const std::string& word, const std::vector<std::string>& candidates,
                         std::string (*key)(std::string)) {
  const std::string w = key ? key(word) : word;
  std::string best;
  size_t best_distance = 0;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(w, key ? key(c) : c);
    if (best.empty() || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  // A typo is a few edits away; beyond that the suggestion would be noise.
  const size_t allowed = std::max<size_t>(2, w.size() / 3);
  return !best.empty() && best_distance <= allowed ? best : "";
}

}  // namespace dlaunch
