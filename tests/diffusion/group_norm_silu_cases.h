// The inputs on which the CUDA GroupNorm + SiLU kernel is held to LibTorch's ops, on a GPU
// (GroupNormSiluCuda) and in the CPU emulator (GroupNormSiluKernelEmulated), and the comparison
// every GroupNorm + SiLU test makes.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "diffusion/group_norm_silu.h"

namespace spritetorch::testing {

struct KernelCase {
  int64_t batch, channels, groups, h, w;
  bool scale_shift, chunked, misaligned;
  double offset;      // the mean of x (its std is 3)
  bool nhwc = false;  // x channels_last (the NHWC kernel)
};

// Rows that take 16-byte packs (4 x 4, 8 x 8: 4 fp32 or 8 bf16 values) and rows that do not (5 x 7,
// 1 x 1, 2 x 2 in bf16), a start off the 16-byte grid, scale and shift as a chunk of a wider tensor
// (rows 2 C apart, as in the UNet) and on their own, one group, 32 channels a group, groups
// larger than a block's 256 threads x 4 values, and means of 300 and -40. Few blocks each (the
// emulator runs a block's 256 threads as fibers).
// channels_last (NHWC), where a thread keeps to one pack of a pixel's channels: packs per pixel
// that divide the block's 256 threads (32 channels; 16 in scalar code) and that do not (24 and 96
// channels: 6 or 3, 24 or 12; 12 channels: 3 packs of fp32, 12 bf16 values in scalar code), packs
// that straddle two groups (bf16 packs of 8 over groups of 4 or 12 channels), a start off the
// 16-byte grid (scalar code), one group of 64 channels over more pixels than a pass takes, and 512
// channels (packs only).
inline std::vector<KernelCase> kernel_cases() {
  return {{2, 16, 4, 5, 7, true, true, false, 1.5},
          {1, 16, 8, 5, 7, false, false, false, 1.5},
          {2, 16, 2, 4, 4, true, false, false, 1.5},
          {2, 16, 2, 4, 4, true, true, true, 1.5},
          {2, 12, 1, 4, 4, true, true, false, 1.5},
          {1, 8, 8, 1, 1, false, false, false, 1.5},
          {1, 64, 2, 8, 8, true, true, false, 1.5},
          {1, 8, 4, 2, 2, true, true, false, 1.5},
          {1, 8, 2, 24, 24, true, true, false, 300},
          {1, 8, 1, 24, 24, false, false, true, -40},
          {2, 32, 8, 4, 4, true, true, false, 1.5, true},
          {2, 24, 2, 5, 7, true, false, false, 1.5, true},
          {1, 12, 3, 6, 6, false, false, false, 1.5, true},
          {2, 16, 8, 3, 3, true, true, true, 1.5, true},
          {1, 64, 1, 24, 24, true, true, false, 300, true},
          {1, 512, 8, 2, 3, true, true, false, -40, true},
          {2, 96, 8, 8, 8, true, true, false, 1.5, true}};
}

inline std::string describe(torch::ScalarType dtype, const KernelCase& c) {
  return std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + " B" + std::to_string(c.batch) +
         " C" + std::to_string(c.channels) + " G" + std::to_string(c.groups) + " " +
         std::to_string(c.h) + "x" + std::to_string(c.w) + (c.scale_shift ? " scale-shift" : "") +
         (c.chunked ? " chunked" : "") + (c.misaligned ? " misaligned" : "") + " offset " +
         std::to_string(c.offset) + (c.nhwc ? " NHWC" : "");
}

// x: (B, C, H, W), NCHW or channels_last as the case says; weight, bias: (C); scale, shift:
// (B, C, 1, 1) or undefined.
struct KernelInputs {
  torch::Tensor x, weight, bias, scale, shift;
};

inline KernelInputs make_kernel_inputs(const KernelCase& c, const torch::TensorOptions& on) {
  torch::manual_seed(17);
  KernelInputs in;
  const int64_t values = c.batch * c.channels * c.h * c.w;
  // Misaligned: a view one value into a larger buffer, contiguous but off the 16-byte grid.
  const auto buffer = (torch::randn({values + 1}) * 3 + c.offset).to(on);
  const auto span = buffer.narrow(0, c.misaligned ? 1 : 0, values);
  in.x = c.nhwc ? span.view({c.batch, c.h, c.w, c.channels}).permute({0, 3, 1, 2})
                : span.view({c.batch, c.channels, c.h, c.w});
  in.weight = (1 + 0.3 * torch::randn({c.channels})).to(on);
  in.bias = (0.2 * torch::randn({c.channels})).to(on);
  if (c.scale_shift && c.chunked) {
    const auto parts = torch::randn({c.batch, 2 * c.channels, 1, 1}).to(on).chunk(2, 1);
    in.scale = parts[0];  // views with rows 2 C values apart
    in.shift = parts[1];
  } else if (c.scale_shift) {
    in.scale = (0.5 * torch::randn({c.batch, c.channels, 1, 1})).to(on);
    in.shift = torch::randn({c.batch, c.channels, 1, 1}).to(on);
  }
  return in;
}

// LibTorch's ops in float64 on the same values, on the CPU. (The fp32 ops round a x + d with
// a = rstd weight, so a group of one value, rstd ~ 316, leaves them 5e-5 off where the kernel is
// exact.)
inline torch::Tensor reference_in_float64(const KernelInputs& in, int64_t groups) {
  const auto f64 = [](const torch::Tensor& t) {
    return t.defined() ? t.cpu().to(torch::kFloat64) : t;
  };
  return diffusion::group_norm_silu_reference(f64(in.x), groups, f64(in.weight), f64(in.bias), 1e-5,
                                              f64(in.scale), f64(in.shift));
}

// got within tolerance x (1 + want's largest magnitude) of want, everywhere; got is compared in
// want's dtype on want's device.
inline void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = want.abs().max().item<double>();
  const double error =
      (got.to(want.device(), want.scalar_type()) - want).abs().max().item<double>();
  EXPECT_LE(error, tolerance * (1 + scale))
      << what << ": largest difference " << error << " against values up to " << scale;
}

// got against the float64 truth, held to what LibTorch's own float32 ops (lib) reach on the same
// inputs: within tolerance x (1 + truth's largest magnitude), or within twice lib's error where
// that is larger. The ops' rounding differs between LibTorch versions (their reductions'
// order, their formulas for a group's variance); the fused kernel need only be as close to the
// truth as they are, not equal to whichever of them this build has.
inline void expect_as_close_as_libtorch(const torch::Tensor& got, const torch::Tensor& lib,
                                        const torch::Tensor& truth, double tolerance,
                                        const std::string& what) {
  ASSERT_EQ(lib.sizes(), truth.sizes()) << what;
  const double scale = truth.abs().max().item<double>();
  const double theirs =
      (lib.to(truth.device(), truth.scalar_type()) - truth).abs().max().item<double>();
  // expect_close's bound is tolerance x (1 + scale): twice lib's error, as such a tolerance.
  expect_close(got, truth, std::max(tolerance, 2 * theirs / (1 + scale)),
               what + " (LibTorch's float32 ops: " + std::to_string(theirs) + " off)");
}

}  // namespace spritetorch::testing
