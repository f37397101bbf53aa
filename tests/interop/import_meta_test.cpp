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
  const auto got = import_meta(state, "py.safetensors", flags, /*dataset_given=*/false);
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
  EXPECT_EQ(import_meta(state, "py.safetensors", flags, false).spec.name, "ann");
}

// Without metadata or --model: cnn for sprite datasets, whose options go into the checkpoint.
TEST(ImportMeta, WithNothingToGoOnSpriteDatasetsGetTheCnn) {
  train::TrainConfig flags;
  flags.model.clear();
  flags.dataset = "sprites";
  flags.sprites.count = 40;
  const auto got = import_meta(TensorFile{}, "py.safetensors", flags, /*dataset_given=*/true);
  EXPECT_EQ(got.spec.name, "cnn");
  EXPECT_EQ(got.spec.input_shape, (std::vector<int64_t>{4, 16, 16}));
  EXPECT_EQ(got.meta.at("sprites").at("count"), 40);
}

TEST(ImportMeta, MetadataThatIsNotAJsonObjectIsADataError) {
  TensorFile state;
  state.metadata["spritetorch"] = "not json";
  train::TrainConfig flags;
  flags.dataset = "dummy";
  EXPECT_THROW(import_meta(state, "py.safetensors", flags, true), DataError);
}

}  // namespace
}  // namespace spritetorch::interop
