#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace spritetorch {
namespace {

// The instruction's three interleaved streams (blocks of 8 KiB, joined by multiplications mod P)
// against the byte-at-a-time table: every length around the block edges, odd starts, and sums
// continued piece by piece.
TEST(Crc32c, TheFastFormEqualsTheTableAtEveryLengthAndOffset) {
  ASSERT_EQ(crc32c_by_table("123456789", 9), 0xE3069283u);  // the standard's check value
  std::mt19937 random(7);
  std::vector<uint8_t> bytes(3 * 3 * 8192 + 100);
  for (auto& b : bytes) b = static_cast<uint8_t>(random());
  std::vector<size_t> sizes = {0,    1,     7,     8,     9,     63,    64,
                               4095, 24575, 24576, 24577, 49152, 49160, 3 * 3 * 8192 + 99};
  for (int i = 0; i < 40; ++i) sizes.push_back(random() % (bytes.size() - 3));
  for (size_t size : sizes)
    for (size_t offset : {0, 1, 3}) {
      if (offset + size > bytes.size()) continue;
      const uint8_t* at = bytes.data() + offset;
      const uint32_t want = crc32c_by_table(at, size);
      EXPECT_EQ(crc32c(at, size), want) << size << " bytes at +" << offset;
      const size_t cut = size / 3;  // continued: the same as in one go
      EXPECT_EQ(crc32c(at + cut, size - cut, crc32c(at, cut)), want) << size << " cut at " << cut;
    }
}

}  // namespace
}  // namespace spritetorch
