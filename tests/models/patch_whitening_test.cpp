// --first-conv whitened (models/patch_whitening.h): the filters whiten the images' patches, come
// in sign pairs, and the Trainer keeps them frozen through training and resume.
#include "models/patch_whitening.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "data/dataset.h"
#include "device/device.h"
#include "models/classifier.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

#include <algorithm>

namespace spritetorch::models {
namespace {

namespace F = torch::nn::functional;
using spritetorch::testing::ScratchDir;

// Images whose neighbouring pixels are correlated (noise smoothed by a 2 x 2 box), so that their
// 3x3 patches have a covariance far from the identity: (N, C, 12, 12).
torch::Tensor smooth_images(int64_t n, int64_t channels) {
  torch::manual_seed(3);
  const auto noise = torch::rand({n, channels, 13, 13});
  return F::avg_pool2d(noise, F::AvgPool2dFuncOptions(2).stride(1)) * 0.8 + 0.1;
}

// The centred patches' covariance as a k x k convolution with that padding and stride sees them
// (LibTorch's unfold, not the function's own patches): (D, D) float64.
torch::Tensor patch_covariance(const torch::Tensor& images, int64_t kernel = 3, int64_t padding = 1,
                               int64_t stride = 1) {
  const int64_t dims = images.size(1) * kernel * kernel;
  auto p = F::unfold(images, F::UnfoldFuncOptions(kernel).padding(padding).stride(stride))
               .transpose(1, 2)
               .reshape({-1, dims})
               .to(torch::kFloat64);
  p = p - p.mean(0);
  return p.t().mm(p) / static_cast<double>(p.size(0));
}

TEST(PatchWhitening, TheFiltersDecorrelateThePatchesAndScaleThemToUnitVariance) {
  const auto images = smooth_images(200, 2);  // D = 18
  const auto filters = patch_whitening_filters(images, 36, 3, 1, 1, /*eps=*/0.0);
  ASSERT_EQ(filters.sizes(), (std::vector<int64_t>{36, 2, 3, 3}));
  const auto w = filters.reshape({36, 18}).to(torch::kFloat64);
  const auto half = w.narrow(0, 0, 18);
  // Every direction kept, eps 0: the filtered patches' covariance is the identity.
  const auto whitened = half.mm(patch_covariance(images)).mm(half.t());
  EXPECT_TRUE(torch::allclose(whitened, torch::eye(18, torch::kFloat64), 1e-3, 1e-3)) << whitened;
  EXPECT_TRUE(torch::equal(w.narrow(0, 18, 18), -half)) << "the second half: the negatives";
  // Each row's largest component is positive (the sign does not depend on LAPACK).
  for (int64_t i = 0; i < 18; ++i) {
    const auto row = half[i];
    EXPECT_GT(row[row.abs().argmax()].item<double>(), 0) << "row " << i;
  }
}

// Other kernels, paddings and strides, several channels: the patches are the ones the convolution
// sees, in its weight's order (channel, row, column). Stored uint8 images are scaled as batches.
TEST(PatchWhitening, OtherKernelsPaddingsAndStridesWhitenWhatTheConvolutionSees) {
  struct Case {
    int64_t channels, kernel, padding, stride;
  };
  for (const Case k : {Case{2, 2, 0, 2}, Case{1, 5, 2, 1}, Case{3, 3, 0, 3}}) {
    const auto images = smooth_images(300, k.channels);
    const int64_t dims = k.channels * k.kernel * k.kernel;
    const auto w = patch_whitening_filters(images, 2 * dims, k.kernel, k.padding, k.stride, 0.0)
                       .reshape({2 * dims, dims})
                       .narrow(0, 0, dims)
                       .to(torch::kFloat64);
    const auto whitened = w.mm(patch_covariance(images, k.kernel, k.padding, k.stride)).mm(w.t());
    EXPECT_TRUE(torch::allclose(whitened, torch::eye(dims, torch::kFloat64), 1e-3, 1e-3))
        << k.channels << " channels, kernel " << k.kernel << ", padding " << k.padding
        << ", stride " << k.stride << "\n"
        << whitened;
  }
  const auto stored = (smooth_images(40, 1) * 255).round().to(torch::kUInt8);
  EXPECT_TRUE(torch::allclose(patch_whitening_filters(stored, 18, 3),
                              patch_whitening_filters(data::to_model_input(stored), 18, 3), 1e-5,
                              1e-6));
  EXPECT_THROW(patch_whitening_filters(torch::rand({2, 1, 2, 2}), 18, 5, 0), Error)
      << "2x2 images hold no 5x5 patches";
}

// On CUDA the products are summed there, in one chunk: the same filters as on the CPU.
TEST(PatchWhitening, OnCudaTheSameFilters) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  const auto stored = (torch::rand({500, 1, 28, 28}) * 255).to(torch::kUInt8);
  const auto cpu = patch_whitening_filters(stored, 32, 3);
  const auto cuda = patch_whitening_filters(stored.to(torch::kCUDA), 32, 3);
  EXPECT_TRUE(cuda.device().is_cpu());
  EXPECT_TRUE(torch::allclose(cuda, cpu, 1e-4, 1e-5)) << (cuda - cpu).abs().max();
}

TEST(PatchWhitening, FewerFiltersKeepTheDirectionsOfLargestVarianceFirst) {
  const auto images = smooth_images(200, 1);  // D = 9
  const double eps = 5e-4;
  const auto all = patch_whitening_filters(images, 18, 3, 1, 1, eps).reshape({18, 9});
  const auto some = patch_whitening_filters(images, 8, 3, 1, 1, eps).reshape({8, 9});
  EXPECT_TRUE(torch::allclose(some.narrow(0, 0, 4), all.narrow(0, 0, 4), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(some.narrow(0, 4, 4), all.narrow(0, 9, 4), 1e-4, 1e-5));
  // The filtered variances are v / (v + eps): descending with v.
  const auto w = all.narrow(0, 0, 9).to(torch::kFloat64);
  const auto variances = w.mm(patch_covariance(images)).mm(w.t()).diagonal();
  for (int64_t i = 0; i + 1 < 9; ++i)
    EXPECT_GE(variances[i].item<double>(), variances[i + 1].item<double>() - 1e-9) << i;
  EXPECT_LT(variances[8].item<double>(), 0.999) << "eps must damp the smallest direction";
}

TEST(PatchWhitening, MoreChannelsThanDirectionsRepeatThemInOrderAndAnOddCountIsRefused) {
  const auto images = smooth_images(50, 1);  // 9 directions
  const auto all = patch_whitening_filters(images, 18, 3).reshape({18, 9});
  const auto wide = patch_whitening_filters(images, 32, 3).reshape({32, 9});  // 16 pairs
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_TRUE(torch::equal(wide[i], all[i % 9])) << "row " << i;
    EXPECT_TRUE(torch::equal(wide[16 + i], -all[i % 9])) << "row " << 16 + i;
  }
  EXPECT_THROW(patch_whitening_filters(images, 7, 3), Error);
}

TEST(PatchWhitening, SetsAndFreezesTheModelsFirstConvolution) {
  auto model = make_model({"fastcnn", {1, 28, 28}, 10});
  const auto stored = (torch::rand({64, 1, 28, 28}) * 255).to(torch::kUInt8);
  const std::string note = whiten_first_conv(*model, stored, "fastcnn");
  const auto params = model->named_parameters();
  const auto expected = patch_whitening_filters(data::to_model_input(stored), 16, 3);
  EXPECT_TRUE(torch::allclose(params["conv1.weight"], expected, 1e-6, 1e-7));
  EXPECT_FALSE(params["conv1.weight"].requires_grad());
  EXPECT_TRUE(params["conv2.weight"].requires_grad()) << "only the first convolution";
  EXPECT_NE(note.find("first 64 training images"), std::string::npos) << note;

  // 32 output channels (cnn, with a bias): the 9 directions repeated to 16 pairs, the bias zero.
  auto cnn = make_model({"cnn", {1, 28, 28}, 10});
  const std::string cnn_note = whiten_first_conv(*cnn, stored, "cnn");
  EXPECT_NE(cnn_note.find("their 9 directions repeated to 16"), std::string::npos) << cnn_note;
  const auto cnn_params = cnn->named_parameters();
  EXPECT_TRUE(torch::equal(cnn_params["conv1.bias"], torch::zeros({32})));
  EXPECT_FALSE(cnn_params["conv1.bias"].requires_grad());
  auto ann = make_model({"ann", {1, 28, 28}, 10});
  EXPECT_THROW(whiten_first_conv(*ann, stored, "ann"), Error) << "no convolution at all";
  auto three = make_model({"fastcnn", {3, 28, 28}, 10});
  EXPECT_THROW(whiten_first_conv(*three, stored, "fastcnn"), Error) << "1-channel images";
}

// Through the Trainer: the filters stay as they were set (AdamW's weight decay would shrink
// them), the optimizer takes the other parameters, and a resumed run must ask for the same.
TEST(PatchWhitening, StaysFrozenThroughTrainingAndResume) {
  ScratchDir dir;
  train::TrainConfig c;
  c.device = "cpu";
  c.dataset = "sprites";
  c.sprites.count = 200;
  c.model = "fastcnn";
  c.optimizer = "adamw";
  c.epochs = 1;
  c.batch_size = 32;
  c.first_conv = "whitened";
  c.save = dir.file("w.pt");
  const auto data = train::load_datasets(c);
  const auto expected =
      patch_whitening_filters(data::to_model_input(data.train.inputs.narrow(
                                  0, 0, std::min<int64_t>(kWhiteningImages, data.train.size()))),
                              16, 3);
  const auto report = spritetorch::run_training(c, data);
  std::string row;
  for (const auto& [key, value] : report.settings)
    if (key == "first convolution") row = value;
  EXPECT_NE(row.find("whitened 3x3 patches"), std::string::npos) << "the settings table says so";
  EXPECT_NE(row.find("counted as training time"), std::string::npos) << row;
  const auto checkpoint = train::load_checkpoint(c.save);
  EXPECT_EQ(checkpoint.meta.at("first_conv"), "whitened");
  EXPECT_TRUE(torch::allclose(checkpoint.model.at("conv1.weight"), expected, 1e-6, 1e-7));
  // The rest trained: the norm after it left its initial scale of 1.
  EXPECT_FALSE(torch::allclose(checkpoint.model.at("bn1.weight"), torch::ones({16}), 0, 1e-4));

  c.resume = c.save;
  c.save = dir.file("w2.pt");
  c.epochs = 2;
  spritetorch::run_training(c, data);
  EXPECT_TRUE(torch::allclose(train::load_checkpoint(c.save).model.at("conv1.weight"), expected,
                              1e-6, 1e-7));
  c.first_conv = "learned";
  c.epochs = 3;
  c.save = dir.file("w3.pt");
  try {
    spritetorch::run_training(c, data);
    ADD_FAILURE() << "resumed a whitened run with --first-conv learned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --first-conv whitened"),
              std::string::npos)
        << e.what();
  }
  // A checkpoint whose record of it is not one of the two: refused naming the file and the field.
  for (const nlohmann::json& value : {nlohmann::json("sideways"), nlohmann::json(7)}) {
    auto edited = train::load_checkpoint(dir.file("w.pt"));
    edited.meta["first_conv"] = value;
    train::save_checkpoint(dir.file("edited.pt"), edited);
    c.resume = dir.file("edited.pt");
    c.first_conv = "whitened";
    try {
      spritetorch::run_training(c, data);
      ADD_FAILURE() << "resumed from first_conv " << value.dump();
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("edited.pt"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("first_conv"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace spritetorch::models
