// The defaults a run takes for what it leaves unset (train/recipe.h): the recipes and the epochs
// of a sprite classifier without --epochs.
#include <gtest/gtest.h>

#include "common/error.h"
#include "train/recipe.h"

namespace spritetorch::train {

TEST(SpriteClassifierEpochs, EnoughEpochsForTheStepsAndNeverFewerThanFive) {
  // The DCSS items: 954 training sprites, 14 steps of 64 an epoch -> ceil(500 / 14) = 36.
  EXPECT_EQ(sprite_classifier_epochs(954, 64), 36);
  // The procedural sprites (7,200 for training): 112 steps an epoch, 5 epochs are 560 steps.
  EXPECT_EQ(sprite_classifier_epochs(7200, 64), kSpriteClassifierMinEpochs);
  // Steps reached exactly, and one past them.
  EXPECT_EQ(sprite_classifier_epochs(64 * 100, 64), 5);
  EXPECT_EQ(sprite_classifier_epochs(64 * 99, 64), 6);
  // Fewer sprites than a batch: one (short) step an epoch.
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
