#include "common/error.h"

#include <gtest/gtest.h>

namespace dlaunch {
namespace {

TEST(DlCheck, PassingCheckDoesNotEvaluateStream) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  DL_CHECK(1 + 1 == 2) << count();
  EXPECT_EQ(evaluated, 0);
}

TEST(DlCheck, FailingCheckThrowsWithFileLineAndValues) {
  int offset = 7;
  try {
    DL_CHECK(offset < 3) << "offset=" << offset;
    FAIL() << "DL_CHECK did not throw";
  } catch (const InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("error_test.cc:"), std::string::npos) << what;
    EXPECT_NE(what.find("offset < 3"), std::string::npos) << what;
    EXPECT_NE(what.find("offset=7"), std::string::npos) << what;
  }
}

TEST(Errors, AllDeriveFromOneRoot) {
  EXPECT_THROW(throw TimeoutError("t"), Error);
  EXPECT_THROW(throw ConnectionError("c"), Error);
  EXPECT_THROW(throw ClosedError("c"), Error);
  EXPECT_THROW(throw ProtocolError("p"), Error);
  EXPECT_THROW(throw StateError("s"), Error);
  EXPECT_THROW(throw UsageError("u"), Error);
  EXPECT_THROW(throw SystemError("s"), Error);
}

}  // namespace
}  // namespace dlaunch
