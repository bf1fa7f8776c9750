#include "common/byte_order.h"

#include <gtest/gtest.h>

namespace dlaunch {
namespace {

TEST(ByteOrder, StoresLittleEndianAndLoadsBack) {
  unsigned char buf[9] = {};
  store_le<uint64_t>(buf + 1, 0x0102030405060708ull);  // unaligned on purpose
  EXPECT_EQ(buf[1], 0x08);
  EXPECT_EQ(buf[8], 0x01);
  EXPECT_EQ(load_le<uint64_t>(buf + 1), 0x0102030405060708ull);
  store_le<int32_t>(buf, -2);
  EXPECT_EQ(load_le<int32_t>(buf), -2);
}

}  // namespace
}  // namespace dlaunch
