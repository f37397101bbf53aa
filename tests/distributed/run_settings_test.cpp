// The settings the ranks of a ddp run compare at start-up (ParallelRun::check_same_settings): a
// fixed-size encoding that survives the exchange, and the first difference found.
#include <gtest/gtest.h>

#include "train/parallel.h"

namespace spritetorch::train {
namespace {

TEST(RunSettings, EncodingRoundTripsWithinTheFixedSize) {
  const RunSettings settings = {{"--model", "cnn"}, {"--batch-size", "64"}, {"--lr", "0.001"}};
  std::string bytes = encode_run_settings(settings);
  ASSERT_LE(bytes.size(), kRunSettingsBytes);
  bytes.resize(kRunSettingsBytes, '\0');  // as the broadcast buffer carries it
  EXPECT_EQ(decode_run_settings(bytes), settings);
  EXPECT_TRUE(decode_run_settings(std::string(kRunSettingsBytes, '\0')).empty());
  // Too many to fit: whole entries are kept, none cut in the middle.
  RunSettings many(2000, {"--some-setting", "a value"});
  const auto kept = decode_run_settings(encode_run_settings(many));
  EXPECT_LT(kept.size(), many.size());
  for (const auto& entry : kept) EXPECT_EQ(entry, many.front());
}

TEST(RunSettings, FirstDifferenceIsFound) {
  const RunSettings root = {{"--model", "cnn"}, {"--batch-size", "64"}, {"--epochs", "2"}};
  EXPECT_EQ(first_differing_setting(root, root), -1);
  RunSettings mine = root;
  mine[1].second = "32";
  mine[2].second = "1";
  EXPECT_EQ(first_differing_setting(mine, root), 1);
  mine = root;
  mine.pop_back();  // another version of spritetorch compares fewer
  EXPECT_EQ(first_differing_setting(mine, root), 2);
  EXPECT_EQ(first_differing_setting(root, mine), 2);
}

TEST(RunSettings, HashIsStableAndShort) {
  EXPECT_EQ(settings_hash(""), "cbf29ce484222325");  // FNV-1a's offset basis
  EXPECT_EQ(settings_hash("[3, 3] [3]").size(), 16u);
  EXPECT_NE(settings_hash("[3, 3] [3]"), settings_hash("[3, 3] [4]"));
}

}  // namespace
}  // namespace spritetorch::train
