// A 3x3 convolution (stride 1, zero padding 1, no dilation or groups) on fp32 CPU tensors,
// channels_last or NCHW, forward and backward, with AVX2 kernels: the conv nets' inner
// convolutions on AVX2 CPUs (fastcnn's second and third stages, the `cnn` model's second
// convolution, the generator UNet's ResBlocks), in either layout the model runs.
//
// Why: on a Zen 3 (AVX2) core LibTorch 1.13's oneDNN convolutions reach 50-75 GFLOP/s on both
// cores at fastcnn's channel counts (16 -> 32 at 14x14, 32 -> 64 at 7x7, batch 256), about a third
// of the cores' FMA peak, and they were three quarters of the recipe's CPU step
// (docs/benchmarks.md). Here each image is padded into a buffer that stays in L1 with one
// 16-channel panel of the weights, and every product is a register block (6 output pixels x 16
// channels for the outputs and the input gradient, 4 output channels x 24 (tap, channel) columns
// for the weight gradient). The kernels work in (H, W, C) per image: an NCHW image is transposed
// (8 x 8 register blocks) into that buffer, and its result back, while both are in cache.
// The weight gradient passes over strips of rows that stay in L2 (the UNet's 32 x 32 x 96 images
// do not fit it whole).
//
// The images go over LibTorch's threads (forward, input gradient); the weight gradient sums fixed
// groups of images in a fixed order, so no result depends on the thread count. On AVX-512 CPUs
// oneDNN's AVX-512 convolutions are kept (these kernels are AVX2 and unmeasured there), as they are
// for anything else the conditions below leave out.
#pragma once

#include <torch/torch.h>

#include <string>

namespace spritetorch::models {

// conv(x): through the AVX2 kernels when conv3x3_fused(conv, x), else conv's own forward.
torch::Tensor conv3x3(torch::nn::Conv2dImpl& conv, const torch::Tensor& x);

// Whether conv3x3 takes the AVX2 kernels: the kernels on (set_conv3x3_kernel), the avx2 matrix
// kernel selected (gemm::best_kernel(): an AVX2 CPU without AVX-512, or
// SPRITETORCH_GEMM_KERNEL=avx2), LibTorch's threads usable by the op (as for the fused BatchNorm),
// no CPU autocast; conv 3x3, stride 1, zero padding 1, dilation 1, one group, fp32 CPU weights (and
// bias, when it has one), in and out channels multiples of 8; x (B, C, H, W) fp32 on the CPU,
// channels_last or NCHW contiguous.
bool conv3x3_fused(const torch::nn::Conv2dImpl& conv, const torch::Tensor& x);

// The op alone, with autograd: conv2d(x, weight, bias, stride 1, padding 1) for x (B, Cin, H, W)
// channels_last or NCHW contiguous, weight (Cout, Cin, 3, 3), bias (Cout) or undefined; the result
// and x's gradient in x's layout (channels_last where x is both). Callers check the conditions
// (conv3x3_fused); the tests call it directly.
torch::Tensor conv3x3_avx2(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias);

// The kernels on or off for the whole process: for comparing with LibTorch's convolutions (the
// tests, bench/fastcnn_step_bench, bench/unet_step_bench). On unless SPRITETORCH_CONV3X3=0; the
// first call reads it (an Error for a value other than 0 or 1).
void set_conv3x3_kernel(bool on);
bool conv3x3_kernel();
// "avx2" where conv3x3 can take its kernels for some convolution here (in a build without OpenMP,
// only while LibTorch has one thread), else "off" (`devices`).
std::string conv3x3_code();

}  // namespace spritetorch::models
