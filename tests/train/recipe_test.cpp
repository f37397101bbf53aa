// The defaults a run takes for what it leaves unset (train/recipe.h): the recipes and the epochs
// of a sprite classifier without --epochs.
#include <gtest/gtest.h>

#include "common/error.h"
#include "train/recipe.h"

namespace spritetorch::train {

TEST(SpriteClassifierEpochs, ThirtyEpochsWithinTheStepBoundsAndNeverFewerThanFive) {
  // The DCSS items: 954 training sprites, 14 steps of 64 an epoch: 30 epochs are 420 steps, so
  // ceil(500 / 14) = 36 for the least steps.
  EXPECT_EQ(sprite_classifier_epochs(954, 64), 36);
  // The four views: 3,240 sprites, 50 steps an epoch: 30 epochs are the 1,500 steps at most.
  EXPECT_EQ(sprite_classifier_epochs(3240, 64), kSpriteClassifierEpochs);
  // Past 1,500 steps the cap decides: 51 steps an epoch still round up to 30 epochs, 52 to 29.
  EXPECT_EQ(sprite_classifier_epochs(64 * 51, 64), 30);
  EXPECT_EQ(sprite_classifier_epochs(64 * 52, 64), 29);
  // The procedural sprites (7,200 for training): 112 steps an epoch, ceil(1500 / 112) = 14.
  EXPECT_EQ(sprite_classifier_epochs(7200, 64), 14);
  // A large set: 1,500 steps are under 5 epochs, which it still gets.
  EXPECT_EQ(sprite_classifier_epochs(64 * 1000, 64), kSpriteClassifierMinEpochs);
  // Fewer sprites than a batch: one (short) step an epoch, the least steps decide.
  EXPECT_EQ(sprite_classifier_epochs(10, 64), kSpriteClassifierSteps);
  EXPECT_EQ(sprite_classifier_epochs(0, 64), kSpriteClassifierSteps);
}

TEST(Recipes, UnknownNamesAreRefusedWithTheKnownOnes) {
  EXPECT_EQ(find_recipe("fast").name, "fast");
  try {
    find_recipe("fastest");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown recipe 'fastest': expected one of fast"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace spritetorch::train
