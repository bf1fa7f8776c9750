// ConsoleLines: what the console shows of a worker's raw bytes, with a scripted time.
#include "launcher/console_lines.h"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace dlaunch
