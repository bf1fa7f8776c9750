#include "common/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/error.h"

namespace dlaunch {
namespace {

TEST(Env, IntegersParseAndRejectGarbage) {
  EXPECT_EQ(parse_int("42", "--x"), 42);
  EXPECT_EQ(parse_int("-3", "--x"), -3);
  EXPECT_THROW(parse_int("4x", "--x"), UsageError);
  EXPECT_THROW(parse_int("", "--x"), UsageError);
  EXPECT_THROW(parse_int("99999999999999999999999", "--x"), UsageError);
}

TEST(Env, ErrorNamesTheVariableAndValue) {
  ::setenv("DLAUNCH_TEST_INT", "two", 1);
  try {
    get_env_int("DLAUNCH_TEST_INT");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DLAUNCH_TEST_INT='two'"), std::string::npos) << e.what();
  }
  ::unsetenv("DLAUNCH_TEST_INT");
  EXPECT_FALSE(get_env_int("DLAUNCH_TEST_INT").has_value());
}

TEST(Env, BooleansAcceptCommonSpellings) {
  for (const char* t : {"1", "true", "TRUE", "yes", "on"}) EXPECT_TRUE(parse_bool(t, "b")) << t;
  for (const char* f : {"0", "false", "No", "off"}) EXPECT_FALSE(parse_bool(f, "b")) << f;
  EXPECT_THROW(parse_bool("maybe", "b"), UsageError);
}

TEST(Env, DoublesParse) {
  EXPECT_DOUBLE_EQ(parse_double("2.5", "d"), 2.5);
  EXPECT_THROW(parse_double("2.5s", "d"), UsageError);
}

}  // namespace
}  // namespace dlaunch
