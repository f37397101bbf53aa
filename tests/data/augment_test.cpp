#include "data/augment.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace spritetorch::data {
namespace {

TEST(Augment, ParsesTheAcceptedForms) {
  EXPECT_FALSE(parse_augment("none").enabled());
  EXPECT_TRUE(parse_augment("flip").flip);
  EXPECT_EQ(parse_augment("shift").shift, 2);
  const auto both = parse_augment("flip,shift:3");
  EXPECT_TRUE(both.flip);
  EXPECT_EQ(both.shift, 3);
  EXPECT_EQ(both.describe(), "flip,shift 3");
  EXPECT_THROW(parse_augment("rotate"), Error);
  EXPECT_THROW(parse_augment("shift:x"), Error);
  // Each once, nothing empty: a repeat or a stray comma is a typo, not a stronger augmentation.
  EXPECT_THROW(parse_augment("flip,flip"), Error);
  EXPECT_THROW(parse_augment("shift,shift:3"), Error);
  EXPECT_THROW(parse_augment("flip,"), Error);
  EXPECT_THROW(parse_augment(",flip"), Error);
}

TEST(Augment, FlipMirrorsSomeSamplesAndKeepsTheRest) {
  torch::manual_seed(1);
  const auto x = torch::rand({64, 3, 5, 7});
  const auto y = augment_batch(x, parse_augment("flip"));
  int flipped = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const bool same = torch::equal(y[i], x[i]);
    const bool mirrored = torch::equal(y[i], x[i].flip({2}));
    EXPECT_TRUE(same || mirrored) << i;
    flipped += mirrored;
  }
  EXPECT_GT(flipped, 10);
  EXPECT_LT(flipped, 54);
}

TEST(Augment, ShiftMovesEachSampleAsAWholeWithinBounds) {
  torch::manual_seed(2);
  // One bright pixel per sample in the middle of a 9x9 image: after a shift of up to 2 it must
  // still be there, moved by at most 2 in each direction, with nothing else changed.
  auto x = torch::zeros({32, 1, 9, 9});
  x.select(2, 4).select(2, 4).fill_(1.0);
  const auto y = augment_batch(x, parse_augment("shift:2"));
  EXPECT_EQ(y.sizes(), x.sizes());
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(y[i].sum().item<float>(), 1.0f) << i;
    const auto where = y[i][0].nonzero();
    EXPECT_LE(std::abs(where[0][0].item<int64_t>() - 4), 2);
    EXPECT_LE(std::abs(where[0][1].item<int64_t>() - 4), 2);
  }
  torch::manual_seed(2);
  EXPECT_TRUE(torch::equal(y, augment_batch(x, parse_augment("shift:2"))))
      << "seeded: reproducible";
}

}  // namespace
}  // namespace spritetorch::data
