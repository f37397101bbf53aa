#include "models/conv3x3.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "common/small_gemm.h"
#include "models/bn_relu_pool.h"
#include "models/classifier.h"
#include "test_util.h"

namespace spritetorch::models {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const auto g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  const double scale = w.abs().max().item<double>();
  const double error = (g - w).abs().max().item<double>();
  EXPECT_LE(error, 2e-5 * (1 + scale))
      << what << ": largest difference " << error << " against values up to " << scale;
}

struct Grads {
  torch::Tensor y, dx, dw, db;
};

// conv3x3_avx2 (own = true) or LibTorch's conv2d on copies of x (channels_last, or NCHW with
// nchw), w and b, with `upstream` as the output's gradient.
Grads run(bool own, const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0,
          const torch::Tensor& upstream, bool nchw = false) {
  auto x = x0.clone(nchw ? at::MemoryFormat::Contiguous : kChannelsLast).requires_grad_(true);
  auto w = w0.clone().requires_grad_(true);
  torch::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : torch::Tensor();
  auto y = own ? conv3x3_avx2(x, w, b) : torch::conv2d(x, w, b, 1, 1);
  (y * upstream).sum().backward();
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : torch::Tensor()};
}

bool avx2_here() { return gemm::available(gemm::Kernel::avx2); }

// Whether conv3x3 takes the kernels here, with LibTorch's threads as they are (a build without
// OpenMP takes them only on one thread).
bool fused_here() {
  torch::nn::Conv2d probe(torch::nn::Conv2dOptions(8, 8, 3).padding(1));
  return conv3x3_fused(*probe, torch::zeros({1, 8, 2, 2}).contiguous(kChannelsLast));
}

// (batch, in channels, out channels, height, width, bias): fastcnn's two stages, a 2x one, a
// picture narrower than a block of 6 pixels, a panel of 8 channels left over (40 = 16 + 16 + 8),
// one pixel, a plane whose pixel count is no multiple of 6, two of the generator UNet's (rows
// of whole 8-pixel blocks for the NCHW transposes: 16 and 8 wide), and two whose weight gradient
// takes several strips of rows (up1's width at 32 x 32: strips of 10 rows; 256 channels 30 wide:
// strips of 3, the last of 1).
struct Shape {
  int64_t batch, cin, cout, h, w;
  bool bias;
};
const std::vector<Shape> kShapes = {
    {5, 16, 32, 14, 14, false}, {3, 32, 64, 7, 7, false},  {2, 64, 128, 4, 4, false},
    {2, 8, 8, 5, 3, true},      {4, 24, 40, 6, 9, true},   {9, 8, 16, 1, 1, true},
    {3, 16, 8, 11, 5, false},   {2, 96, 32, 16, 16, true}, {3, 64, 64, 8, 8, true},
    {1, 96, 8, 32, 32, false},  {2, 256, 8, 7, 30, true}};

TEST(Conv3x3, MatchesLibTorchForwardAndBackward) {
  if (!avx2_here()) GTEST_SKIP() << "no AVX2 here";
  for (const Shape& s : kShapes)
    for (bool nchw : {false, true}) {
      const std::string what = "B" + std::to_string(s.batch) + " " + std::to_string(s.cin) + "->" +
                               std::to_string(s.cout) + " " + std::to_string(s.h) + "x" +
                               std::to_string(s.w) + (s.bias ? " bias" : "") +
                               (nchw ? " NCHW" : " channels_last");
      torch::manual_seed(3);
      const auto x = torch::randn({s.batch, s.cin, s.h, s.w});
      const auto w = 0.2 * torch::randn({s.cout, s.cin, 3, 3});
      const auto b = s.bias ? torch::randn({s.cout}) : torch::Tensor();
      const auto upstream = torch::randn({s.batch, s.cout, s.h, s.w});
      const Grads own = run(true, x, w, b, upstream, nchw), ref = run(false, x, w, b, upstream);
      expect_close(own.y, ref.y, what + " output");
      expect_close(own.dx, ref.dx, what + " input gradient");
      expect_close(own.dw, ref.dw, what + " weight gradient");
      if (s.bias) expect_close(own.db, ref.db, what + " bias gradient");
      // The result and the input gradient in x's layout (a one-pixel plane is both).
      const auto layout = nchw && s.h * s.w > 1 ? at::MemoryFormat::Contiguous : kChannelsLast;
      EXPECT_TRUE(own.y.is_contiguous(layout)) << what;
      EXPECT_TRUE(own.dx.is_contiguous(layout)) << what;
    }
}

// The NCHW form only transposes what the kernels read and write: the same bits as channels_last.
TEST(Conv3x3, NchwGivesTheBitsOfChannelsLast) {
  if (!avx2_here()) GTEST_SKIP() << "no AVX2 here";
  for (const Shape& s : kShapes) {
    torch::manual_seed(4);
    const auto x = torch::randn({s.batch, s.cin, s.h, s.w});
    const auto w = 0.2 * torch::randn({s.cout, s.cin, 3, 3});
    const auto b = s.bias ? torch::randn({s.cout}) : torch::Tensor();
    const auto upstream = torch::randn({s.batch, s.cout, s.h, s.w});
    const Grads cl = run(true, x, w, b, upstream), nchw = run(true, x, w, b, upstream, true);
    EXPECT_TRUE(torch::equal(cl.y, nchw.y)) << s.cin << "->" << s.cout << " " << s.h << "x" << s.w;
    EXPECT_TRUE(torch::equal(cl.dx, nchw.dx)) << s.cin << "->" << s.cout;
    EXPECT_TRUE(torch::equal(cl.dw, nchw.dw)) << s.cin << "->" << s.cout;
    if (s.bias) {
      EXPECT_TRUE(torch::equal(cl.db, nchw.db)) << s.cin << "->" << s.cout;
    }
  }
}

// The images go over the threads and the weight gradient sums fixed groups in a fixed order: the
// same bits on one thread as on several.
TEST(Conv3x3, SameBitsOnAnyThreadCount) {
  if (!avx2_here()) GTEST_SKIP() << "no AVX2 here";
  torch::manual_seed(5);
  const auto x = torch::randn({11, 16, 9, 9}).contiguous(kChannelsLast);
  const auto w = 0.2 * torch::randn({32, 16, 3, 3});
  const auto b = torch::randn({32});
  const auto upstream = torch::randn({11, 32, 9, 9});
  const int before = at::get_num_threads();
  for (bool nchw : {false, true}) {
    at::set_num_threads(1);
    const Grads one = run(true, x, w, b, upstream, nchw);
    at::set_num_threads(std::max(2, before));
    const Grads many = run(true, x, w, b, upstream, nchw);
    at::set_num_threads(before);
    EXPECT_TRUE(torch::equal(one.y, many.y)) << nchw;
    EXPECT_TRUE(torch::equal(one.dx, many.dx)) << nchw;
    EXPECT_TRUE(torch::equal(one.dw, many.dw)) << nchw;
    EXPECT_TRUE(torch::equal(one.db, many.db)) << nchw;
  }
}

// Frozen weights (a fine-tune's feature layers): only the gradients wanted are made, with or
// without a bias.
TEST(Conv3x3, FrozenWeightsGiveTheInputGradientAlone) {
  if (!avx2_here()) GTEST_SKIP() << "no AVX2 here";
  torch::manual_seed(9);
  const auto x0 = torch::randn({3, 8, 5, 6}).contiguous(kChannelsLast);
  const auto w = 0.2 * torch::randn({16, 8, 3, 3});
  const auto upstream = torch::randn({3, 16, 5, 6});
  for (bool with_bias : {false, true}) {
    const auto b = with_bias ? torch::randn({16}) : torch::Tensor();
    auto x = x0.clone(kChannelsLast).requires_grad_(true);
    (conv3x3_avx2(x, w, b) * upstream).sum().backward();
    auto x_ref = x0.clone().requires_grad_(true);
    (torch::conv2d(x_ref, w, b, 1, 1) * upstream).sum().backward();
    expect_close(x.grad(), x_ref.grad(), with_bias ? "input gradient, bias" : "input gradient");
  }
  // And the weights alone, the input frozen.
  auto wg = w.clone().requires_grad_(true);
  (conv3x3_avx2(x0, wg, torch::Tensor()) * upstream).sum().backward();
  auto wg_ref = w.clone().requires_grad_(true);
  (torch::conv2d(x0, wg_ref, {}, 1, 1) * upstream).sum().backward();
  expect_close(wg.grad(), wg_ref.grad(), "weight gradient, input frozen");
}

// A NaN in the input reaches the outputs its window covers, as in LibTorch's convolution.
TEST(Conv3x3, NanReachesItsWindow) {
  if (!avx2_here()) GTEST_SKIP() << "no AVX2 here";
  auto x = torch::ones({1, 8, 5, 5});
  x[0][3][2][2] = std::numeric_limits<float>::quiet_NaN();
  x = x.contiguous(kChannelsLast);
  const auto y = conv3x3_avx2(x, torch::ones({8, 8, 3, 3}), torch::Tensor());
  const auto nan = torch::isnan(y[0][0]);
  EXPECT_EQ(nan.sum().item<int64_t>(), 9);  // the 3x3 outputs around (2, 2)
  EXPECT_TRUE(nan[1][1].item<bool>() && nan[3][3].item<bool>());
  EXPECT_FALSE(nan[0][0].item<bool>() || nan[4][4].item<bool>());
}

torch::nn::Conv2d make_conv(torch::nn::Conv2dOptions options) {
  torch::manual_seed(7);
  return torch::nn::Conv2d(options);
}

// conv3x3 takes the kernels only where every condition holds, and gives LibTorch's result (within
// rounding) either way.
TEST(Conv3x3, TakenWhereTheConditionsHold) {
  using torch::nn::Conv2dOptions;
  const bool kernels = fused_here();
  EXPECT_EQ(kernels, conv3x3_code() == "avx2" && fused_ops_use_these_threads());
  auto conv = make_conv(Conv2dOptions(16, 32, 3).padding(1).bias(false));
  const auto x = torch::randn({2, 16, 6, 6});
  const auto x_cl = x.contiguous(kChannelsLast);
  EXPECT_EQ(conv3x3_fused(*conv, x_cl), kernels);
  EXPECT_EQ(conv3x3_fused(*conv, x), kernels);            // NCHW
  EXPECT_FALSE(conv3x3_fused(*conv, x.transpose(2, 3)));  // neither layout
  EXPECT_FALSE(conv3x3_fused(*conv, x.narrow(3, 0, 4)));  // a view with gaps
  EXPECT_FALSE(conv3x3_fused(*conv, x_cl.to(torch::kBFloat16)));
  EXPECT_FALSE(conv3x3_fused(*make_conv(Conv2dOptions(16, 32, 3).padding(1).stride(2)), x_cl));
  EXPECT_FALSE(conv3x3_fused(*make_conv(Conv2dOptions(16, 32, 3)), x_cl));  // no padding
  EXPECT_FALSE(conv3x3_fused(
      *make_conv(Conv2dOptions(16, 32, 3).padding(1).padding_mode(torch::kReflect)), x_cl));
  EXPECT_FALSE(conv3x3_fused(*make_conv(Conv2dOptions(16, 32, 3).padding(1).groups(2)), x_cl));
  EXPECT_FALSE(conv3x3_fused(*make_conv(Conv2dOptions(16, 32, 5).padding(2)), x_cl));
  EXPECT_FALSE(conv3x3_fused(*make_conv(Conv2dOptions(1, 32, 3).padding(1)),
                             torch::randn({2, 1, 6, 6}).contiguous(kChannelsLast)));
  EXPECT_FALSE(conv3x3_fused(*make_conv(Conv2dOptions(16, 12, 3).padding(1)), x_cl));
  set_conv3x3_kernel(false);
  EXPECT_FALSE(conv3x3_fused(*conv, x_cl));
  EXPECT_EQ(conv3x3_code(), "off");
  const auto libtorch = conv3x3(*conv, x_cl);
  set_conv3x3_kernel(true);
  expect_close(conv3x3(*conv, x_cl), libtorch, "conv3x3 against conv->forward");
  expect_close(conv3x3(*conv, x), libtorch, "conv3x3 on NCHW");
}

// The model the kernels are for: a fastcnn training step in channels_last gives the gradients of
// the same step through LibTorch's convolutions.
TEST(Conv3x3, FastCnnStepMatchesLibTorchConvolutions) {
  const testing::OneThreadUnless threads(fused_here());  // a build without OpenMP: one thread
  if (!fused_here()) GTEST_SKIP() << "the kernels do not run here";
  ModelSpec spec;
  spec.name = "fastcnn";
  spec.input_shape = {1, 28, 28};
  spec.classes = 10;
  torch::manual_seed(11);
  const auto x = torch::randn({16, 1, 28, 28}).contiguous(kChannelsLast);
  const auto labels = torch::randint(0, 10, {16});
  std::vector<std::vector<torch::Tensor>> grads;
  for (bool own : {true, false}) {
    torch::manual_seed(13);
    Classifier model = make_model(spec);
    for (auto& p : model->parameters())
      if (p.dim() == 4) p.set_data(p.data().contiguous(kChannelsLast));
    model->train();
    set_conv3x3_kernel(own);
    torch::nn::functional::cross_entropy(model->forward(x), labels).backward();
    set_conv3x3_kernel(true);
    std::vector<torch::Tensor> g;
    for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
    grads.push_back(g);
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i)
    expect_close(grads[0][i], grads[1][i], "parameter " + std::to_string(i));
}

}  // namespace
}  // namespace spritetorch::models
