// picture_to_input: what `classify` feeds a model must be what the model was trained on.
#include "data/picture.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "io/png.h"
#include "models/classifier.h"

namespace spritetorch::data {
namespace {

// (h, w) uint8 grey -> (h, w, 4) RGBA, grey in R = G = B, opaque: a grey PNG as read_png gives it.
torch::Tensor grey_as_rgba(const torch::Tensor& grey) {
  return torch::stack({grey, grey, grey, torch::full_like(grey, 255)}, 2);
}

torch::Tensor random_grey(int64_t h, int64_t w, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, 256, {h, w}, torch::kUInt8);
}

TEST(Picture, GreyPictureOfAFashionMnistImageIsThatImage) {
  const auto image = random_grey(28, 28, 1);  // as stored: (1, 28, 28) per sample
  const auto input = picture_to_input(grey_as_rgba(image), {1, 28, 28});
  ASSERT_EQ(input.sizes(), (std::vector<int64_t>{1, 1, 28, 28}));
  EXPECT_EQ(input.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(input[0][0], image));
}

TEST(Picture, InvertUndoesADarkOnLightPicture) {
  const auto image = random_grey(28, 28, 2);
  const auto inverted = (255 - image.to(torch::kInt32)).to(torch::kUInt8);
  EXPECT_TRUE(
      torch::equal(picture_to_input(grey_as_rgba(inverted), {1, 28, 28}, true)[0][0], image));
  EXPECT_FALSE(
      torch::equal(picture_to_input(grey_as_rgba(inverted), {1, 28, 28}, false)[0][0], image));
}

TEST(Picture, LargerPicturesAreAveragedOverAreasSmallerOnesRepeated) {
  const auto image = random_grey(28, 28, 3);
  // Each pixel as a 2x2 block: the area means give the image back exactly.
  const auto doubled = image.repeat_interleave(2, 0).repeat_interleave(2, 1);
  EXPECT_TRUE(torch::equal(picture_to_input(grey_as_rgba(doubled), {1, 28, 28})[0][0], image));
  // A 2x2 checkerboard of 0 and 255 averages to 127.5 -> 128 (not a sampled 0 or 255).
  const auto checker = torch::tensor({0, 255, 255, 0}, torch::kUInt8).view({2, 2}).repeat({14, 14});
  EXPECT_TRUE((picture_to_input(grey_as_rgba(checker), {1, 14, 14}) == 128).all().item<bool>());
  // A 14x14 picture up to 28x28: every pixel repeated 2x2.
  const auto small = random_grey(14, 14, 4);
  EXPECT_TRUE(torch::equal(picture_to_input(grey_as_rgba(small), {1, 28, 28})[0][0],
                           small.repeat_interleave(2, 0).repeat_interleave(2, 1)));
}

TEST(Picture, ColourIsLuminanceOverBlack) {
  auto rgba = torch::zeros({1, 3, 4}, torch::kUInt8);
  rgba[0][0] = torch::tensor({255, 0, 0, 255}, torch::kUInt8);    // red: 0.299 * 255 = 76.2
  rgba[0][1] = torch::tensor({0, 0, 255, 255}, torch::kUInt8);    // blue: 0.114 * 255 = 29.1
  rgba[0][2] = torch::tensor({255, 255, 255, 0}, torch::kUInt8);  // transparent white: black
  const auto grey = picture_to_input(rgba, {1, 1, 3})[0][0][0];
  EXPECT_EQ(grey[0].item<int>(), 76);
  EXPECT_EQ(grey[1].item<int>(), 29);
  EXPECT_EQ(grey[2].item<int>(), 0);
  const auto rgb = picture_to_input(rgba, {3, 1, 3})[0];  // RGB models: channels kept, over black
  EXPECT_TRUE(torch::equal(rgb.select(2, 0).flatten(), torch::tensor({255, 0, 0}, torch::kUInt8)));
}

// Sprite models take the RGBA pixels resized as their training set was: up by repetition, down
// by area means ("area") or by nearest neighbour (checkpoints that record "nearest" or nothing).
TEST(Picture, SpriteModelsTakeRgbaResizedAsTheirTrainingSetWas) {
  torch::manual_seed(5);
  const auto sprite = torch::randint(0, 256, {8, 8, 4}, torch::kUInt8);
  const auto nchw = sprite.permute({2, 0, 1}).unsqueeze(0);
  EXPECT_TRUE(torch::equal(picture_to_input(sprite, {4, 16, 16}), io::resize_nearest(nchw, 16)));
  EXPECT_TRUE(torch::equal(picture_to_input(sprite, {4, 4, 4}), io::resize_area(nchw, 4)));
  EXPECT_FALSE(torch::equal(picture_to_input(sprite, {4, 4, 4}), io::resize_nearest(nchw, 4)));
  EXPECT_TRUE(torch::equal(picture_to_input(sprite, {4, 4, 4}, false, "nearest"),
                           io::resize_nearest(nchw, 4)));
}

// A picture already of the model's size is not resized, and still comes as a contiguous batch:
// the MLPs flattened it with view(), which a permuted view of the pixels cannot take.
TEST(Picture, ASpriteOfTheModelsSizeIsAContiguousBatchAnMlpTakes) {
  torch::manual_seed(6);
  const auto sprite = torch::randint(0, 256, {16, 16, 4}, torch::kUInt8);
  const auto input = picture_to_input(sprite, {4, 16, 16});
  EXPECT_TRUE(input.is_contiguous());
  EXPECT_TRUE(torch::equal(input, sprite.permute({2, 0, 1}).unsqueeze(0)));
  const auto ann = std::make_shared<models::AnnImpl>(4 * 16 * 16, 3);
  EXPECT_EQ(ann->forward(input.to(torch::kFloat32)).sizes(), (std::vector<int64_t>{1, 3}));
  // The models take a non-contiguous batch too (a user's own tensors).
  const auto permuted = torch::rand({1, 16, 16, 4}).permute({0, 3, 1, 2});
  ASSERT_FALSE(permuted.is_contiguous());
  EXPECT_TRUE(torch::allclose(ann->forward(permuted), ann->forward(permuted.contiguous())));
  const auto simple = std::make_shared<models::SimpleNnImpl>(4 * 16 * 16, 3);
  EXPECT_EQ(simple->forward(permuted).sizes(), (std::vector<int64_t>{1, 3}));
}

TEST(Picture, ShapesThatAreNotPicturesAreErrors) {
  const auto rgba = torch::zeros({4, 4, 4}, torch::kUInt8);
  EXPECT_THROW(picture_to_input(rgba, {784}), Error);       // a flat feature model
  EXPECT_THROW(picture_to_input(rgba, {2, 4, 4}), Error);   // two channels
  EXPECT_THROW(picture_to_input(rgba, {4, 8, 16}), Error);  // a non-square sprite model
  EXPECT_THROW(picture_to_input(torch::zeros({4, 4, 3}, torch::kUInt8), {1, 4, 4}), Error);
}

}  // namespace
}  // namespace spritetorch::data
