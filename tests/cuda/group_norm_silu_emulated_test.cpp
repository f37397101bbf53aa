// The CUDA GroupNorm + SiLU kernel (src/diffusion/group_norm_silu_cuda.cu), its very source, run on
// the CPU by tests/cuda/cuda_emulator.h against LibTorch's ops: its indexing, block reductions,
// 16-byte packing, bf16 conversions and scale-shift strides, on machines without a GPU (CI). Built
// outside the unity build: the emulator's macros (__shared__, __global__) must not reach other
// tests.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "diffusion/group_norm_silu.h"

// The emulator comes before the kernel's source, which it turns into C++.
// clang-format off
#include "cuda/cuda_emulator.h"
#include "diffusion/group_norm_silu_cuda.cu"  // NOLINT(bugprone-suspicious-include)
// clang-format on

// ASan follows one stack per thread; the emulator's fibers switch stacks under it (ucontext),
// which ASan documents as a source of false reports.
#if defined(__SANITIZE_ADDRESS__)
#define SPRITETORCH_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPRITETORCH_UNDER_ASAN 1
#endif
#endif

namespace spritetorch::diffusion {
namespace {

bool skip_under_asan() {
#ifdef SPRITETORCH_UNDER_ASAN
  return true;
#else
  return false;
#endif
}

struct Case {
  int64_t batch, channels, groups, h, w;
  bool scale_shift, chunked, misaligned;
  double offset;
};

std::string describe(torch::ScalarType dtype, const Case& c) {
  return std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + " B" + std::to_string(c.batch) +
         " C" + std::to_string(c.channels) + " G" + std::to_string(c.groups) + " " +
         std::to_string(c.h) + "x" + std::to_string(c.w) + (c.scale_shift ? " scale-shift" : "") +
         (c.chunked ? " chunked" : "") + (c.misaligned ? " misaligned" : "") + " offset " +
         std::to_string(c.offset);
}

// Rows that take 16-byte packs (4 x 4, 8 x 8: 4 fp32 or 8 bf16 values) and rows that do not (5 x 7,
// 1 x 1, 2 x 2 in bf16), a start off the 16-byte grid, scale and shift as a chunk of a wider tensor
// (rows 2 C apart, as in the UNet) and on their own, one group, 32 channels a group, groups
// larger than a block's 256 threads x 4 values, and a mean of 300 (std 3).
TEST(GroupNormSiluKernelEmulated, KernelMatchesTheLibTorchOps) {
  if (skip_under_asan()) GTEST_SKIP() << "the CUDA emulator's fibers switch stacks under ASan";
  const std::vector<Case> cases = {
      {2, 16, 4, 5, 7, true, true, false, 1.5},  {1, 16, 8, 5, 7, false, false, false, 1.5},
      {2, 16, 2, 4, 4, true, false, false, 1.5}, {2, 16, 2, 4, 4, true, true, true, 1.5},
      {2, 12, 1, 4, 4, true, true, false, 1.5},  {1, 8, 8, 1, 1, false, false, false, 1.5},
      {1, 64, 2, 8, 8, true, true, false, 1.5},  {1, 8, 4, 2, 2, true, true, false, 1.5},
      {1, 8, 2, 24, 24, true, true, false, 300}, {1, 8, 1, 24, 24, false, false, true, -40}};
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (const auto& c : cases) {
      const std::string what = describe(dtype, c);
      torch::manual_seed(17);
      const int64_t values = c.batch * c.channels * c.h * c.w;
      // Misaligned: a view one value into a larger buffer, contiguous but off the 16-byte grid.
      auto x = (torch::randn({values + 1}) * 3 + c.offset).to(dtype);
      x = (c.misaligned ? x.narrow(0, 1, values) : x.narrow(0, 0, values))
              .view({c.batch, c.channels, c.h, c.w});
      const auto weight = (1 + 0.3 * torch::randn({c.channels})).to(dtype);
      const auto bias = (0.2 * torch::randn({c.channels})).to(dtype);
      torch::Tensor scale, shift;  // (B, C) rows, scale_stride / shift_stride values apart
      if (c.scale_shift) {
        if (c.chunked) {
          const auto both = torch::randn({c.batch, 2 * c.channels}).to(dtype);
          scale = both.narrow(1, 0, c.channels);
          shift = both.narrow(1, c.channels, c.channels);
        } else {
          scale = (0.5 * torch::randn({c.batch, c.channels})).to(dtype);
          shift = torch::randn({c.batch, c.channels}).to(dtype);
        }
      }
      auto y = torch::full_like(x, 77);  // every value must be written
      const char* failure = cuda_kernels::group_norm_silu_forward(
          dtype == torch::kBFloat16 ? cuda_kernels::Dtype::bf16 : cuda_kernels::Dtype::f32,
          x.data_ptr(), weight.data_ptr(), bias.data_ptr(),
          scale.defined() ? scale.data_ptr() : nullptr, scale.defined() ? scale.stride(0) : 0,
          shift.defined() ? shift.data_ptr() : nullptr, shift.defined() ? shift.stride(0) : 0,
          y.data_ptr(), c.batch, c.channels, c.h * c.w, c.groups, 1e-5f, nullptr);
      ASSERT_EQ(failure, nullptr) << what;
      // The ops in float64 on the same values: the fp32 ops round a x + d with a = rstd weight, so
      // a group of one value (rstd ~ 316) leaves them 5e-5 off where the kernel is exact.
      const auto f64 = [](const torch::Tensor& t) {
        return t.defined() ? t.to(torch::kFloat64) : t;
      };
      const auto per_channel = [&](const torch::Tensor& t) {
        return t.defined() ? f64(t).view({c.batch, c.channels, 1, 1}) : t;
      };
      const auto want = group_norm_silu_reference(f64(x), c.groups, f64(weight), f64(bias), 1e-5,
                                                  per_channel(scale), per_channel(shift));
      const auto got = f64(y);
      const double largest = want.abs().max().item<double>();
      const double error = (got - want).abs().max().item<double>();
      // fp32: float sums against LibTorch's; bf16: the output's own rounding (2^-9 relative).
      const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 4e-3;
      EXPECT_LE(error, tolerance * (1 + largest))
          << what << ": largest difference " << error << " against values up to " << largest;
      if (dtype == torch::kBFloat16) {
        // Rounded to nearest: at most half a bf16 unit from the fp32 result on the same inputs.
        const auto exact = want.to(torch::kBFloat16).to(torch::kFloat64);
        const auto units = ((got - exact).abs() / (exact.abs() * std::pow(2.0, -7) + 1e-30));
        EXPECT_LE(units.max().item<double>(), 1.0) << what << ": bf16 units from the rounded ops";
      }
    }
}

// What the kernel refuses is said, not launched: groups that do not divide the channels, a group
// wider than its shared memory.
TEST(GroupNormSiluKernelEmulated, SizesOutsideTheKernelAreRefused) {
  EXPECT_FALSE(cuda_kernels::group_norm_silu_fits(2, 12, 16, 5));
  EXPECT_FALSE(cuda_kernels::group_norm_silu_fits(1, 2048, 16, 1));
  EXPECT_FALSE(cuda_kernels::group_norm_silu_fits(0, 8, 16, 8));
  EXPECT_TRUE(cuda_kernels::group_norm_silu_fits(2048, 128, 64, 8));
  const auto x = torch::zeros({1, 2048, 1, 1}), w = torch::ones({2048}), b = torch::zeros({2048});
  auto y = torch::empty_like(x);
  const char* failure = cuda_kernels::group_norm_silu_forward(
      cuda_kernels::Dtype::f32, x.data_ptr(), w.data_ptr(), b.data_ptr(), nullptr, 0, nullptr, 0,
      y.data_ptr(), 1, 2048, 1, 1, 1e-5f, nullptr);
  ASSERT_NE(failure, nullptr);
  EXPECT_NE(std::string(failure).find("outside what the kernel indexes"), std::string::npos);
}

}  // namespace
}  // namespace spritetorch::diffusion
