// silu(GroupNorm(x) (1 + scale) + shift) in one CUDA kernel, forward only (group_norm_silu_cuda.h).
//
// One block of 256 threads per (sample, group): the group's channels lie together in NCHW, so the
// block reads one contiguous span, 16 bytes a thread at a time where the rows allow it (4 fp32 or
// 8 bf16 values: one 128-bit load), sums it and its squares in fp32 about the span's first value
// (so a mean far from zero does not cancel the variance away), reduces over warps, works out a =
// weight rstd (1 + scale) and d = bias (1 + scale) + shift per channel into shared memory, and
// writes y = silu(a (x - mean) + d) from a second read of the span (which is still in L2: a 32 x 32
// group of 4 channels is 8 KB in bf16).
//
// channels_last (NHWC) puts a pixel's channels together, so a group's values are short runs
// (group_channels of them) one pixel row apart: one block per sample reads the whole sample in
// coalesced 16-byte packs instead, each thread keeping to one pack of channels over the pixels it
// takes; the threads' sums meet per channel in shared memory, in a fixed order, then per group.
#include "diffusion/group_norm_silu_cuda.h"

// SPRITETORCH_CUDA_STAND_IN: compiled against tests/cuda's stand-ins for CUDA's headers, by clang
// (device_code_test.sh) or by the C++ compiler for the CPU emulator of the tests.
#ifndef SPRITETORCH_CUDA_STAND_IN
#include <cuda_runtime.h>
#endif

#include <cstdint>

namespace spritetorch::diffusion::cuda_kernels {

// The tests' emulator compiles this file into the test binary, which in a CUDA build also links
// the nvcc-built kernel from the library: with one name for both, the linker kept the test's copy
// and the library's caller ran the emulator on device pointers (a crash on the GPU). The emulated
// copy has a namespace of its own.
#ifdef SPRITETORCH_CUDA_EMULATOR
namespace emulated {
#endif

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// bf16 as its 16 bits: the kernel needs only the two conversions.
struct Bf16 {
  uint16_t bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(Bf16 v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}
// Rounded to nearest even, as LibTorch rounds fp32 to bf16; a NaN stays a NaN.
__device__ __forceinline__ unsigned bf16_bits(float v) {
  const unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// 16 bytes, moved as one 128-bit load or store (two bf16 share a word, the first in its low half).
struct alignas(16) Words {
  unsigned w[4];
};

// kLanes consecutive values of T at p as floats: one value, or 16 bytes (4 fp32 or 8 bf16).
template <typename T, int kLanes>
__device__ __forceinline__ void load(const T* p, float (&v)[kLanes]) {
  if constexpr (kLanes == 1) {
    v[0] = to_float(*p);
  } else {
    const Words words = *reinterpret_cast<const Words*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kLanes == 4) {
        v[i] = __uint_as_float(words.w[i]);
      } else {
        v[2 * i] = __uint_as_float(words.w[i] << 16);
        v[2 * i + 1] = __uint_as_float(words.w[i] & 0xffff0000u);
      }
    }
  }
}

template <typename T, int kLanes>
__device__ __forceinline__ void store(T* p, const float (&v)[kLanes]) {
  if constexpr (kLanes == 1) {
    if constexpr (sizeof(T) == 4)
      *reinterpret_cast<float*>(p) = v[0];
    else
      reinterpret_cast<Bf16*>(p)->bits = static_cast<uint16_t>(bf16_bits(v[0]));
  } else {
    Words words;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kLanes == 4)
        words.w[i] = __float_as_uint(v[i]);
      else
        words.w[i] = bf16_bits(v[2 * i]) | (bf16_bits(v[2 * i + 1]) << 16);
    }
    *reinterpret_cast<Words*>(p) = words;
  }
}

// A group's mean and 1 / std from the sums of its `count` values and their squares, both taken
// about `origin` (one of its values).
struct GroupStats {
  float mean, rstd;
};
__device__ __forceinline__ GroupStats group_stats_from_sums(float sum, float squares, float count,
                                                            float origin, float eps) {
  const float shifted_mean = sum / count;
  const float variance = fmaxf(squares / count - shifted_mean * shifted_mean, 0.f);
  return {origin + shifted_mean, rsqrtf(variance + eps)};
}

// Channel c of sample n: y = silu(a (x - mean) + d), a = weight rstd (1 + scale),
// d = bias (1 + scale) + shift (scale, shift: null for none).
template <typename T>
__device__ __forceinline__ void channel_factors(const T* weight, const T* bias, const T* scale,
                                                int64_t scale_stride, const T* shift,
                                                int64_t shift_stride, int n, int c, float rstd,
                                                float& a, float& d) {
  const float times = scale ? 1.f + to_float(scale[n * scale_stride + c]) : 1.f;
  const float plus = shift ? to_float(shift[n * shift_stride + c]) : 0.f;
  a = to_float(weight[c]) * rstd * times;
  d = to_float(bias[c]) * times + plus;
}

// silu(z) = z / (1 + e^-z); for z << 0 the quotient's reciprocal of inf is 0, so y = -0.
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.f + __expf(-z)); }

// grid: batch x groups blocks of kThreads.
template <typename T, int kLanes>
__global__ void __launch_bounds__(kThreads)
    group_norm_silu_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                           const T* __restrict__ bias, const T* __restrict__ scale,
                           int64_t scale_stride, const T* __restrict__ shift, int64_t shift_stride,
                           T* __restrict__ y, int channels, int hw, int group_channels, float eps) {
  __shared__ float per_channel[2 * kMaxGroupChannels];  // a: [0, group_channels), d: after them
  __shared__ float warp_sums[2][kWarps];
  __shared__ float stats[2];  // mean, rstd
  const int groups = channels / group_channels;
  const int n = static_cast<int>(blockIdx.x) / groups;
  const int g = static_cast<int>(blockIdx.x) % groups;
  const int64_t first =
      (static_cast<int64_t>(n) * channels + static_cast<int64_t>(g) * group_channels) * hw;
  const int64_t count = static_cast<int64_t>(group_channels) * hw;
  const int64_t packs = count / kLanes;
  const T* in = x + first;
  T* out = y + first;

  const float origin = to_float(x[first]);
  float sum = 0.f, squares = 0.f;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    float v[kLanes];
    load<T, kLanes>(in + p * kLanes, v);
#pragma unroll
    for (int l = 0; l < kLanes; ++l) {
      const float centred = v[l] - origin;
      sum += centred;
      squares += centred * centred;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    warp_sums[0][warp] = sum;
    warp_sums[1][warp] = squares;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f, q = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      s += warp_sums[0][w];
      q += warp_sums[1][w];
    }
    const GroupStats group = group_stats_from_sums(s, q, static_cast<float>(count), origin, eps);
    stats[0] = group.mean;
    stats[1] = group.rstd;
  }
  __syncthreads();
  const float mean = stats[0], rstd = stats[1];
  for (int c = threadIdx.x; c < group_channels; c += kThreads) {
    channel_factors(weight, bias, scale, scale_stride, shift, shift_stride, n,
                    g * group_channels + c, rstd, per_channel[c], per_channel[group_channels + c]);
  }
  __syncthreads();

  const int packs_per_channel = hw / kLanes;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const int c = static_cast<int>(p / packs_per_channel);
    const float a = per_channel[c], d = per_channel[group_channels + c];
    float v[kLanes];
    load<T, kLanes>(in + p * kLanes, v);
#pragma unroll
    for (int l = 0; l < kLanes; ++l) v[l] = silu(a * (v[l] - mean) + d);
    store<T, kLanes>(out + p * kLanes, v);
  }
}

// grid: one block of kThreads per sample, NHWC. Thread t takes the pack of kLanes channels from
// c0 = (t mod packs_per_pixel) kLanes at every (kThreads / packs_per_pixel)-th pixel, so its lanes
// keep their channels; threads past the last whole pixel of a pass only help with the per-channel
// and per-group sums.
template <typename T, int kLanes>
__global__ void __launch_bounds__(kThreads)
    group_norm_silu_nhwc_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                const T* __restrict__ bias, const T* __restrict__ scale,
                                int64_t scale_stride, const T* __restrict__ shift,
                                int64_t shift_stride, T* __restrict__ y, int channels, int hw,
                                int group_channels, float eps) {
  // Each working thread's sums (lane l at [t kLanes + l] = [r channels + c] for its row r of the
  // pass and its channel c), then per channel: the sums, then a and d.
  __shared__ float partial[2][kThreads * kLanes];
  __shared__ float per_channel[2][kMaxNhwcChannels];
  __shared__ float group_stats[2][kMaxNhwcChannels];  // mean, rstd per group
  const int n = static_cast<int>(blockIdx.x);
  const int t = static_cast<int>(threadIdx.x);
  const int packs_per_pixel = channels / kLanes;
  const int pixels_per_pass = kThreads / packs_per_pixel;
  const bool working = t < pixels_per_pass * packs_per_pixel;
  const int c0 = t % packs_per_pixel * kLanes;
  const int64_t first = static_cast<int64_t>(n) * hw * channels;
  const T* in = x + first;
  T* out = y + first;

  // Each lane's values about its group's first value (pixel 0), as the NCHW kernel sums.
  if (working) {
    float origin[kLanes], sum[kLanes], squares[kLanes];
#pragma unroll
    for (int l = 0; l < kLanes; ++l) {
      origin[l] = to_float(in[(c0 + l) / group_channels * group_channels]);
      sum[l] = squares[l] = 0.f;
    }
    for (int p = t / packs_per_pixel; p < hw; p += pixels_per_pass) {
      float v[kLanes];
      load<T, kLanes>(in + static_cast<int64_t>(p) * channels + c0, v);
#pragma unroll
      for (int l = 0; l < kLanes; ++l) {
        const float centred = v[l] - origin[l];
        sum[l] += centred;
        squares[l] += centred * centred;
      }
    }
#pragma unroll
    for (int l = 0; l < kLanes; ++l) {
      partial[0][t * kLanes + l] = sum[l];
      partial[1][t * kLanes + l] = squares[l];
    }
  }
  __syncthreads();
  // Per channel over the pass's rows in a fixed order (no atomics: the same sums every run).
  for (int c = t; c < channels; c += kThreads) {
    float s = 0.f, q = 0.f;
    for (int r = 0; r < pixels_per_pass; ++r) {
      s += partial[0][r * channels + c];
      q += partial[1][r * channels + c];
    }
    per_channel[0][c] = s;
    per_channel[1][c] = q;
  }
  __syncthreads();
  const int groups = channels / group_channels;
  const float count = static_cast<float>(static_cast<int64_t>(group_channels) * hw);
  for (int g = t; g < groups; g += kThreads) {
    float s = 0.f, q = 0.f;
    for (int c = g * group_channels; c < (g + 1) * group_channels; ++c) {
      s += per_channel[0][c];
      q += per_channel[1][c];
    }
    const GroupStats group =
        group_stats_from_sums(s, q, count, to_float(in[g * group_channels]), eps);
    group_stats[0][g] = group.mean;
    group_stats[1][g] = group.rstd;
  }
  __syncthreads();  // every group's statistics are in; the sums are read
  for (int c = t; c < channels; c += kThreads) {
    channel_factors(weight, bias, scale, scale_stride, shift, shift_stride, n, c,
                    group_stats[1][c / group_channels], per_channel[0][c], per_channel[1][c]);
  }
  __syncthreads();
  if (!working) return;
  float a[kLanes], d[kLanes], mean[kLanes];
#pragma unroll
  for (int l = 0; l < kLanes; ++l) {
    a[l] = per_channel[0][c0 + l];
    d[l] = per_channel[1][c0 + l];
    mean[l] = group_stats[0][(c0 + l) / group_channels];
  }
  for (int p = t / packs_per_pixel; p < hw; p += pixels_per_pass) {
    float v[kLanes];
    load<T, kLanes>(in + static_cast<int64_t>(p) * channels + c0, v);
#pragma unroll
    for (int l = 0; l < kLanes; ++l) v[l] = silu(a[l] * (v[l] - mean[l]) + d[l]);
    store<T, kLanes>(out + static_cast<int64_t>(p) * channels + c0, v);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// kernel<<<grid, kThreads, 0, stream>>>(args...), or its blocks' threads on the CPU in the tests'
// emulator (tests/cuda/cuda_emulator.h), which runs this same code.
template <typename... Params, typename... Args>
void start(void (*kernel)(Params...), dim3 grid, cudaStream_t stream, Args... args) {
#ifdef SPRITETORCH_CUDA_EMULATOR
  (void)stream;
  cuda_emulator::launch(kernel, grid, dim3(kThreads), args...);
#else
  // (clang-format would split the launch's >>> apart.)
  // clang-format off
  kernel<<<grid, kThreads, 0, stream>>>(args...);
  // clang-format on
#endif
}

template <typename T>
const char* launch(Layout layout, const void* x, const void* weight, const void* bias,
                   const void* scale, int64_t scale_stride, const void* shift, int64_t shift_stride,
                   void* y, int64_t batch, int64_t channels, int64_t hw, int64_t groups, float eps,
                   void* stream_handle) {
  constexpr int kWide = 16 / static_cast<int>(sizeof(T));
  // A group (NCHW) or a pixel (NHWC) starts at a multiple of hw or channels values, so 16-byte
  // packs stay aligned when that is a multiple of a pack and both tensors start aligned
  // (LibTorch's allocations do).
  const int64_t run = layout == Layout::nchw ? hw : channels;
  const bool wide = run % kWide == 0 && aligned16(x) && aligned16(y);
  if (layout == Layout::nhwc && !wide && channels > kNhwcScalarChannels)
    return "the tensor's channels are outside what the kernel indexes without 16-byte packs";
  using Kernel = void (*)(const T*, const T*, const T*, const T*, int64_t, const T*, int64_t, T*,
                          int, int, int, float);
  Kernel kernel = nullptr;
  if (layout == Layout::nchw)
    kernel = wide ? group_norm_silu_kernel<T, kWide> : group_norm_silu_kernel<T, 1>;
  else
    kernel = wide ? group_norm_silu_nhwc_kernel<T, kWide> : group_norm_silu_nhwc_kernel<T, 1>;
  const int64_t blocks = layout == Layout::nchw ? batch * groups : batch;
  start(kernel, dim3(static_cast<unsigned>(blocks)), static_cast<cudaStream_t>(stream_handle),
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
        static_cast<const T*>(scale), scale_stride, static_cast<const T*>(shift), shift_stride,
        static_cast<T*>(y), static_cast<int>(channels), static_cast<int>(hw),
        static_cast<int>(channels / groups), eps);
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? nullptr : cudaGetErrorString(status);
}

}  // namespace

const char* group_norm_silu_forward(Dtype dtype, Layout layout, const void* x, const void* weight,
                                    const void* bias, const void* scale, int64_t scale_stride,
                                    const void* shift, int64_t shift_stride, void* y, int64_t batch,
                                    int64_t channels, int64_t hw, int64_t groups, float eps,
                                    void* stream) {
  if (!group_norm_silu_fits(layout, batch, channels, hw, groups, x))
    return "the tensor's sizes are outside what the kernel indexes";
  if (dtype == Dtype::bf16)
    return launch<Bf16>(layout, x, weight, bias, scale, scale_stride, shift, shift_stride, y, batch,
                        channels, hw, groups, eps, stream);
  return launch<float>(layout, x, weight, bias, scale, scale_stride, shift, shift_stride, y, batch,
                       channels, hw, groups, eps, stream);
}

#ifdef SPRITETORCH_CUDA_EMULATOR
}  // namespace emulated
#endif

}  // namespace spritetorch::diffusion::cuda_kernels
