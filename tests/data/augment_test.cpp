#include "data/augment.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "device/device.h"

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
  const auto all = parse_augment("flip,shift:2,cutout:8");
  EXPECT_EQ(all.cutout, 8);
  EXPECT_EQ(all.describe(), "flip,shift 2,cutout 8");
  EXPECT_EQ(parse_augment("cutout:12").describe(), "cutout 12");
  EXPECT_THROW(parse_augment("cutout"), Error);  // no default size: it depends on the images
  EXPECT_THROW(parse_augment("cutout:"), Error);
  EXPECT_THROW(parse_augment("cutout:100"), Error);
  EXPECT_THROW(parse_augment("cutout:4,cutout:4"), Error);
  EXPECT_FALSE(parse_augment("cutout:0").enabled());
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

TEST(Augment, CutoutZeroesOneClippedSquarePerSampleInEveryChannel) {
  torch::manual_seed(3);
  const int64_t side = 12, n = 4;
  const auto x = torch::rand({200, 2, side, side}) + 0.5;  // no zeros of its own
  const auto y = augment_batch(x, parse_augment("cutout:4"));
  ASSERT_EQ(y.sizes(), x.sizes());
  int whole = 0, clipped = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const auto zero = y[i] == 0;  // (2, side, side)
    ASSERT_TRUE(torch::equal(zero[0], zero[1])) << i << ": the same square in every channel";
    ASSERT_TRUE(torch::equal(torch::where(zero, y[i], x[i]), x[i].masked_fill(zero, 0)))
        << i << ": the rest unchanged";
    // The zeros form one rectangle: rows r0..r1 and columns c0..c1, all of it zero.
    const auto at = zero[0].nonzero();  // (count, 2)
    ASSERT_GT(at.size(0), 0) << i << ": the square's centre is inside the image";
    const int64_t r0 = at.select(1, 0).min().item<int64_t>(),
                  r1 = at.select(1, 0).max().item<int64_t>();
    const int64_t c0 = at.select(1, 1).min().item<int64_t>(),
                  c1 = at.select(1, 1).max().item<int64_t>();
    const int64_t rows = r1 - r0 + 1, cols = c1 - c0 + 1;
    ASSERT_EQ(at.size(0), rows * cols) << i;
    ASSERT_LE(rows, n);
    ASSERT_LE(cols, n);
    // A side shorter than n only where the square meets the border.
    EXPECT_TRUE(rows == n || r0 == 0 || r1 == side - 1) << i;
    EXPECT_TRUE(cols == n || c0 == 0 || c1 == side - 1) << i;
    (rows == n && cols == n ? whole : clipped) += 1;
  }
  // Centres are uniform over the 12 x 12 image: 8 of 12 rows (and columns) leave the square whole.
  EXPECT_GT(whole, 60);
  EXPECT_GT(clipped, 60);
}

TEST(Augment, CutoutComesLastAndLeavesTheOtherDrawsAlone) {
  const auto x = torch::rand({32, 1, 10, 10}) + 0.5;
  torch::manual_seed(4);
  const auto plain = augment_batch(x, parse_augment("flip,shift:2"));
  torch::manual_seed(4);
  const auto cut = augment_batch(x, parse_augment("flip,shift:2,cutout:6"));
  EXPECT_TRUE(((cut == plain) | (cut == 0)).all().item<bool>());
  EXPECT_GT((cut != plain).sum().item<int64_t>(), 32 * 10) << "the squares did zero something";
  torch::manual_seed(4);
  EXPECT_TRUE(torch::equal(cut, augment_batch(x, parse_augment("flip,shift:2,cutout:6"))))
      << "seeded: reproducible";
}

TEST(AugmentCuda, AllThreeRunOnTheBatchsDevice) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  const auto x = (torch::rand({64, 1, 28, 28}) + 0.5).to(torch::kCUDA);
  torch::manual_seed(5);
  const auto plain = augment_batch(x, parse_augment("flip,shift:2"));
  torch::manual_seed(5);
  const auto cut = augment_batch(x, parse_augment("flip,shift:2,cutout:8"));
  EXPECT_TRUE(cut.is_cuda());
  EXPECT_EQ(cut.sizes(), x.sizes());
  EXPECT_TRUE(((cut == plain) | (cut == 0)).all().item<bool>());
  // Every sample loses pixels: a square clipped into a corner keeps 4 x 4, of which the shift's
  // zero border may already hold two rows and two columns.
  const auto zeroed = ((cut == 0) & (plain != 0)).flatten(1).sum(1);  // (64)
  EXPECT_GE(zeroed.min().item<int64_t>(), 2 * 2) << "a square in every sample";
  EXPECT_GT(zeroed.sum().item<int64_t>(), 64 * 16);
}

}  // namespace
}  // namespace spritetorch::data
