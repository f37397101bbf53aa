// The CPU Adam / AdamW update of FlatOptimizer::step(): one pass over the flat buffers instead of
// six, on the widest vectors the CPU has. The kernel follows the fused step's matrix kernel
// (gemm::best_kernel(), so SPRITETORCH_GEMM_KERNEL picks both): avx512 (16 lanes), avx2 or blas
// (8 lanes, AVX2 + FMA where the CPU has them), loops (the plain loop, the reference the tests
// compare the others with).
#pragma once

#include <cstdint>

#include "common/small_gemm.h"

namespace spritetorch::train {

struct AdamScalars {
  float b1, b2, one_minus_b1, one_minus_b2;
  float inv_bias2_sqrt;  // 1 / sqrt(1 - b2^t)
  float eps;
  float neg_step;  // -lr / (1 - b1^t)
  float l2;        // adam's weight decay: the gradient is g + l2 * p (0: none)
  float decay;     // adamw's: p *= decay before the update (1: none)
};

// Elements [begin, end) of the parameters p, gradients g and moments m, v (all float32):
//   g' = g + l2 p;  p *= decay;  m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;
//   p += neg_step m / (sqrt(v) inv_bias2_sqrt + eps)
void adam_update(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                 const AdamScalars& k, gemm::Kernel kernel = gemm::best_kernel());

// The update adam_update() runs for `kernel` on this CPU: "avx512", "avx2" or "loops" (`devices`
// names it).
const char* adam_kernel_name(gemm::Kernel kernel = gemm::best_kernel());

}  // namespace spritetorch::train
