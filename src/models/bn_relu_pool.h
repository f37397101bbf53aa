// A BatchNorm in training mode, ReLU and a 2x2 max-pool as one operation: the stages of the
// `--recipe` CNNs (models/classifier.h: FastCnnImpl).
//
// Unfused, LibTorch runs them as about seven passes over the convolution's output in forward and
// backward (the norm's statistics and output, ReLU, the pool and its int64 indices; in backward the
// pool's zero fill and scatter, ReLU's mask, the norm's two passes) and keeps three tensors of that
// size for backward: over half of a CPU training step of fastcnn (torch 1.13 profile, batch 256,
// 2 threads), where the convolutions themselves take about a third. The fused op works one channel
// at a time, all of its planes, so its second pass finds the channel in L2: forward reads x twice
// and writes the pooled output and one byte per output (which of the window's four won, or none
// when ReLU cut it); backward reads those, the output gradient and x, and writes dx. It keeps x,
// which the convolution's backward keeps anyway.
//
// CPU, fp32 or bf16 x (bf16 autocast hands the norm the convolution's bf16 output; the result is in
// x's dtype, as LibTorch's), contiguous NCHW, a BatchNorm with affine weights and running
// statistics. channels_last x takes a form with the channels in the vector lanes and the images
// over the threads (AVX-512 and AVX2: the layout CNNs train in there). In eval mode, on AVX-512 and
// AVX2, a forward without the statistics (bn_relu_pool_inference_fused). Elsewhere (CUDA, a CPU
// without AVX2) it is the LibTorch ops.
#pragma once

#include <torch/torch.h>

#include <string>

#include "common/small_gemm.h"

namespace spritetorch::models {

// max_pool2d(relu(bn(x)), 2): x (B, C, H, W) -> (B, C, H / 2, W / 2), rows and columns past an even
// size dropped by the pool as LibTorch's floor mode drops them. In training mode it updates bn's
// running statistics and num_batches_tracked as bn(x) does. `kernel` picks the CPU code (avx512,
// avx2: vectorised for that instruction set; anything else: the same loops for any CPU); the tests
// run every one the machine has against the LibTorch ops.
torch::Tensor bn_relu_pool(torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                           gemm::Kernel kernel = gemm::best_kernel());

// The first stage of such a CNN, from images that need no gradient: max_pool2d(relu(bn(conv(x))),
// 2) with conv a 3x3 convolution, padding 1, no bias. Fused (in training, on the CPU, fp32 x with
// at most 8 channels) it never stores the convolution's output: the norm's statistics and the
// weight gradient come from sums over the batch's 3x3 neighbourhoods (bn_relu_pool.cpp), and each
// image's output is made, normalised and pooled in a buffer that stays in cache. With the weight
// frozen (no requires_grad: `--first-conv whitened`) and AVX-512 or AVX2 code, forward keeps each
// pool winner's normalised value and backward makes only the norm's two gradients from them.
// Returns fp32, or bf16 under bf16 autocast (the values autocast's cast for the next convolution
// would make), in `layout` (NCHW or channels_last: the next convolution's, which then needs no
// copy). Elsewhere bn_relu_pool(bn, conv(x)).
torch::Tensor first_conv_bn_relu_pool(torch::nn::Conv2dImpl& conv, torch::nn::BatchNorm2dImpl& bn,
                                      const torch::Tensor& x,
                                      gemm::Kernel kernel = gemm::best_kernel(),
                                      torch::MemoryFormat layout = torch::MemoryFormat::Contiguous);
bool first_conv_bn_relu_pool_fused(const torch::nn::Conv2dImpl& conv,
                                   const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x);

// The same with LibTorch's ops: the reference, and the path wherever the fused op does not run.
torch::Tensor bn_relu_pool_reference(torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x);

// Whether bn_relu_pool takes the fused op for these inputs: enabled, bn in training mode with
// affine weights and running statistics, x on the CPU, fp32 or bf16, contiguous NCHW (or
// channels_last with the avx512 or avx2 kernel), at least 2 x 2, and the op able to split its loops
// over LibTorch's threads (built with OpenMP, see CMakeLists.txt, or one thread).
bool bn_relu_pool_fused(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                        gemm::Kernel kernel = gemm::best_kernel());

// Whether bn_relu_pool takes the fused forward in eval mode: the same conditions but bn in eval
// mode and no gradient wanted (grad mode off, or neither x nor bn's weights needing one), on the
// avx512 or avx2 code path (either layout). The norm is then a x + d from the running statistics,
// and a window with a NaN gives NaN, as LibTorch's ops do.
bool bn_relu_pool_inference_fused(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                                  gemm::Kernel kernel = gemm::best_kernel());

// The fused op on or off for the whole process: for comparing a step with and without it (the
// tests, bench/fastcnn_step_bench). On unless SPRITETORCH_FUSED_BN_POOL=0; the first call reads
// the variable and throws Error for a value other than 0 or 1 (the CLI calls it before any work).
void set_bn_relu_pool_fusion(bool on);
bool bn_relu_pool_fusion();

// What `devices` says of the op: the code path the fused op takes here ("avx512", "avx2",
// "loops"), or "off" (SPRITETORCH_FUSED_BN_POOL=0), and whether its loops use every LibTorch
// thread (else the op runs only where LibTorch has one thread; see CMakeLists.txt).
std::string bn_relu_pool_code();
bool bn_relu_pool_threaded();
// Whether the fused CPU ops (this one, models/conv3x3.h) run with LibTorch's threads as they are
// now: their loops use every thread (bn_relu_pool_threaded()), or LibTorch has one. Without
// OpenMP at::parallel_for runs on one thread, where LibTorch's own ops use all of them.
bool fused_ops_use_these_threads();
// Whether channels_last tensors take the fused op here (its NHWC form: the avx512 and avx2 code).
bool bn_relu_pool_channels_last();

}  // namespace spritetorch::models
