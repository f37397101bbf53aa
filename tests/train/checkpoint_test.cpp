#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/error.h"
#include "test_util.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

Checkpoint sample_checkpoint(const models::Classifier& model) {
  Checkpoint c;
  c.meta = {{"model", "ann"}, {"input_shape", {1, 28, 28}}, {"classes", 10}, {"epoch", 3}};
  c.model = model_state(*model);
  c.optimizer["step"] = torch::tensor({42}, torch::kInt64);
  return c;
}

std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, RoundTripReproducesPredictions) {
  ScratchDir dir;
  torch::manual_seed(2);
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  save_checkpoint(dir.file("c.pt"), sample_checkpoint(model));
  const auto loaded = load_checkpoint(dir.file("c.pt"));
  EXPECT_EQ(loaded.meta.at("epoch").get<int>(), 3);
  EXPECT_EQ(loaded.optimizer.at("step").item<int64_t>(), 42);
  auto restored = model_from_checkpoint(loaded, dir.file("c.pt"), torch::kCPU);
  const auto x = torch::rand({9, 1, 28, 28});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model->forward(x), restored->forward(x)));
}

TEST(Checkpoint, RejectsForeignTruncatedAndCorruptFiles) {
  ScratchDir dir;
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  save_checkpoint(dir.file("good.pt"), sample_checkpoint(model));
  std::ifstream in(dir.file("good.pt"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  spritetorch::testing::write_bytes(dir.file("foreign.pt"), {'P', 'K', 3, 4, 0, 0, 0, 0});
  EXPECT_NE(load_error(dir.file("foreign.pt")).find("expected a spritetorch checkpoint"),
            std::string::npos);

  std::ofstream(dir.file("short.pt"), std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  EXPECT_NE(load_error(dir.file("short.pt")).find("truncated"), std::string::npos);

  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  std::ofstream(dir.file("flipped.pt"), std::ios::binary)
      .write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  EXPECT_NE(load_error(dir.file("flipped.pt")).find("corrupt"), std::string::npos);

  std::string future = bytes;
  future[16] = 99;  // version
  std::ofstream(dir.file("future.pt"), std::ios::binary)
      .write(future.data(), static_cast<std::streamsize>(future.size()));
  EXPECT_NE(load_error(dir.file("future.pt")).find("version 99"), std::string::npos);
}

TEST(Checkpoint, PeekReadsTheMetadataAloneAndNothingElse) {
  ScratchDir dir;
  Checkpoint c;
  c.meta = {{"model", "cnn"}, {"epoch", 3}};
  c.model["w"] = torch::ones({1000, 100});
  save_checkpoint(dir.file("c.pt"), c);
  const auto meta = peek_checkpoint_meta(dir.file("c.pt"));
  ASSERT_TRUE(meta.has_value());
  EXPECT_EQ(*meta, c.meta);
  // The weights may be corrupt (only the full load checks the CRC); the metadata is still read.
  std::string bytes;
  {
    std::ifstream in(dir.file("c.pt"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 5] ^= 0x55;
  std::ofstream(dir.file("flipped.pt"), std::ios::binary) << bytes;
  EXPECT_EQ(peek_checkpoint_meta(dir.file("flipped.pt")), c.meta);
  EXPECT_THROW(load_checkpoint(dir.file("flipped.pt")), DataError);
  // Not a checkpoint, too short, or missing: nothing.
  std::ofstream(dir.file("text.pt")) << "hello, this is not a checkpoint at all";
  EXPECT_FALSE(peek_checkpoint_meta(dir.file("text.pt")).has_value());
  std::ofstream(dir.file("short.pt"), std::ios::binary) << bytes.substr(0, 20);
  EXPECT_FALSE(peek_checkpoint_meta(dir.file("short.pt")).has_value());
  EXPECT_FALSE(peek_checkpoint_meta(dir.file("missing.pt")).has_value());
}

TEST(Checkpoint, AFolderIsADataErrorNotAStreamFailure) {
  ScratchDir dir;
  const std::string expected = dir.path().string() + ": expected a checkpoint file, found a folder";
  EXPECT_EQ(load_error(dir.path().string()), expected);
  try {
    peek_checkpoint_meta(dir.path().string());
    ADD_FAILURE() << "peek_checkpoint_meta read a folder";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

TEST(Checkpoint, WrongShapesAreNamed) {
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  auto state = model_state(*model);
  state["fc2.weight"] = torch::zeros({3, 3});
  try {
    load_model_state(*model, state, "x.pt");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("fc2.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spritetorch::train
