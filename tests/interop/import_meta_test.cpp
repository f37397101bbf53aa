#include "interop/import_meta.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace spritetorch::interop {
namespace {

TEST(ImportMeta, AnExportsMetadataFillsWhatTheCallerLeftOpen) {
  TensorFile state;
  state.metadata["spritetorch"] =
      nlohmann::json{{"dataset", "dummy"}, {"model", "simplenn"}}.dump();
  train::TrainConfig flags;
  flags.model.clear();
  flags.seed = 11;
  const auto got = import_meta(state, "py.safetensors", flags, /*given=*/{});
  EXPECT_EQ(got.config.dataset, "dummy");
  EXPECT_EQ(got.spec.name, "simplenn");
  EXPECT_EQ(got.spec.input_shape, std::vector<int64_t>{3});  // the dummy data's features
  EXPECT_EQ(got.spec.classes, 2);
  EXPECT_EQ(got.meta.at("dataset"), "dummy");
  EXPECT_EQ(got.meta.at("seed"), 11);
  EXPECT_EQ(got.meta.at("epoch"), 0);
  EXPECT_EQ(got.meta.at("imported_from"), "py.safetensors");
  EXPECT_EQ(got.meta.at("class_names").size(), static_cast<size_t>(got.spec.classes));
  EXPECT_FALSE(got.meta.contains("sprites"));

  // What the caller chose wins over the file's metadata.
  flags.model = "ann";
  EXPECT_EQ(import_meta(state, "py.safetensors", flags, {"--model"}).spec.name, "ann");
}

// Without metadata or --model: cnn for sprite datasets, whose options go into the checkpoint.
TEST(ImportMeta, WithNothingToGoOnSpriteDatasetsGetTheCnn) {
  train::TrainConfig flags;
  flags.model.clear();
  flags.dataset = "sprites";
  flags.sprites.count = 40;
  const auto got =
      import_meta(TensorFile{}, "py.safetensors", flags, {"--dataset", "--sprite-count"});
  EXPECT_EQ(got.spec.name, "cnn");
  EXPECT_EQ(got.spec.input_shape, (std::vector<int64_t>{4, 16, 16}));
  EXPECT_EQ(got.meta.at("sprites").at("count"), 40);
}

TEST(ImportMeta, MetadataThatIsNotAJsonObjectIsADataError) {
  TensorFile state;
  state.metadata["spritetorch"] = "not json";
  train::TrainConfig flags;
  flags.dataset = "dummy";
  EXPECT_THROW(import_meta(state, "py.safetensors", flags, {"--dataset"}), DataError);
}

std::string import_error(const nlohmann::json& metadata, const train::TrainConfig& flags,
                         const std::set<std::string>& given) {
  TensorFile state;
  state.metadata["spritetorch"] = metadata.dump();
  try {
    import_meta(state, "views.safetensors", flags, given);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The sprite options an export recorded are the weights' own: a flag that says otherwise is
// refused with both values (it was silently replaced by the metadata's), one that agrees passes.
TEST(ImportMeta, GivenSpriteOptionsMustAgreeWithTheMetadata) {
  const nlohmann::json metadata{{"dataset", "sprites"},
                                {"model", "cnn"},
                                {"sprites", {{"size", 32}, {"count", 40}, {"holdout", 0.25}}}};
  train::TrainConfig flags;
  flags.model.clear();
  EXPECT_EQ(import_error(metadata, flags, {"--size"}),
            "--size 16: the metadata of views.safetensors records --size 32 for sprites");
  flags.sprites.holdout = 0.5;
  EXPECT_EQ(import_error(metadata, flags, {"--holdout"}),
            "--holdout 0.5: the metadata of views.safetensors records --holdout 0.25 for sprites");
  flags.sprites.holdout = 0.25;
  flags.sprites.size = 32;
  TensorFile state;
  state.metadata["spritetorch"] = metadata.dump();
  const auto got = import_meta(state, "views.safetensors", flags, {"--size", "--holdout"});
  EXPECT_EQ(got.spec.input_shape, (std::vector<int64_t>{4, 32, 32}));
  EXPECT_EQ(got.config.sprites.count, 40);  // not given: the metadata's
  // An option the recorded dataset does not read is refused, not dropped with the rest.
  flags.sprites.tile_w = 8;
  EXPECT_NE(import_error(metadata, flags, {"--tile"}).find("--tile applies to sprite sheets"),
            std::string::npos);
  // --dataset naming other data than the metadata's takes the command line's options.
  flags.sprites = {};
  flags.dataset = "sprites";
  flags.sprites.count = 30;
  TensorFile elsewhere;
  elsewhere.metadata["spritetorch"] =
      nlohmann::json{{"dataset", "folder:views"}, {"sprites", {{"size", 32}}}}.dump();
  const auto other =
      import_meta(elsewhere, "views.safetensors", flags, {"--dataset", "--sprite-count"});
  EXPECT_EQ(other.config.sprites.count, 30);
  EXPECT_EQ(other.spec.input_shape, (std::vector<int64_t>{4, 16, 16}));
}

// Hand-edited metadata: each wrong type or value is a DataError naming the file and the field,
// never nlohmann's own message or a flag the user did not give.
TEST(ImportMeta, MetadataOfTheWrongTypeOrRangeNamesTheFileAndTheField) {
  train::TrainConfig flags;
  flags.model.clear();
  const std::string file = "views.safetensors (__metadata__.spritetorch): expected metadata ";
  EXPECT_EQ(import_error({{"dataset", "sprites"}, {"sprites", {{"size", "big"}}}}, flags, {}),
            file + "'sprites.size' as an integer, found a JSON string (\"big\")");
  EXPECT_EQ(import_error({{"dataset", "sprites"}, {"sprites", {1, 2}}}, flags, {}),
            file + "'sprites' as a JSON object, found a JSON array");
  EXPECT_EQ(import_error({{"dataset", 7}}, flags, {}),
            file + "'dataset' as a string, found a JSON number (7)");
  EXPECT_EQ(import_error({{"model", {1}}}, flags, {}),
            file + "'model' as a string, found a JSON array ([1])");
  EXPECT_EQ(import_error({{"dataset", "sprites"}, {"sprites", {{"size", 17}}}}, flags, {}),
            file + "'sprites.size' 16, 32 or 64, found 17");
}

}  // namespace
}  // namespace spritetorch::interop
