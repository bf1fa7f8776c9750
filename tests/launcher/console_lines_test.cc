// ConsoleLines: what the console shows of a worker's raw bytes, with a scripted time.
#include "launcher/output/console_lines.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace dlaunch {
namespace {

using namespace std::chrono_literals;

struct Console {
  ConsoleLines lines{"[r0]:"};
  TimePoint now{};
  std::string out;
  std::string feed(std::string_view bytes) {
    out.clear();
    lines.feed(bytes, now, out);
    return out;
  }
  std::string flush(Duration min_age = 100ms) {
    out.clear();
    lines.flush(now, min_age, out);
    return out;
  }
  std::string finish() {
    out.clear();
    lines.finish(out);
    return out;
  }
};

TEST(ConsoleLines, CompleteLinesGoOutWholeWithThePrefix) {
  Console c;
  EXPECT_EQ(c.feed("one\ntwo\n\n"), "[r0]:one\n[r0]:two\n[r0]:\n");
}

TEST(ConsoleLines, ALineSplitAcrossChunksIsJoinedNotCut) {
  Console c;
  EXPECT_EQ(c.feed("12"), "");
  EXPECT_EQ(c.feed("34\n5"), "[r0]:1234\n");
  EXPECT_EQ(c.feed("6\n"), "[r0]:56\n");
}

TEST(ConsoleLines, CarriageReturnUpdatesEachKeepThePrefix) {
  Console c;
  EXPECT_EQ(c.feed("a\rb\rc\n"), "[r0]:a\r[r0]:b\r[r0]:c\n");
  // A bare '\r' at a line start moves nothing: no empty prefixed update.
  EXPECT_EQ(c.feed("\rd\n"), "[r0]:d\n");
}

TEST(ConsoleLines, CrLfIsOneLineEndAlsoAcrossChunks) {
  Console c;
  EXPECT_EQ(c.feed("dos\r\nline\r"), "[r0]:dos\r\n");
  EXPECT_EQ(c.feed("\nnext\n"), "[r0]:line\r\n[r0]:next\n");
}

TEST(ConsoleLines, TailShowsOnlyAfterItWaited) {
  Console c;
  EXPECT_EQ(c.feed("prompt> "), "");
  c.now += 50ms;
  EXPECT_EQ(c.flush(), "");
  c.now += 60ms;
  EXPECT_EQ(c.flush(), "[r0]:prompt> ");
  EXPECT_FALSE(c.lines.pending_since());
  // The rest continues the same console line, unprefixed.
  EXPECT_EQ(c.feed("yes\nnext\n"), "yes\n[r0]:next\n");
}

TEST(ConsoleLines, TheTailsAgeCountsFromItsFirstByte) {
  Console c;
  c.feed("a");
  c.now += 80ms;
  c.feed("b");  // still the same tail: its age is 80 ms, not 0
  c.now += 30ms;
  EXPECT_EQ(c.flush(), "[r0]:ab");
}

TEST(ConsoleLines, ProgressBarRedrawShowsAfterTheDelayWithItsPrefix) {
  Console c;
  EXPECT_EQ(c.feed("\r10%"), "");
  c.now += 100ms;
  EXPECT_EQ(c.flush(), "[r0]:10%");
  EXPECT_EQ(c.feed("\r20%"), "\r");
  c.now += 100ms;
  EXPECT_EQ(c.flush(), "[r0]:20%");
}

TEST(ConsoleLines, FinishShowsTheTailAndEndsTheLine) {
  Console c;
  c.feed("last words");
  EXPECT_EQ(c.finish(), "[r0]:last words\n");
  EXPECT_EQ(c.finish(), "");
  c.feed("open");
  c.now += 1s;
  c.flush();
  EXPECT_EQ(c.finish(), "\n");
}

TEST(ConsoleLines, AVeryLongLineIsCutAndTheCutSaysSo) {
  Console c;
  std::string line(kMaxConsoleLine * 2 + 10, 'x');
  std::string out = c.feed(line + "\n");
  std::string piece = "[r0]:" + std::string(kMaxConsoleLine, 'x') + std::string(kLineCutNote);
  EXPECT_EQ(out, piece + piece + "[r0]:" + std::string(10, 'x') + "\n");
}

// --log_fold (console_fold.h): the ConsoleLines of several ranks share one fold per stream.
struct FoldedConsole {
  explicit FoldedConsole(size_t ranks, std::function<std::string()> stamp = nullptr)
      : fold("d", ranks) {
    for (size_t r = 0; r < ranks; ++r) {
      ConsoleStyle style;
      style.fold = &fold;
      style.rank = static_cast<int64_t>(r);
      style.stamp = stamp;
      lines.emplace_back("[d" + std::to_string(r) + "]:", style);
    }
  }
  std::string feed(size_t rank, std::string_view bytes) {
    out.clear();
    lines[rank].feed(bytes, now, out);
    return out;
  }
  std::string flush_due() {
    out.clear();
    fold.flush_due(now, 100ms, out);
    return out;
  }
  ConsoleFold fold;
  std::vector<ConsoleLines> lines;
  TimePoint now{};
  std::string out;
};

TEST(ConsoleFold, FoldedPrefixListsRangesOfRanks) {
  EXPECT_EQ(folded_prefix("default", {0}), "[default0]:");
  EXPECT_EQ(folded_prefix("default", {3, 0, 1, 2, 5, 7, 6}), "[default0-3,5-7]:");
  EXPECT_EQ(folded_prefix("w", {1, 3}), "[w1,3]:");
}

TEST(ConsoleFold, IdenticalLinesOfEveryRankGoOutOnceAtOnce) {
  FoldedConsole c(4);
  EXPECT_EQ(c.feed(2, "epoch 1\n"), "");
  EXPECT_EQ(c.feed(0, "epoch 1\n"), "");
  EXPECT_EQ(c.feed(3, "epoch 1\n"), "");
  EXPECT_EQ(c.feed(1, "epoch 1\n"), "[d0-3]:epoch 1\n");
  EXPECT_FALSE(c.fold.pending_since().has_value());
}

// Lines interleave across ranks ("same" then "rankN" from each); the identical ones still fold,
// and each rank's lines keep their order.
TEST(ConsoleFold, InterleavedRanksFoldTheirIdenticalLinesInOrder) {
  FoldedConsole c(3);
  EXPECT_EQ(c.feed(2, "same\nrank2\n"), "");
  EXPECT_EQ(c.feed(0, "same\nrank0\n"), "");
  EXPECT_EQ(c.feed(1, "same\n"), "[d0-2]:same\n");
  EXPECT_EQ(c.feed(1, "rank1\n"), "");
  c.now += 110ms;
  EXPECT_EQ(c.flush_due(), "[d1]:rank1\n[d0]:rank0\n[d2]:rank2\n");
}

TEST(ConsoleFold, ADifferingLineIsNotFoldedAndWaitsLikeATail) {
  FoldedConsole c(4);
  EXPECT_EQ(c.feed(0, "loss 1\n"), "");
  EXPECT_EQ(c.feed(1, "loss 1\n"), "");
  EXPECT_EQ(c.feed(2, "loss 2\n"), "");
  EXPECT_EQ(c.feed(3, "loss 1\n"), "");
  // The same rank twice is two lines, after its own earlier one.
  EXPECT_EQ(c.feed(3, "loss 1\n"), "");
  c.now += 50ms;
  EXPECT_EQ(c.flush_due(), "");
  c.now += 60ms;
  EXPECT_EQ(c.flush_due(), "[d2]:loss 2\n[d0-1,3]:loss 1\n[d3]:loss 1\n");
  EXPECT_EQ(c.flush_due(), "");
  EXPECT_FALSE(c.fold.pending_since().has_value());
}

// Per-rank lines between identical ones do not stop the later identical ones from folding.
TEST(ConsoleFold, IdenticalLinesAfterDifferingOnesStillFold) {
  FoldedConsole c(3);
  EXPECT_EQ(c.feed(2, "loss 0.2\ndone\n"), "");
  EXPECT_EQ(c.feed(0, "loss 0.0\ndone\n"), "");
  EXPECT_EQ(c.feed(1, "loss 0.1\n"), "");
  EXPECT_EQ(c.feed(1, "done\n"), "");
  c.now += 110ms;
  EXPECT_EQ(c.flush_due(), "[d1]:loss 0.1\n[d0]:loss 0.0\n[d2]:loss 0.2\n[d0-2]:done\n");
}

// A line that keeps coming first does not hold older ones back past their wait.
TEST(ConsoleFold, NoLineWaitsMuchLongerThanATail) {
  FoldedConsole c(2);
  EXPECT_EQ(c.feed(1, "old\n"), "");
  for (int i = 0; i < 3; ++i) {
    c.now += 40ms;
    EXPECT_EQ(c.feed(0, "new" + std::to_string(i) + "\n"), "");
  }
  c.now += 40ms;  // "old" waited 160 ms, the newest 40 ms
  EXPECT_NE(c.flush_due().find("[d1]:old\n"), std::string::npos);
}

// Ranks that print the same line 50 ms apart, each, fold into one line: a fold that ranks keep
// joining waits on (the timer still fires every 10 ms). It went out after 100 ms with the
// first two ranks, and the others printed it again.
TEST(ConsoleFold, RanksFiftyMillisecondsApartStillFold) {
  FoldedConsole c(4);
  std::string shown;
  for (int tick = 0; tick <= 40; ++tick) {
    shown += c.flush_due();
    if (tick % 5 == 0 && tick / 5 < 4) shown += c.feed(static_cast<size_t>(tick / 5), "epoch 1\n");
    c.now += 10ms;
  }
  EXPECT_EQ(shown, "[d0-3]:epoch 1\n");
  // A fold that keeps growing still goes out within ConsoleFold::kMaxWait of its first line.
  FoldedConsole slow(40);
  shown.clear();
  TimePoint first = slow.now;
  for (size_t r = 0; r < 40 && shown.empty(); ++r) {
    shown += slow.feed(r, "epoch 1\n");
    slow.now += 50ms;
    shown += slow.flush_due();
  }
  EXPECT_NE(shown.find("epoch 1"), std::string::npos);
  EXPECT_LE(slow.now - first, ConsoleFold::kMaxWait + 100ms);
}

// With --log_timestamps the console stays in time order: a rank's new line goes after the lines
// held before it, of every rank (without time stamps it may go before other ranks' held lines,
// so that more identical lines can fold).
TEST(ConsoleFold, WithTimestampsTheConsoleStaysInTimeOrder) {
  int n = 0;
  FoldedConsole c(3, [&n] { return "t" + std::to_string(n++) + " "; });
  EXPECT_EQ(c.feed(1, "loss 0.1\n"), "");
  EXPECT_EQ(c.feed(0, "loss 0.0\n"), "");
  EXPECT_EQ(c.feed(2, "loss 0.2\n"), "");
  c.now += 110ms;
  EXPECT_EQ(c.flush_due(), "t0 [d1]:loss 0.1\nt1 [d0]:loss 0.0\nt2 [d2]:loss 0.2\n");
  // Identical lines printed in step still fold.
  EXPECT_EQ(c.feed(2, "epoch 2\n"), "");
  EXPECT_EQ(c.feed(0, "epoch 2\n"), "");
  EXPECT_EQ(c.feed(1, "epoch 2\n"), "t3 [d0-2]:epoch 2\n");
}

TEST(ConsoleFold, ProgressUpdatesAndTailsKeepTheConsoleOrder) {
  FoldedConsole c(2);
  EXPECT_EQ(c.feed(0, "start\n"), "");
  // A '\r' update of rank 1 is not a whole line: the held line goes out before it.
  EXPECT_EQ(c.feed(1, "10%\r20%\r"), "[d0]:start\n[d1]:10%\r");
  EXPECT_EQ(c.feed(0, "x\n"), "");
  // A tail shown after its wait also comes after what the fold held.
  EXPECT_EQ(c.feed(1, "\nprompt> "), "[d0]:x\n[d1]:20%\r\n");
  EXPECT_EQ(c.feed(0, "z\n"), "");
  c.now += 150ms;
  c.out.clear();
  c.lines[1].flush(c.now, 100ms, c.out);
  EXPECT_EQ(c.out, "[d0]:z\n[d1]:prompt> ");
  // A worker's end ends its open line; what the fold holds waits for the others, until the last
  // rank's end.
  EXPECT_EQ(c.feed(0, "y\n"), "");
  c.out.clear();
  c.lines[1].finish(c.out);
  EXPECT_EQ(c.out, "\n");
  c.out.clear();
  c.lines[0].finish(c.out);
  EXPECT_EQ(c.out, "[d0]:y\n");
}

TEST(ConsoleFold, TimestampsStartEachLineAndAFoldKeepsItsFirst) {
  int n = 0;
  FoldedConsole c(2, [&n] { return "t" + std::to_string(n++) + " "; });
  EXPECT_EQ(c.feed(0, "same\n"), "");
  EXPECT_EQ(c.feed(1, "same\n"), "t0 [d0-1]:same\n");
  Console plain;
  plain.lines = ConsoleLines("[r0]:", ConsoleStyle{nullptr, 0, [] { return std::string("T "); }});
  EXPECT_EQ(plain.feed("a\nb\rc"), "T [r0]:a\nT [r0]:b\r");
}

}  // namespace
}  // namespace dlaunch
