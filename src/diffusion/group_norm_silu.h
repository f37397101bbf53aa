// The UNet's norm and activation as one operation: silu(GroupNorm(x) (1 + scale) + shift).
//
// Unfused, LibTorch runs it as four or five passes over x's size (the norm, the scale, the shift,
// SiLU; in backward each again) and keeps three more tensors of that size for backward: about a
// fifth of a CPU training step at 32 x 32 (torch 1.13 profile, 2 threads). On the CPU in fp32 the
// fused kernel reads x twice in forward (each group's statistics, then the output) and dy and x
// once each, then the stored dz and x once more, in backward; it keeps x and two numbers per group.
// On CUDA without gradients (sampling, evaluation) in fp32 or bf16, NCHW or channels_last, it is
// one kernel of ours where the build has it (diffusion/group_norm_silu_cuda.h). Elsewhere
// (training on CUDA, bf16 or channels_last on the CPU, other layouts) it is the LibTorch ops.
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

// Whether group_norm_silu takes the CUDA kernel (forward only) for these inputs: a build with it,
// the fusion on, x on a CUDA device in fp32 or bf16, contiguous NCHW or channels_last (NHWC),
// weight in x's dtype on x's
// device, and gradients off (GradMode: the sampler and eval run under NoGradGuard or
// InferenceMode). After a failed launch (e.g. a GPU the build has no code for) false for good.
bool group_norm_silu_cuda_kernel(const torch::Tensor& x, const torch::Tensor& weight);
// Whether this build compiled the CUDA kernel (CMakeLists.txt: a CUDA build whose nvcc compiles
// it).
bool group_norm_silu_cuda_kernel_built();

// The fused kernels (CPU and CUDA) on or off for the whole process: on unless
// SPRITETORCH_GROUP_NORM_SILU=0, for comparing a step, a pass or a net's gradients with and
// without them (the tests, bench/unet_step_bench, `generate` on a GPU). A value other than 0 or 1
// is an Error naming the variable.
void set_group_norm_silu_fusion(bool on);
bool group_norm_silu_fusion();

}  // namespace spritetorch::diffusion
