#include "models/bn_relu_pool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "models/classifier.h"
#include "precision/autocast_guard.h"
#include "test_util.h"

namespace spritetorch::models {
namespace {

// The vector kernels this CPU runs: the ones with a channels_last (NHWC) form.
std::vector<gemm::Kernel> nhwc_kernels_here() {
  std::vector<gemm::Kernel> out;
  for (gemm::Kernel k : {gemm::Kernel::avx2, gemm::Kernel::avx512})
    if (gemm::available(k)) out.push_back(k);
  return out;
}

// Every kernel this CPU runs: the loops and the vector kernels.
std::vector<gemm::Kernel> kernels_here() {
  std::vector<gemm::Kernel> out = {gemm::Kernel::loops};
  for (gemm::Kernel k : nhwc_kernels_here()) out.push_back(k);
  return out;
}

// Whether the op runs with LibTorch's threads as they are (testing::OneThreadUnless).
bool fused_with_these_threads() {
  torch::nn::BatchNorm2d probe(2);
  return bn_relu_pool_fused(*probe, torch::zeros({1, 2, 2, 2}));
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const auto g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  const double scale = w.abs().max().item<double>();
  const double error = (g - w).abs().max().item<double>();
  EXPECT_LE(error, tolerance * (1 + scale))
      << what << ": largest difference " << error << " against values up to " << scale;
}

// A norm with weights away from 1 and 0, one of them negative (the pool then picks the smallest
// input), and running statistics already moved.
torch::nn::BatchNorm2d make_norm(int64_t channels, uint64_t seed,
                                 torch::nn::BatchNorm2dOptions options = {0}) {
  torch::manual_seed(seed);
  options.num_features(channels);
  torch::nn::BatchNorm2d bn(options);
  torch::NoGradGuard no_grad;
  bn->weight.copy_(1 + 0.5 * torch::randn({channels}));
  bn->weight[0] = -0.7;
  bn->bias.copy_(0.3 * torch::randn({channels}));
  bn->running_mean.copy_(torch::randn({channels}));
  bn->running_var.copy_(1 + torch::rand({channels}));
  return bn;
}

struct Result {
  torch::Tensor y, dx, dweight, dbias, running_mean, running_var, batches;
};

// Forward and backward of bn_relu_pool (fused with `kernel`, or LibTorch's ops) on a copy of x.
Result run(bool fused, gemm::Kernel kernel, const torch::Tensor& x, const torch::Tensor& upstream,
           uint64_t seed, torch::nn::BatchNorm2dOptions options = {0}) {
  auto bn = make_norm(x.size(1), seed, options);
  auto leaf = x.detach().clone().requires_grad_();
  set_bn_relu_pool_fusion(fused);
  EXPECT_EQ(bn_relu_pool_fused(*bn, leaf, kernel), fused);
  Result r;
  r.y = fused ? bn_relu_pool(*bn, leaf, kernel) : bn_relu_pool_reference(*bn, leaf);
  set_bn_relu_pool_fusion(true);
  r.y.backward(upstream);
  r.dx = leaf.grad();
  r.dweight = bn->weight.grad();
  r.dbias = bn->bias.grad();
  r.running_mean = bn->running_mean.clone();
  r.running_var = bn->running_var.clone();
  r.batches = bn->num_batches_tracked.clone();
  return r;
}

void expect_same(const Result& got, const Result& want, double tolerance, const std::string& what) {
  expect_close(got.y, want.y, tolerance, what + " output");
  expect_close(got.dx, want.dx, tolerance, what + " dx");
  expect_close(got.dweight, want.dweight, tolerance, what + " dweight");
  expect_close(got.dbias, want.dbias, tolerance, what + " dbias");
  expect_close(got.running_mean, want.running_mean, 1e-5, what + " running mean");
  expect_close(got.running_var, want.running_var, 1e-5, what + " running var");
  EXPECT_TRUE(torch::equal(got.batches, want.batches)) << what << " num_batches_tracked";
}

// Output, every gradient and the running statistics against LibTorch's batch_norm, relu and
// max_pool2d for these kernels, fp32 and bf16, x in `layout`.
void expect_matches_the_libtorch_ops(const std::vector<std::vector<int64_t>>& shapes,
                                     const std::vector<gemm::Kernel>& kernels,
                                     torch::MemoryFormat layout) {
  for (const auto& shape : shapes)
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16})
      for (gemm::Kernel kernel : kernels) {
        torch::manual_seed(shape[3]);
        const auto x = (torch::randn(shape) * 2 + 0.7).to(dtype).contiguous(layout);
        const auto upstream = torch::randn({shape[0], shape[1], shape[2] / 2, shape[3] / 2})
                                  .to(dtype)
                                  .contiguous(layout);
        const std::string what = std::string(gemm::kernel_name(kernel)) + " " +
                                 c10::toString(dtype) + " " + c10::str(torch::IntArrayRef(shape)) +
                                 " " + c10::toString(layout);
        if (dtype == torch::kFloat32) {
          const Result got = run(true, kernel, x, upstream, 7);
          EXPECT_TRUE(got.y.is_contiguous(layout)) << what;
          EXPECT_TRUE(got.dx.is_contiguous(layout)) << what;
          expect_same(got, run(false, kernel, x, upstream, 7), 2e-5, what);
          continue;
        }
        // bf16: against LibTorch's ops in fp32 on the same values. (LibTorch's bf16 ops compare
        // the norm's outputs rounded to bf16, so values that round alike tie there and the pool
        // picks the first; the fused op compares them in fp32.)
        Result got = run(true, kernel, x, upstream, 7);
        EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16) << what;
        EXPECT_EQ(got.dx.scalar_type(), torch::kBFloat16) << what;
        got.y = got.y.to(torch::kFloat32);
        got.dx = got.dx.to(torch::kFloat32);
        const Result want =
            run(false, kernel, x.to(torch::kFloat32), upstream.to(torch::kFloat32), 7);
        expect_same(got, want, 1e-2, what);
        // Rounded to nearest, not truncated: the fp32 values rounded to bf16, but for the rare
        // one the two computations' last-bit differences put on the other side of a rounding.
        const auto rounded = want.y.to(torch::kBFloat16).to(torch::kFloat32);
        EXPECT_LT(got.y.ne(rounded).to(torch::kFloat64).mean().item<double>(), 0.01) << what;
      }
}

// NCHW, every kernel here: fastcnn's stage shapes, odd heights and widths (the pool drops the last
// row and column, the norm does not), and rows of more than 16 windows with a tail (the AVX-512
// code's 16 lanes).
TEST(BnReluPool, MatchesTheLibTorchOpsForwardAndBackward) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  expect_matches_the_libtorch_ops(
      {{4, 3, 28, 28}, {3, 5, 7, 7}, {2, 4, 6, 9}, {2, 2, 5, 70}, {1, 3, 2, 2}}, kernels_here(),
      torch::MemoryFormat::Contiguous);
}

// channels_last, the AVX-512 and AVX2 forms (16 and 8 channels a vector): fastcnn's stages,
// channel counts short of and past a multiple of 16 and of 8, odd heights and widths.
TEST(BnReluPool, ChannelsLastMatchesTheLibTorchOps) {
  if (nhwc_kernels_here().empty()) GTEST_SKIP() << "no AVX2 or AVX-512 here";
  const testing::OneThreadUnless threads(fused_with_these_threads());
  expect_matches_the_libtorch_ops({{4, 16, 28, 28},
                                   {3, 32, 14, 14},
                                   {5, 64, 7, 7},
                                   {2, 3, 6, 9},
                                   {2, 20, 5, 7},
                                   {2, 12, 4, 6},
                                   {1, 33, 2, 2}},
                                  nhwc_kernels_here(), torch::MemoryFormat::ChannelsLast);
}

// Whole-number inputs make many windows with equal values: the gradient must reach the element
// LibTorch's max-pool picks (the first maximum in row-major order), and a window whose maximum
// ReLU cut must pass none.
TEST(BnReluPool, TiesSendTheGradientWhereLibTorchDoes) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  torch::manual_seed(3);
  const auto x = torch::randint(-2, 3, {3, 4, 12, 40}).to(torch::kFloat32);
  const auto upstream = torch::randn({3, 4, 6, 20});
  const Result want = run(false, gemm::Kernel::loops, x, upstream, 5);
  auto expect_ties_as_libtorch = [&](const Result& got, const std::string& what) {
    EXPECT_TRUE(torch::equal(got.y, want.y)) << what;
    // A gradient sent to another element of a tied window would differ there by its whole value.
    expect_close(got.dx, want.dx, 1e-5, what + " dx");
  };
  for (gemm::Kernel kernel : kernels_here())
    expect_ties_as_libtorch(run(true, kernel, x, upstream, 5), gemm::kernel_name(kernel));
  const auto layout = torch::MemoryFormat::ChannelsLast;
  for (gemm::Kernel kernel : nhwc_kernels_here())
    expect_ties_as_libtorch(run(true, kernel, x.contiguous(layout), upstream.contiguous(layout), 5),
                            std::string(gemm::kernel_name(kernel)) + " channels_last");
}

// Without a momentum the running statistics are a cumulative average (1 / num_batches_tracked),
// as BatchNorm2d keeps them; two batches in a row.
TEST(BnReluPool, CumulativeAverageWithoutMomentum) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  auto options = torch::nn::BatchNorm2dOptions(3).momentum(c10::nullopt);
  auto fused = make_norm(3, 2, options), reference = make_norm(3, 2, options);
  torch::manual_seed(4);
  for (int i = 0; i < 2; ++i) {
    const auto x = torch::randn({2, 3, 6, 6}) + i;
    ASSERT_TRUE(bn_relu_pool_fused(*fused, x));
    bn_relu_pool(*fused, x);
    bn_relu_pool_reference(*reference, x);
  }
  expect_close(fused->running_mean, reference->running_mean, 1e-6, "running mean");
  expect_close(fused->running_var, reference->running_var, 1e-6, "running var");
  EXPECT_EQ(fused->num_batches_tracked.item<int64_t>(), 2);
}

// A NaN or infinity in x must not vanish into ReLU's zeros: a diverged run shows in its loss.
TEST(BnReluPool, NonFiniteInputsGiveNaN) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    for (gemm::Kernel kernel : kernels_here()) {
      auto bn = make_norm(2, 1);
      auto x = torch::randn({2, 2, 4, 4});
      x[1][0][3][2] = bad;
      const auto y = bn_relu_pool(*bn, x, kernel);
      EXPECT_TRUE(y.select(1, 0).isnan().all().item<bool>()) << gemm::kernel_name(kernel);
      EXPECT_TRUE(y.select(1, 1).isfinite().all().item<bool>()) << gemm::kernel_name(kernel);
      if (kernel == gemm::Kernel::loops) continue;  // no channels_last form
      auto twin = make_norm(2, 1);
      const auto last = x.contiguous(torch::MemoryFormat::ChannelsLast);
      ASSERT_TRUE(bn_relu_pool_fused(*twin, last, kernel));
      const auto y_last = bn_relu_pool(*twin, last, kernel);
      EXPECT_TRUE(y_last.select(1, 0).isnan().all().item<bool>()) << "channels_last";
      EXPECT_TRUE(y_last.select(1, 1).isfinite().all().item<bool>()) << "channels_last";
    }
}

// Eval mode, channels_last without AVX2 or AVX-512, fp64, a norm without affine weights or running
// statistics: LibTorch's ops, with the same result as the reference.
TEST(BnReluPool, OtherModesLayoutsAndDtypesTakeTheLibTorchOps) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  torch::manual_seed(6);
  const auto x = torch::randn({2, 3, 6, 6});
  {
    auto bn = make_norm(3, 1);
    bn->eval();
    EXPECT_FALSE(bn_relu_pool_fused(*bn, x));
    auto twin = make_norm(3, 1);
    twin->eval();
    EXPECT_TRUE(torch::equal(bn_relu_pool(*bn, x), bn_relu_pool_reference(*twin, x)));
  }
  auto bn = make_norm(3, 1);
  EXPECT_TRUE(bn_relu_pool_fused(*bn, x));
  const auto last = x.contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(bn_relu_pool_fused(*bn, last, gemm::Kernel::loops));
  EXPECT_EQ(bn_relu_pool_fused(*bn, last, gemm::Kernel::avx2), gemm::available(gemm::Kernel::avx2));
  EXPECT_EQ(bn_relu_pool_fused(*bn, last, gemm::Kernel::avx512),
            gemm::available(gemm::Kernel::avx512));
  EXPECT_FALSE(bn_relu_pool_fused(*bn, x.as_strided({2, 3, 6, 6}, {108, 1, 3, 18})));
  EXPECT_FALSE(bn_relu_pool_fused(*bn, x.to(torch::kFloat64)));
  EXPECT_FALSE(bn_relu_pool_fused(*bn, torch::randn({2, 3, 1, 6})));
  torch::nn::BatchNorm2d plain(torch::nn::BatchNorm2dOptions(3).affine(false));
  EXPECT_FALSE(bn_relu_pool_fused(*plain, x));
  torch::nn::BatchNorm2d untracked(torch::nn::BatchNorm2dOptions(3).track_running_stats(false));
  EXPECT_FALSE(bn_relu_pool_fused(*untracked, x));
  set_bn_relu_pool_fusion(false);
  EXPECT_FALSE(bn_relu_pool_fused(*bn, x));
  set_bn_relu_pool_fusion(true);
}

// Eval mode with no gradient wanted (how evaluation runs), AVX-512 and AVX2: the fused forward
// against LibTorch's ops on the running statistics, both layouts, fp32 and bf16, odd sizes and
// channel counts past 16 and 8; a NaN in x gives NaN in its window only, as LibTorch's pool and
// ReLU give.
TEST(BnReluPool, EvalModeForwardMatchesTheLibTorchOps) {
  if (nhwc_kernels_here().empty()) GTEST_SKIP() << "no AVX2 or AVX-512 here";
  const testing::OneThreadUnless threads(fused_with_these_threads());
  {
    torch::NoGradGuard no_grad;
    for (const auto& shape :
         std::vector<std::vector<int64_t>>{{3, 20, 9, 7}, {4, 16, 14, 14}, {2, 12, 6, 8}})
      for (auto layout : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast})
        for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16})
          for (gemm::Kernel kernel : nhwc_kernels_here()) {
            const std::string what = std::string(gemm::kernel_name(kernel)) + " " +
                                     c10::str(torch::IntArrayRef(shape)) + " " +
                                     c10::toString(layout) + " " + c10::toString(dtype);
            auto bn = make_norm(shape[1], 3);
            bn->eval();
            torch::manual_seed(4);
            auto x = (torch::randn(shape) * 2 + 0.5).to(dtype).contiguous(layout);
            x[1][2][4][3] = std::numeric_limits<float>::quiet_NaN();
            ASSERT_TRUE(bn_relu_pool_inference_fused(*bn, x, kernel)) << what;
            const auto got = bn_relu_pool(*bn, x, kernel);
            set_bn_relu_pool_fusion(false);
            const auto want = bn_relu_pool(*bn, x.to(torch::kFloat32), kernel);
            set_bn_relu_pool_fusion(true);
            EXPECT_TRUE(got.is_contiguous(layout)) << what;
            EXPECT_EQ(got.scalar_type(), dtype) << what;
            EXPECT_TRUE(torch::equal(got.isnan(), want.isnan())) << what;
            EXPECT_EQ(got.isnan().sum().item<int64_t>(), 1) << what;
            const auto finite = want.isfinite();
            expect_close(got.to(torch::kFloat32).masked_select(finite), want.masked_select(finite),
                         dtype == torch::kFloat32 ? 1e-5 : 1e-2, what);
          }
  }
  // Not in training, not where a gradient is wanted, not on the other code paths.
  auto bn = make_norm(4, 1);
  const auto x = torch::randn({2, 4, 6, 6});
  const gemm::Kernel kernel = nhwc_kernels_here().back();
  EXPECT_FALSE(bn_relu_pool_inference_fused(*bn, x, kernel));
  bn->eval();
  EXPECT_FALSE(bn_relu_pool_inference_fused(*bn, x, kernel));  // weights want grad
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(bn_relu_pool_inference_fused(*bn, x, kernel));
  EXPECT_FALSE(bn_relu_pool_inference_fused(*bn, x, gemm::Kernel::loops));
  EXPECT_FALSE(bn_relu_pool_inference_fused(*bn, x.to(torch::kFloat64), kernel));
}

struct FirstStageResult {
  torch::Tensor y, dweight, dgamma, dbeta, running_mean, running_var;
};

// The first stage (3x3 convolution, norm, ReLU, pool) on images that need no gradient, fused with
// `kernel` or as LibTorch's ops, from the same weights; `frozen`: the convolution's weight takes
// no gradient (`--first-conv whitened`).
FirstStageResult run_first_stage(bool fused, gemm::Kernel kernel, const torch::Tensor& x,
                                 int64_t out_channels, const torch::Tensor& upstream,
                                 torch::MemoryFormat layout = torch::MemoryFormat::Contiguous,
                                 bool bf16_autocast = false, bool frozen = false) {
  auto bn = make_norm(out_channels, 9);
  torch::manual_seed(10);
  torch::nn::Conv2d conv(
      torch::nn::Conv2dOptions(x.size(1), out_channels, 3).padding(1).bias(false));
  conv->weight.set_requires_grad(!frozen);
  set_bn_relu_pool_fusion(fused);
  EXPECT_EQ(first_conv_bn_relu_pool_fused(*conv, *bn, x), fused);
  torch::Tensor y;
  {
    precision::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16, bf16_autocast);
    y = first_conv_bn_relu_pool(*conv, *bn, x, kernel, layout);
  }
  set_bn_relu_pool_fusion(true);
  if (fused) {
    EXPECT_TRUE(y.is_contiguous(layout));
  }
  y.backward(upstream.contiguous(layout));
  return {y,
          conv->weight.grad(),
          bn->weight.grad(),
          bn->bias.grad(),
          bn->running_mean.clone(),
          bn->running_var.clone()};
}

// Output, the gradients of the convolution's and the norm's weights and the running statistics
// against LibTorch's conv2d, batch_norm, relu and max_pool2d: one input channel (fastcnn), two
// with odd sizes, four (RGBA sprites) with rows of more than 16 windows.
TEST(BnReluPool, FirstStageMatchesTheLibTorchOps) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  const std::vector<std::vector<int64_t>> shapes = {{6, 1, 28, 28}, {3, 2, 7, 9}, {2, 4, 12, 40}};
  for (const auto& shape : shapes)
    for (gemm::Kernel kernel : kernels_here())
      for (auto layout : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast}) {
        torch::manual_seed(shape[1]);
        const auto x = torch::rand(shape);  // images in [0, 1]: the statistics' mean is not 0
        const int64_t out_channels = 16;
        const auto upstream = torch::randn({shape[0], out_channels, shape[2] / 2, shape[3] / 2});
        const auto got = run_first_stage(true, kernel, x, out_channels, upstream, layout);
        const auto want = run_first_stage(false, kernel, x, out_channels, upstream);
        const std::string what = std::string(gemm::kernel_name(kernel)) + " " +
                                 c10::str(torch::IntArrayRef(shape)) + " " + c10::toString(layout);
        expect_close(got.y, want.y, 1e-4, what + " output");
        expect_close(got.dweight, want.dweight, 1e-4, what + " conv weight gradient");
        expect_close(got.dgamma, want.dgamma, 1e-4, what + " norm weight gradient");
        expect_close(got.dbeta, want.dbeta, 1e-4, what + " norm bias gradient");
        expect_close(got.running_mean, want.running_mean, 1e-5, what + " running mean");
        expect_close(got.running_var, want.running_var, 1e-5, what + " running var");
      }
}

// With the convolution's weight frozen, backward makes the norm's gradients from the winners'
// values kept in forward (AVX-512; elsewhere the general backward) and none for the weight: the
// same as LibTorch's ops, in both layouts and under bf16 autocast, with channel counts that do not
// fill the 16 lanes, rows of more than 16 windows, odd sizes, and windows ReLU cuts (the norm's
// bias is not 0: make_norm).
TEST(BnReluPool, FirstStageWithAFrozenWeightMatchesTheLibTorchOps) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{6, 1, 28, 28}, 16}, {{3, 2, 7, 9}, 20}, {{2, 4, 12, 40}, 8}, {{5, 1, 36, 34}, 33}};
  for (const auto& [shape, out_channels] : cases)
    for (gemm::Kernel kernel : kernels_here())
      for (auto layout : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast})
        for (bool bf16 : {false, true}) {
          torch::manual_seed(shape[1] + out_channels);
          const auto x = torch::rand(shape);
          const auto upstream = torch::randn({shape[0], out_channels, shape[2] / 2, shape[3] / 2});
          const std::string what = std::string(gemm::kernel_name(kernel)) + " " +
                                   c10::str(torch::IntArrayRef(shape)) + " to " +
                                   std::to_string(out_channels) + " " + c10::toString(layout) +
                                   (bf16 ? " bf16" : " fp32");
          const auto got = run_first_stage(true, kernel, x, out_channels,
                                           upstream.to(bf16 ? torch::kBFloat16 : torch::kFloat32),
                                           layout, bf16, /*frozen=*/true);
          // The learned weight's fused run from the same bf16-rounded gradient: its norm gradients
          // are the reference under autocast, LibTorch's ops in fp32.
          const auto want = bf16 ? run_first_stage(true, kernel, x, out_channels,
                                                   upstream.to(torch::kBFloat16), layout, true)
                                 : run_first_stage(false, kernel, x, out_channels, upstream);
          EXPECT_FALSE(got.dweight.defined()) << what;
          expect_close(got.y.to(torch::kFloat32), want.y.to(torch::kFloat32), 1e-4,
                       what + " output");
          expect_close(got.dgamma, want.dgamma, 1e-4, what + " norm weight gradient");
          expect_close(got.dbeta, want.dbeta, 1e-4, what + " norm bias gradient");
          expect_close(got.running_mean, want.running_mean, 1e-5, what + " running mean");
          expect_close(got.running_var, want.running_var, 1e-5, what + " running var");
        }
}

// Under bf16 autocast the first stage returns bf16: its fp32 output rounded to nearest, what
// autocast's cast for the next convolution would make, in either layout; from a bf16 gradient it
// computes what it computes from the same values in fp32.
TEST(BnReluPool, FirstStageUnderBf16AutocastReturnsItsOutputRounded) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  torch::manual_seed(12);
  const auto x = torch::rand({4, 1, 14, 14});
  const auto upstream = torch::randn({4, 16, 7, 7}).to(torch::kBFloat16);
  for (gemm::Kernel kernel : kernels_here())
    for (auto layout : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast}) {
      const std::string what = std::string(gemm::kernel_name(kernel)) + " " + c10::toString(layout);
      const auto fp32 = run_first_stage(true, kernel, x, 16, upstream.to(torch::kFloat32), layout);
      const auto bf16 = run_first_stage(true, kernel, x, 16, upstream, layout, true);
      ASSERT_EQ(bf16.y.scalar_type(), torch::kBFloat16) << what;
      EXPECT_TRUE(torch::equal(bf16.y, fp32.y.to(torch::kBFloat16))) << what;
      expect_close(bf16.dweight, fp32.dweight, 1e-6, what + " conv weight gradient");
      expect_close(bf16.dgamma, fp32.dgamma, 1e-6, what + " norm weight gradient");
    }
}

// Only a 3x3, padding-1, bias-free convolution of images that need no gradient takes the fused
// first stage; anything else is bn_relu_pool(bn, conv(x)).
TEST(BnReluPool, FirstStageOnlyForItsConvolution) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  auto bn = make_norm(4, 1);
  const auto x = torch::rand({2, 1, 8, 8});
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 4, 3).padding(1).bias(false));
  EXPECT_TRUE(first_conv_bn_relu_pool_fused(*conv, *bn, x));
  EXPECT_FALSE(first_conv_bn_relu_pool_fused(*conv, *bn, x.clone().requires_grad_()));
  EXPECT_FALSE(first_conv_bn_relu_pool_fused(*conv, *bn, x.to(torch::kBFloat16)));
  torch::nn::Conv2d biased(torch::nn::Conv2dOptions(1, 4, 3).padding(1));
  EXPECT_FALSE(first_conv_bn_relu_pool_fused(*biased, *bn, x));
  torch::nn::Conv2d unpadded(torch::nn::Conv2dOptions(1, 4, 3).bias(false));
  EXPECT_FALSE(first_conv_bn_relu_pool_fused(*unpadded, *bn, x));
  torch::nn::Conv2d strided(torch::nn::Conv2dOptions(1, 4, 3).padding(1).stride(2).bias(false));
  EXPECT_FALSE(first_conv_bn_relu_pool_fused(*strided, *bn, x));
  bn->eval();
  EXPECT_FALSE(first_conv_bn_relu_pool_fused(*conv, *bn, x));
  // Not fused, it is the unfused ops' result.
  auto twin = make_norm(4, 1);
  twin->eval();
  EXPECT_TRUE(torch::allclose(first_conv_bn_relu_pool(*conv, *bn, x),
                              bn_relu_pool_reference(*twin, conv(x))));
}

// fastcnn trained a few AdamW steps with the fused op and with LibTorch's ops from the same start
// ends with the same weights (within float rounding), in fp32.
void expect_fastcnn_steps_match_the_unfused_path(torch::MemoryFormat layout) {
  auto train = [layout](bool fused) {
    torch::manual_seed(11);
    auto model = make_model({"fastcnn", {1, 28, 28}, 10});
    model->train();
    {  // as the trainer's channels_last (train/amp_step.h): the conv weights, then the batches
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters())
        if (p.dim() == 4) p.set_data(p.contiguous(layout));
    }
    torch::optim::AdamW adamw(model->parameters(),
                              torch::optim::AdamWOptions(0.01).weight_decay(0.05));
    const auto x = torch::rand({32, 1, 28, 28}).contiguous(layout);
    const auto y = torch::randint(10, {32}, torch::kInt64);
    set_bn_relu_pool_fusion(fused);
    for (int step = 0; step < 3; ++step) {
      adamw.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      adamw.step();
    }
    set_bn_relu_pool_fusion(true);
    return model;
  };
  auto fused = train(true), reference = train(false);
  const std::string what = c10::toString(layout);
  const auto a = fused->named_parameters(), b = reference->named_parameters();
  for (const auto& p : a) expect_close(p.value(), b[p.key()], 1e-4, what + " " + p.key());
  const auto ba = fused->named_buffers(), bb = reference->named_buffers();
  for (const auto& p : ba) expect_close(p.value(), bb[p.key()], 1e-4, what + " " + p.key());
}

TEST(BnReluPool, FastCnnStepsMatchTheUnfusedPath) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  for (auto layout : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast})
    expect_fastcnn_steps_match_the_unfused_path(layout);
}

}  // namespace
}  // namespace spritetorch::models
