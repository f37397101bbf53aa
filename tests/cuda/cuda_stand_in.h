// What the project's .cu files take from CUDA's headers, declared for clang's CUDA front end
// without a CUDA installation (tests/cuda/device_code_test.sh): the attributes, the built-in
// variables, the intrinsics the kernels call and the runtime calls their launchers make. Signatures
// follow CUDA's documentation; the bodies map the intrinsics to clang's NVPTX built-ins. Compiling
// against it checks the kernels' C++ and their PTX code generation, not CUDA's own headers (nvcc
// does that on a GPU machine, CMakeLists.txt).
#pragma once

#include <__clang_cuda_builtin_vars.h>

#include <cstddef>

#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))

struct dim3 {
  unsigned x, y, z;
  __host__ __device__ constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
extern "C" __host__ cudaError_t cudaGetLastError();
extern "C" __host__ const char* cudaGetErrorString(cudaError_t error);
// What clang's kernel-launch syntax (<<<...>>>) calls: this one where no CUDA installation tells
// clang the version, __cudaPushCallConfiguration for CUDA 9.2 and later.
extern "C" __host__ cudaError_t cudaConfigureCall(dim3 grid, dim3 block, size_t shared = 0,
                                                  cudaStream_t stream = nullptr);
extern "C" __host__ unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared = 0,
                                                         void* stream = nullptr);
// What the host-side stub clang writes for each kernel calls.
extern "C" __host__ cudaError_t cudaLaunchKernel(const void* kernel, dim3 grid, dim3 block,
                                                 void** args, size_t shared, cudaStream_t stream);
extern "C" __host__ cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared,
                                                           void* stream);

__device__ inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
__device__ inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }
__device__ inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32) {
  return __nvvm_shfl_sync_bfly_f32(mask, v, lane_mask, ((32 - width) << 8) | 0x1f);
}
__device__ inline float __expf(float x) { return __nvvm_ex2_approx_f(x * 1.4426950408889634f); }
__device__ inline float __fdividef(float a, float b) { return __nvvm_div_approx_f(a, b); }
__device__ inline float rsqrtf(float x) { return __nvvm_rsqrt_approx_f(x); }
__device__ inline float fmaxf(float a, float b) { return __nvvm_fmax_f(a, b); }
