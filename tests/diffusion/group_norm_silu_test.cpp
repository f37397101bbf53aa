#include "diffusion/group_norm_silu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "diffusion/generator.h"
#include "diffusion/unet.h"
#include "group_norm_silu_cases.h"
#include "test_util.h"
#include "unet_fixture.h"

namespace spritetorch::diffusion {
namespace {

std::vector<gemm::Kernel> kernels_here() {
  std::vector<gemm::Kernel> out = {gemm::Kernel::loops};
  if (gemm::available(gemm::Kernel::avx2)) out.push_back(gemm::Kernel::avx2);
  return out;
}

// Whether the kernel runs with LibTorch's threads as they are (testing::OneThreadUnless).
bool fused_with_these_threads() {
  return group_norm_silu_fused(torch::zeros({1, 8, 2, 2}), torch::ones({8}));
}

struct Inputs {
  torch::Tensor x, weight, bias, scale, shift;
};

// Leaves that need gradients; x spread around a non-zero mean (the norm must take it out). The
// same seed gives the same values in either dtype (drawn in float32, then converted).
Inputs make_inputs(int64_t batch, int64_t channels, int64_t h, int64_t w, bool scale_shift,
                   uint64_t seed, torch::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  Inputs in;
  const auto leaf = [dtype](const torch::Tensor& t) { return t.to(dtype).requires_grad_(); };
  in.x = leaf(torch::randn({batch, channels, h, w}) * 3 + 1.5);
  in.weight = leaf(1 + 0.3 * torch::randn({channels}));
  in.bias = leaf(0.2 * torch::randn({channels}));
  if (scale_shift) {
    in.scale = leaf(0.5 * torch::randn({batch, channels, 1, 1}));
    in.shift = leaf(torch::randn({batch, channels, 1, 1}));
  }
  return in;
}

std::vector<torch::Tensor> leaves(const Inputs& in) {
  std::vector<torch::Tensor> out = {in.x, in.weight, in.bias};
  if (in.scale.defined()) out.insert(out.end(), {in.scale, in.shift});
  return out;
}

using testing::expect_as_close_as_libtorch;
using testing::expect_close;

// Output and every gradient of the fused kernel against LibTorch's group_norm, mul, add and silu
// in float64, next to the same ops in float32, for every kernel here: widths that leave a tail
// after the 8-lane loop (5 x 7 = 35 pixels) and the UNet's (8 groups of 4 channels, one group),
// with and without scale and shift.
TEST(GroupNormSilu, MatchesTheLibTorchOpsForwardAndBackward) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  struct Case {
    int64_t batch, channels, groups, h, w;
    bool scale_shift;
  };
  const std::vector<Case> cases = {{3, 16, 8, 5, 7, true},   {3, 16, 8, 5, 7, false},
                                   {2, 32, 8, 16, 16, true}, {2, 12, 1, 4, 4, true},
                                   {1, 8, 8, 1, 1, false},   {2, 64, 8, 8, 8, false}};
  for (const auto kernel : kernels_here())
    for (const auto& c : cases) {
      const std::string what = std::string(gemm::kernel_name(kernel)) + " B" +
                               std::to_string(c.batch) + " C" + std::to_string(c.channels) + " G" +
                               std::to_string(c.groups) + " " + std::to_string(c.h) + "x" +
                               std::to_string(c.w) + (c.scale_shift ? " scale-shift" : "");
      const auto make = [&](torch::ScalarType dtype) {
        return make_inputs(c.batch, c.channels, c.h, c.w, c.scale_shift, 11, dtype);
      };
      const auto fused_in = make(torch::kFloat32), lib_in = make(torch::kFloat32),
                 truth_in = make(torch::kFloat64);
      ASSERT_TRUE(group_norm_silu_fused(fused_in.x, fused_in.weight)) << what;
      const auto fused = group_norm_silu(fused_in.x, c.groups, fused_in.weight, fused_in.bias, 1e-5,
                                         fused_in.scale, fused_in.shift, kernel);
      const auto lib = group_norm_silu_reference(lib_in.x, c.groups, lib_in.weight, lib_in.bias,
                                                 1e-5, lib_in.scale, lib_in.shift);
      const auto truth =
          group_norm_silu_reference(truth_in.x, c.groups, truth_in.weight, truth_in.bias, 1e-5,
                                    truth_in.scale, truth_in.shift);
      expect_as_close_as_libtorch(fused, lib, truth, 1e-5, what + " forward");
      // A gradient that is not uniform, so every term of the backward shows.
      torch::manual_seed(5);
      const auto upstream = torch::randn_like(lib);
      (fused * upstream).sum().backward();
      (lib * upstream).sum().backward();
      (truth * upstream.to(torch::kFloat64)).sum().backward();
      const auto got = leaves(fused_in), theirs = leaves(lib_in), want = leaves(truth_in);
      const char* names[] = {"dx", "dweight", "dbias", "dscale", "dshift"};
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(got[i].grad().defined()) << what << " " << names[i];
        expect_as_close_as_libtorch(got[i].grad(), theirs[i].grad(), want[i].grad(), 1e-4,
                                    what + " " + names[i]);
      }
    }
}

// Large |z| (the exp clamps) and zeros: finite, and SiLU's limits (z and 0).
TEST(GroupNormSilu, ExtremeValuesStayFinite) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  for (const auto kernel : kernels_here()) {
    auto x = torch::zeros({1, 8, 4, 4});
    x.index_put_({0, 0}, 1000.0f);  // one channel far from the group's others
    const auto weight = torch::full({8}, 50.0f), bias = torch::zeros({8});
    const auto y = group_norm_silu(x, 2, weight, bias, 1e-5, {}, {}, kernel);
    const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>()) << gemm::kernel_name(kernel);
    expect_as_close_as_libtorch(y, group_norm_silu_reference(x, 2, weight, bias, 1e-5),
                                group_norm_silu_reference(f64(x), 2, f64(weight), f64(bias), 1e-5),
                                1e-5, gemm::kernel_name(kernel));
    // A constant group: variance 0, output silu(bias) (within the rounding of a x + d, where a =
    // rstd ~ 316 and d = bias - mean a: 3e-5 in the AVX2 loop, 0 in LibTorch 1.13's ops).
    const auto constant = torch::full({1, 8, 3, 3}, 7.0f);
    const auto flat = group_norm_silu(constant, 8, torch::ones({8}), torch::full({8}, 2.0f), 1e-5,
                                      {}, {}, kernel);
    const float silu2 = 2.0f / (1.0f + std::exp(-2.0f));
    EXPECT_NEAR(flat.min().item<float>(), silu2, 1e-3);
    EXPECT_NEAR(flat.max().item<float>(), silu2, 1e-3);
    expect_as_close_as_libtorch(
        flat,
        group_norm_silu_reference(constant, 8, torch::ones({8}), torch::full({8}, 2.0f), 1e-5),
        group_norm_silu_reference(f64(constant), 8, f64(torch::ones({8})),
                                  f64(torch::full({8}, 2.0f)), 1e-5),
        1e-4, "constant group");
  }
}

// What the kernel does not take (bf16, channels_last, views) goes to LibTorch's ops.
TEST(GroupNormSilu, OtherLayoutsAndDtypesTakeTheLibTorchOps) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  const auto in = make_inputs(2, 16, 4, 4, true, 3);
  const auto nhwc = in.x.detach().contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(group_norm_silu_fused(nhwc, in.weight));
  EXPECT_FALSE(group_norm_silu_fused(in.x.to(torch::kBFloat16), in.weight));
  EXPECT_FALSE(group_norm_silu_fused(in.x, in.weight.to(torch::kBFloat16)));
  EXPECT_TRUE(group_norm_silu_fused(in.x, in.weight));
  set_group_norm_silu_fusion(false);
  EXPECT_FALSE(group_norm_silu_fused(in.x, in.weight));
  set_group_norm_silu_fusion(true);
  torch::NoGradGuard no_grad;
  // Both forms against LibTorch's ops in float64 (whose rounding in float32 differs by version).
  const auto truth = make_inputs(2, 16, 4, 4, true, 3, torch::kFloat64);
  const auto want =
      group_norm_silu(truth.x, 8, truth.weight, truth.bias, 1e-5, truth.scale, truth.shift);
  expect_close(group_norm_silu(nhwc, 8, in.weight, in.bias, 1e-5, in.scale, in.shift), want, 1e-5,
               "channels_last");
  expect_close(group_norm_silu(in.x, 8, in.weight, in.bias, 1e-5, in.scale, in.shift), want, 1e-5,
               "NCHW");
  const auto bf16 = group_norm_silu(in.x.to(torch::kBFloat16), 8, in.weight.to(torch::kBFloat16),
                                    in.bias.to(torch::kBFloat16), 1e-5,
                                    in.scale.to(torch::kBFloat16), in.shift.to(torch::kBFloat16));
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  expect_close(bf16.to(torch::kFloat32),
               group_norm_silu_reference(in.x, 8, in.weight, in.bias, 1e-5, in.scale, in.shift),
               0.05, "bf16");
}

// A UNet's gradients with the fused kernel equal those of the same net and batch with it off.
TEST(GroupNormSilu, UNetStepMatchesTheUnfusedPath) {
  const testing::OneThreadUnless threads(fused_with_these_threads());
  UNet net = testing::unet_whose_every_weight_learns(/*classes=*/3, /*seed=*/2);
  const auto x = torch::randn({4, 4, 16, 16});
  const auto t = torch::tensor({3, 100, 250, 499}, torch::kInt64);
  const auto c = torch::tensor({0, 1, 2, 3}, torch::kInt64);
  auto grads_of = [&](const torch::Tensor& input) {
    net->zero_grad();
    net->forward(input, t, c).pow(2).mean().backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  ASSERT_TRUE(group_norm_silu_fusion());
  const auto fused = grads_of(x);
  set_group_norm_silu_fusion(false);
  const auto unfused = grads_of(x);
  set_group_norm_silu_fusion(true);
  // The same net in float64 (LibTorch's ops: the kernel takes float32 only) is the truth both
  // float32 passes are held to.
  net->to(torch::kFloat64);
  const auto truth = grads_of(x.to(torch::kFloat64));
  ASSERT_EQ(fused.size(), unfused.size());
  ASSERT_EQ(fused.size(), truth.size());
  for (size_t i = 0; i < fused.size(); ++i)
    expect_as_close_as_libtorch(fused[i], unfused[i], truth[i], 1e-4,
                                "parameter " + std::to_string(i));
}

// Gradients (training) and CPU tensors never take the CUDA kernel, whatever the build.
TEST(GroupNormSilu, TheCudaKernelIsForSamplingOnCudaOnly) {
  const auto x = torch::randn({2, 16, 4, 4}), weight = torch::ones({16});
  EXPECT_FALSE(group_norm_silu_cuda_kernel(x, weight));
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(group_norm_silu_cuda_kernel(x, weight));
  if (!torch::cuda::is_available()) return;
  const auto on_gpu = x.cuda();
  EXPECT_EQ(group_norm_silu_cuda_kernel(on_gpu, weight.cuda()),
            group_norm_silu_cuda_kernel_built());
  EXPECT_FALSE(group_norm_silu_cuda_kernel(on_gpu, weight.cuda().to(torch::kBFloat16)));
  // channels_last has the kernel's NHWC form; other strides (a view) take LibTorch's ops.
  EXPECT_EQ(
      group_norm_silu_cuda_kernel(on_gpu.contiguous(at::MemoryFormat::ChannelsLast), weight.cuda()),
      group_norm_silu_cuda_kernel_built());
  EXPECT_FALSE(group_norm_silu_cuda_kernel(on_gpu.transpose(2, 3), weight.cuda()));
  torch::AutoGradMode grad(true);
  EXPECT_FALSE(group_norm_silu_cuda_kernel(on_gpu, weight.cuda()));
}

// A CUDA build whose kernels nvcc compiled (else the configure step warned, and this fails).
bool cuda_kernel_here() {
  if (!torch::cuda::is_available()) return false;
  EXPECT_TRUE(group_norm_silu_cuda_kernel_built())
      << "this CUDA build left its kernels out: see the warning cmake printed when configuring";
  return group_norm_silu_cuda_kernel_built();
}

// The CUDA kernel's output against LibTorch's ops in float64 on the same values (bf16 inputs
// compared after widening, so only the kernel's own rounding shows), over the cases of
// group_norm_silu_cases.h: packed and unpacked rows, a misaligned start, chunked and separate
// scale-shift, means far from zero.
TEST(GroupNormSiluCuda, KernelMatchesTheLibTorchOps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernel_here()) return;
  const torch::NoGradGuard no_grad;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (const auto& c : testing::kernel_cases()) {
      const std::string what = testing::describe(dtype, c);
      const auto in =
          testing::make_kernel_inputs(c, torch::TensorOptions().device(torch::kCUDA).dtype(dtype));
      ASSERT_TRUE(group_norm_silu_cuda_kernel(in.x, in.weight)) << what;
      const auto got =
          group_norm_silu(in.x, c.groups, in.weight, in.bias, 1e-5, in.scale, in.shift);
      ASSERT_EQ(got.scalar_type(), dtype) << what;
      // bf16 output: half a unit in its 8th bit (2^-9 relative); fp32: the fast exp's ~1e-6.
      expect_close(got, testing::reference_in_float64(in, c.groups),
                   dtype == torch::kFloat32 ? 2e-5 : 4e-3, what);
    }
}

// A whole UNet pass on CUDA, as sampling runs it (no gradients), with the kernel on and off; and
// channels_last, as `generate --channels-last true` samples: a copy of the UNet whose convolutions
// write NHWC, with the kernel's NHWC form (fp32 and the bf16 copy), against the NCHW pass on
// LibTorch's ops.
TEST(GroupNormSiluCuda, UNetPassEqualsTheUnfusedOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernel_here()) return;
  UNet net = testing::unet_whose_every_weight_learns(/*classes=*/3, /*seed=*/2);
  net->to(torch::kCUDA);
  const torch::NoGradGuard no_grad;
  const auto x = torch::randn({8, 4, 16, 16}).cuda();
  const auto t = torch::tensor({3, 100, 250, 499, 7, 60, 300, 420}, torch::kInt64).cuda();
  const auto c = torch::tensor({0, 1, 2, 3, 0, 1, 2, 3}, torch::kInt64).cuda();
  ASSERT_TRUE(group_norm_silu_fusion());
  const auto fused = net->forward(x, t, c);
  set_group_norm_silu_fusion(false);
  const auto unfused = net->forward(x, t, c);
  set_group_norm_silu_fusion(true);
  expect_close(fused, unfused, 1e-4, "fp32 UNet pass");
  const auto x_nhwc = x.contiguous(at::MemoryFormat::ChannelsLast);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto copy = sampling_copy(*net, dtype, /*channels_last=*/true);
    const auto got = copy->forward(x_nhwc, t, c);
    EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast)) << got.strides();
    // bf16: the weights and activations rounded to 8 bits (Sampler.Bf16RunsACopyOfTheNetInBf16).
    expect_close(got, unfused, dtype == torch::kFloat32 ? 1e-4 : 5e-2,
                 dtype == torch::kFloat32 ? "fp32 NHWC UNet pass" : "bf16 NHWC UNet pass");
  }
}

}  // namespace
}  // namespace spritetorch::diffusion
