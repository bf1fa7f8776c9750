// When a waiting node says so again (rendezvous/tcp/wait_notes.h): 5, 10, 20, 40... s, or
// from another first interval, and one note for a step that blocked past several due times.
#include <gtest/gtest.h>

#include <vector>

#include "rendezvous/tcp/wait_notes.h"

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

std::vector<int> due_seconds(WaitNotes notes, TimePoint start, int until) {
  std::vector<int> due;
  for (int s = 0; s <= until; ++s) {
    if (notes.due(start + std::chrono::seconds(s))) due.push_back(s);
  }
  return due;
}

TEST(WaitNotes, DueAtGrowingIntervals) {
  const TimePoint start{};
  EXPECT_EQ(due_seconds(WaitNotes(start), start, 100), (std::vector<int>{5, 10, 20, 40, 80}));
  EXPECT_EQ(due_seconds(WaitNotes(start, 2s), start, 20), (std::vector<int>{2, 4, 8, 16}));
}

TEST(WaitNotes, OneNoteForAStepThatBlockedPastSeveralDueTimes) {
  const TimePoint start{};
  WaitNotes notes(start);
  EXPECT_TRUE(notes.due(start + 25s));  // 5, 10 and 20 s passed during one blocked lookup
  EXPECT_FALSE(notes.due(start + 26s));
  EXPECT_TRUE(notes.due(start + 40s));
}

}  // namespace
}  // namespace dlaunch
