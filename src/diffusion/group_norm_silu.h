// The UNet's norm and activation as one operation: silu(GroupNorm(x) (1 + scale) + shift).
//
// Unfused, LibTorch runs it as four or five passes over x's size (the norm, the scale, the shift,
// SiLU; in backward each again) and keeps three more tensors of that size for backward: about a
// fifth of a CPU training step at 32 x 32 (torch 1.13 profile, 2 threads). On the CPU in fp32 the
// fused kernel reads x twice in forward (each group's statistics, then the output) and dy and x
// once each, then the stored dz and x once more, in backward; it keeps x and two numbers per group.
// Elsewhere (CUDA, bf16, a layout other than contiguous NCHW) it is the LibTorch ops.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "common/small_gemm.h"

namespace spritetorch::diffusion {

// x: (B, C, H, W); weight, bias: (C), the GroupNorm's affine; scale, shift: (B, C), or undefined
// for none (a plain GroupNorm + SiLU). Returns (B, C, H, W). Differentiable in every input.
// `kernel` picks the CPU code path (avx2 and avx512: 8-lane AVX2 + FMA; anything else: plain
// loops); the tests run every one the machine has against the LibTorch ops.
torch::Tensor group_norm_silu(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight,
                              const torch::Tensor& bias, double eps,
                              const torch::Tensor& scale = {}, const torch::Tensor& shift = {},
                              gemm::Kernel kernel = gemm::best_kernel());

// The same with LibTorch's ops: the reference, and the path wherever the fused kernel does not run.
torch::Tensor group_norm_silu_reference(const torch::Tensor& x, int64_t groups,
                                        const torch::Tensor& weight, const torch::Tensor& bias,
                                        double eps, const torch::Tensor& scale = {},
                                        const torch::Tensor& shift = {});

// Whether group_norm_silu takes the fused kernel for these inputs (CPU, fp32, contiguous NCHW)
// while it is enabled and it can split its loops over LibTorch's threads (built with OpenMP, see
// CMakeLists.txt, or one thread).
bool group_norm_silu_fused(const torch::Tensor& x, const torch::Tensor& weight);

// The fused kernel on or off for the whole process (on by default): for comparing a step or a
// net's gradients with and without it (the tests, bench/unet_step_bench).
void set_group_norm_silu_fusion(bool on);
bool group_norm_silu_fusion();

}  // namespace spritetorch::diffusion
