#include "train/checkpoint_dataset.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace spritetorch::train {
namespace {

TEST(CheckpointDataset, TheMetadataNamesTheDataAndOldCheckpointsGetTheDefaults) {
  // Before "dataset" was recorded: classifiers were Fashion-MNIST ones, generators sprite ones.
  EXPECT_EQ(checkpoint_data_config(nlohmann::json::object()).dataset, "fashion-mnist");
  EXPECT_EQ(checkpoint_data_config(nlohmann::json::object()).seed, 1u);
  EXPECT_EQ(checkpoint_data_config({{"task", "generate"}}).dataset, "sprites");
  EXPECT_EQ(checkpoint_data_config({{"task", "generate"}}).sprites.resize, "nearest");
  // A dataset that reads no sprite options gets their defaults, whatever the metadata says.
  EXPECT_EQ(checkpoint_data_config(nlohmann::json::object()).sprites.resize, "area");
  EXPECT_EQ(
      checkpoint_data_config({{"dataset", "dummy"}, {"sprites", {{"size", 32}}}}).sprites.size, 16);
  // A run from before sprite options were checked recorded them as passed, read or not: such a
  // checkpoint still evaluates (load_datasets takes its config), with what its dataset reads.
  const auto procedural_with_tile = checkpoint_data_config(
      {{"dataset", "sprites"}, {"sprites", {{"tile_w", 8}, {"count", 300}}}});
  EXPECT_EQ(procedural_with_tile.sprites.tile_w, 16);
  EXPECT_EQ(procedural_with_tile.sprites.count, 300);
  EXPECT_NO_THROW(
      data::check_sprite_options_apply(procedural_with_tile.dataset, procedural_with_tile.sprites));

  data::SpriteOptions sprites;
  sprites.size = 32;
  sprites.holdout = 0.25;
  sprites.seed = 99;
  const auto config = checkpoint_data_config(
      {{"dataset", "sheet:a.png"}, {"seed", 3}, {"sprites", data::sprite_options_json(sprites)}});
  EXPECT_EQ(config.dataset, "sheet:a.png");
  EXPECT_EQ(config.seed, 3u);
  EXPECT_EQ(config.sprites.size, 32);
  EXPECT_DOUBLE_EQ(config.sprites.holdout, 0.25);
  EXPECT_EQ(config.sprites.seed, 99u);
  EXPECT_EQ(config.sprites.resize, "area");  // the default, recorded
  sprites.resize = "nearest";
  EXPECT_EQ(checkpoint_data_config(
                {{"dataset", "sprites"}, {"sprites", data::sprite_options_json(sprites)}})
                .sprites.resize,
            "nearest");
  // A checkpoint from before sprites were resized by area means was trained on nearest neighbour.
  nlohmann::json old = data::sprite_options_json(sprites);
  old.erase("resize");
  EXPECT_EQ(checkpoint_data_config({{"dataset", "sprites"}, {"sprites", old}}).sprites.resize,
            "nearest");
}

std::string config_error(const nlohmann::json& meta) {
  try {
    checkpoint_data_config(meta, "ck.pt");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// A hand-edited checkpoint: the file and the field are named, never nlohmann's type_error or a
// flag the user did not give ("--size must be 16, 32 or 64").
TEST(CheckpointDataset, MetadataOfTheWrongTypeOrRangeNamesTheFileAndTheField) {
  EXPECT_EQ(config_error({{"task", 3}}),
            "ck.pt: expected metadata 'task' as a string, found a JSON number (3)");
  EXPECT_EQ(config_error({{"dataset", "folder:v"}, {"sprites", {{"size", "big"}}}}),
            "ck.pt: expected metadata 'sprites.size' as an integer, found a JSON string (\"big\")");
  EXPECT_EQ(config_error({{"dataset", "folder:v"}, {"sprites", nlohmann::json::array()}}),
            "ck.pt: expected metadata 'sprites' as a JSON object, found a JSON array");
  EXPECT_EQ(config_error({{"dataset", "folder:v"}, {"sprites", {{"size", 48}}}}),
            "ck.pt: expected metadata 'sprites.size' 16, 32 or 64, found 48");
  EXPECT_EQ(config_error({{"dataset", "sprites"}, {"sprites", {{"holdout", 2}}}}),
            "ck.pt: expected metadata 'sprites.holdout' from 0 to 0.95, found 2");
}

}  // namespace
}  // namespace spritetorch::train
