// CUDA's execution model on the CPU, for running the project's .cu kernels in the tests without a
// GPU. A launch runs the grid's blocks one after another; a block's threads are cooperative fibers
// (ucontext) on the calling thread, run round-robin: each runs until it waits at a barrier
// (__syncthreads for the block; the warp's for __shfl_xor_sync, which exchanges values through
// the warp's slots) or ends. __shared__ variables become static locals, shared by the running
// block's fibers (blocks do not overlap, so each block finds them as its own). Include it before
// the .cu file, which then builds as C++ (SPRITETORCH_CUDA_STAND_IN, SPRITETORCH_CUDA_EMULATOR).
//
// What it checks: the kernels' indexing, reductions, packing and conversions, on the same source
// nvcc compiles. What it cannot: timing, the hardware's memory model beyond the barriers, and the
// GPU's fast intrinsics (__expf is std::exp here), which the CUDA tests on a GPU hold to LibTorch.
// A barrier that not every thread it counts reaches (undefined in CUDA) is a test failure here.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#define SPRITETORCH_CUDA_STAND_IN 1
#define SPRITETORCH_CUDA_EMULATOR 1

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

// The running fiber's coordinates (one block runs at a time, on one OS thread).
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emulator {

// Counts arrivals; the generation moves on when the last expected one arrives.
struct Barrier {
  unsigned expected = 0, arrived = 0, generation = 0;
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  dim3 index;
  bool done = false;
};

// The running block: its fibers, the scheduler's context, the barriers and the warps' slots.
struct Block {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<Barrier> warps;  // one per 32 threads
  Barrier block;
  std::vector<float> slots;  // one per thread, for the shuffles
  std::function<void()> body;
  unsigned current = 0;
  unsigned long progress = 0;  // arrivals and endings: a round without any is a deadlock
};
inline Block* running = nullptr;

inline void fiber_entry() {
  Block& b = *running;
  b.body();
  b.fibers[b.current].done = true;  // returns to the scheduler through uc_link
  ++b.progress;
}

// Arrive at `barrier` and let the others run until its generation moves on.
inline void wait_at(Barrier& barrier) {
  Block& b = *running;
  const unsigned generation = barrier.generation;
  ++b.progress;
  if (++barrier.arrived == barrier.expected) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  const unsigned me = b.current;
  while (barrier.generation == generation) swapcontext(&b.fibers[me].context, &b.scheduler);
}

// A fresh context on the fiber's stack that runs fiber_entry, then resumes `back`. Its own
// function: getcontext returns twice, like setjmp, which g++ warns clobbers its caller's locals.
[[gnu::noinline]] inline void start_at_entry(Fiber& f, ucontext_t* back) {
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.data();
  f.context.uc_stack.ss_size = f.stack.size();
  f.context.uc_link = back;
  makecontext(&f.context, fiber_entry, 0);
}

inline unsigned linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block_size, Args... args) {
  constexpr size_t kStack = 64 * 1024;  // a kernel's frames and the emulator's: a few KB
  const unsigned threads = block_size.x * block_size.y * block_size.z;
  Block b;
  b.fibers.resize(threads);
  b.slots.resize(threads);
  b.warps.resize((threads + 31) / 32);
  for (unsigned w = 0; w < b.warps.size(); ++w)
    b.warps[w].expected = std::min(32u, threads - 32 * w);
  b.block.expected = threads;
  b.body = [&] { kernel(args...); };
  running = &b;
  blockDim = block_size;
  gridDim = grid;
  for (auto& f : b.fibers) f.stack.resize(kStack);
  for (unsigned n = 0; n < grid.x * grid.y * grid.z; ++n) {
    blockIdx = dim3(n % grid.x, n / grid.x % grid.y, n / (grid.x * grid.y));
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = b.fibers[t];
      f.done = false;
      f.index = dim3(t % block_size.x, t / block_size.x % block_size.y,
                     t / (block_size.x * block_size.y));
      start_at_entry(f, &b.scheduler);
    }
    for (unsigned left = threads; left > 0;) {
      const unsigned long before = b.progress;
      for (unsigned t = 0; t < threads; ++t) {
        if (b.fibers[t].done) continue;
        b.current = t;
        threadIdx = b.fibers[t].index;
        swapcontext(&b.scheduler, &b.fibers[t].context);
        if (b.fibers[t].done) --left;
      }
      if (left > 0 && b.progress == before) {
        running = nullptr;
        throw std::runtime_error(
            "cuda_emulator: a barrier that not every thread it counts reaches");
      }
    }
  }
  running = nullptr;
}

}  // namespace cuda_emulator

inline void __syncthreads() { cuda_emulator::wait_at(cuda_emulator::running->block); }

// Every thread of the warp calls it (as CUDA code must, with a full mask): each posts its value,
// the warp meets, each reads its partner's, and the warp meets again before the slots are reused.
inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask, int width = 32) {
  auto& block = *cuda_emulator::running;
  const unsigned me = cuda_emulator::linear_thread();
  auto& warp = block.warps[me / 32];
  block.slots[me] = value;
  cuda_emulator::wait_at(warp);
  const unsigned lane = me % 32, span = static_cast<unsigned>(width);
  const unsigned partner = (lane ^ static_cast<unsigned>(lane_mask)) % span + lane / span * span;
  const float other = block.slots[me - lane + partner];
  cuda_emulator::wait_at(warp);
  return other;
}

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::fmaxf;
