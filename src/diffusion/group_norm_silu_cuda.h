// The sampler's GroupNorm + scale-shift + SiLU as one CUDA kernel, forward only (no autograd), for
// NCHW and for channels_last (NHWC) activations.
//
// LibTorch runs silu(GroupNorm(x) (1 + scale) + shift) on CUDA as five or six kernels, each a full
// pass over the activations (the norm's statistics and its affine, the scale, the shift, SiLU); a
// profile of the generator's sampling pass put 58-62% of its GPU time in such elementwise kernels
// (docs/sprites.md). This one reads each (sample, group) block of x twice (its statistics, then
// the output; the second read mostly from L2) and writes y once.
//
// Plain CUDA with a C-like interface: no LibTorch headers, so nvcc compiles it on its own and the
// build can leave it out when nvcc cannot (CMakeLists.txt); diffusion/group_norm_silu.cpp is the
// caller. Built only where SPRITETORCH_WITH_CUDA_KERNELS is 1.
#pragma once

#include <cstdint>

namespace spritetorch::diffusion::cuda_kernels {

enum class Dtype : int { f32 = 0, bf16 = 1 };
// NCHW: contiguous (batch, channels, hw). NHWC: channels_last, contiguous (batch, hw, channels).
enum class Layout : int { nchw = 0, nhwc = 1 };

// What the kernels index: NCHW, a block per (sample, group) in a 1-D grid and a group's
// per-channel factors in 8 KB of shared memory (2 floats a channel); NHWC, a block per sample, its
// threads' sums and every channel's factors in shared memory (24-32 KB), each of its 256 threads
// keeping to one pack of a pixel's channels, so a pixel's channels in scalar code (a start off the
// 16-byte grid, or a channel count no 16-byte pack divides: fp32 by 4, bf16 by 8) must not
// outnumber the threads. Channel and pixel indices in 32 bits.
constexpr int64_t kMaxBlocks = 2147483647;
constexpr int kMaxGroupChannels = 1024;
constexpr int kMaxNhwcChannels = 1024;
constexpr int kNhwcScalarChannels = 256;
constexpr int64_t kMaxSampleValues = 2147483647;

// Whether the kernel for `layout` takes these sizes, x starting at `x` (NHWC with more channels
// than kNhwcScalarChannels needs 16-byte packs: x 16-byte aligned and 8 | channels).
inline bool group_norm_silu_fits(Layout layout, int64_t batch, int64_t channels, int64_t hw,
                                 int64_t groups, const void* x) {
  if (batch < 1 || channels < 1 || hw < 1 || groups < 1 || channels % groups != 0 ||
      hw > kMaxSampleValues / channels)
    return false;
  if (layout == Layout::nchw)
    return channels / groups <= kMaxGroupChannels && batch <= kMaxBlocks / groups;
  const bool packs = channels % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  return channels <= kMaxNhwcChannels && batch <= kMaxBlocks &&
         (channels <= kNhwcScalarChannels || packs);
}

// x, y: (batch, channels, hw) in `layout`, of `dtype`, y laid out as x; weight, bias: (channels);
// scale, shift: (batch, channels) with rows scale_stride and shift_stride values apart (a chunk of
// the UNet's embedding projection is a view with rows 2 channels apart), or null. All of `dtype`
// (bf16 as raw 16-bit values), on the current device.
// y = silu(((x - mean_g) rstd_g weight_c + bias_c) (1 + scale_nc) + shift_nc), statistics in fp32.
// Enqueued on `stream` (a cudaStream_t; null: the legacy default stream); nothing waits for it.
// Returns null, or CUDA's message when the launch failed (e.g. no kernel for this GPU's
// architecture), for the caller to fall back on LibTorch's ops.
const char* group_norm_silu_forward(Dtype dtype, Layout layout, const void* x, const void* weight,
                                    const void* bias, const void* scale, int64_t scale_stride,
                                    const void* shift, int64_t shift_stride, void* y, int64_t batch,
                                    int64_t channels, int64_t hw, int64_t groups, float eps,
                                    void* stream);

}  // namespace spritetorch::diffusion::cuda_kernels
