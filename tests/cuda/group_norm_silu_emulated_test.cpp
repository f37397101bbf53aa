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
#include "diffusion/group_norm_silu_cases.h"

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

// The kernel's own source, run by the emulator, against LibTorch's ops in float64 over the cases
// of group_norm_silu_cases.h (the GPU test's), and its bf16 output within half a bf16 unit of the
// rounded exact result.
TEST(GroupNormSiluKernelEmulated, KernelMatchesTheLibTorchOps) {
  if (skip_under_asan()) GTEST_SKIP() << "the CUDA emulator's fibers switch stacks under ASan";
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (const auto& c : testing::kernel_cases()) {
      const std::string what = testing::describe(dtype, c);
      const auto in = testing::make_kernel_inputs(c, torch::TensorOptions().dtype(dtype));
      auto y = torch::full_like(in.x, 77);  // every value must be written, in x's layout
      ASSERT_EQ(y.strides(), in.x.strides()) << what;
      const auto& s = in.scale;
      const auto& h = in.shift;
      const char* failure = cuda_kernels::emulated::group_norm_silu_forward(
          dtype == torch::kBFloat16 ? cuda_kernels::Dtype::bf16 : cuda_kernels::Dtype::f32,
          c.nhwc ? cuda_kernels::Layout::nhwc : cuda_kernels::Layout::nchw, in.x.data_ptr(),
          in.weight.data_ptr(), in.bias.data_ptr(), s.defined() ? s.data_ptr() : nullptr,
          s.defined() ? s.stride(0) : 0, h.defined() ? h.data_ptr() : nullptr,
          h.defined() ? h.stride(0) : 0, y.data_ptr(), c.batch, c.channels, c.h * c.w, c.groups,
          1e-5f, nullptr);
      ASSERT_EQ(failure, nullptr) << what;
      const auto want = testing::reference_in_float64(in, c.groups);
      testing::expect_close(y, want, dtype == torch::kFloat32 ? 1e-5 : 4e-3, what);
      if (dtype == torch::kBFloat16) {
        // Rounded to nearest: at most half a bf16 unit (2^-8 relative) from the exact result, or
        // 1e-6 where the result is within a few ulps of 0 (z = a (x - mean) + d in fp32 whose two
        // terms of order 1 cancel: a NHWC case has z = -1.9e-6, 8% off after fp32's rounding).
        const auto exact = want.to(torch::kBFloat16).to(torch::kFloat64);
        const auto units = (y.to(torch::kFloat64) - exact).abs() / (exact.abs() * 0x1p-7 + 1e-6);
        EXPECT_LE(units.max().item<double>(), 1.0) << what << ": bf16 units from the rounded ops";
      }
    }
}

// What the kernels refuse is said, not launched: groups that do not divide the channels, a group
// (NCHW) or a sample's channels (NHWC) wider than their shared memory, and in NHWC more channels
// than threads where no 16-byte pack fits (a start off the grid, 8 not dividing the channels).
TEST(GroupNormSiluKernelEmulated, SizesOutsideTheKernelAreRefused) {
  using cuda_kernels::group_norm_silu_fits;
  using cuda_kernels::Layout;
  alignas(16) static const float aligned[2] = {0, 0};
  const void* on_grid = aligned;
  const void* off_grid = aligned + 1;
  EXPECT_FALSE(group_norm_silu_fits(Layout::nchw, 2, 12, 16, 5, on_grid));
  EXPECT_FALSE(group_norm_silu_fits(Layout::nchw, 1, 2048, 16, 1, on_grid));
  EXPECT_FALSE(group_norm_silu_fits(Layout::nchw, 0, 8, 16, 8, on_grid));
  EXPECT_TRUE(group_norm_silu_fits(Layout::nchw, 2048, 128, 64, 8, off_grid));
  EXPECT_FALSE(group_norm_silu_fits(Layout::nhwc, 2, 12, 16, 5, on_grid));
  EXPECT_FALSE(group_norm_silu_fits(Layout::nhwc, 1, 2048, 16, 8, on_grid));
  EXPECT_TRUE(group_norm_silu_fits(Layout::nhwc, 2048, 256, 64, 8, off_grid));
  EXPECT_TRUE(group_norm_silu_fits(Layout::nhwc, 2048, 264, 64, 8, on_grid));
  EXPECT_FALSE(group_norm_silu_fits(Layout::nhwc, 2048, 264, 64, 8, off_grid));
  EXPECT_FALSE(group_norm_silu_fits(Layout::nhwc, 2048, 260, 64, 4, on_grid));
  for (const auto layout : {Layout::nchw, Layout::nhwc}) {
    const auto x = torch::zeros({1, 2048, 1, 1}), w = torch::ones({2048}), b = torch::zeros({2048});
    auto y = torch::empty_like(x);
    const char* failure = cuda_kernels::emulated::group_norm_silu_forward(
        cuda_kernels::Dtype::f32, layout, x.data_ptr(), w.data_ptr(), b.data_ptr(), nullptr, 0,
        nullptr, 0, y.data_ptr(), 1, 2048, 1, 1, 1e-5f, nullptr);
    ASSERT_NE(failure, nullptr);
    EXPECT_NE(std::string(failure).find("outside what the kernel indexes"), std::string::npos);
  }
}

}  // namespace
}  // namespace spritetorch::diffusion
