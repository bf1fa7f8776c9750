// "Did you mean ...?" hints for mistyped flags and keys, shared by dlaunch and dtrain. Pure.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dlaunch {

// Levenshtein distance: insertions, deletions and substitutions of single bytes.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, or "" when none is close enough to be a likely typo (at most
// 2 edits, or a third of the word's length for longer words). `key`, when given, maps `word` and
// every candidate before they are compared ('-' and '_' alike, say); the candidate itself is
// returned.
std::string closest_word(const std::string& word, const std::vector<std::string>& candidates,
                         std::string (*key)(std::string) = nullptr);

}  // namespace dlaunch
