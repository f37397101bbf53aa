// The fused CPU step's loss (train/cpu_mlp_step.cpp): softmax cross-entropy over rows of logits,
// its gradient, and the count of rows whose first maximum is the label, in one pass.
//
// As a scalar loop, two std::exp per logit, it took 4.2 us of phase 2's ~25 us on each thread of
// the seed step (32 rows of 10 classes, Zen 5 VM). With AVX-512 each row of up to 16 classes is
// one vector (exp by range reduction and a degree-7 polynomial, within 3 ulp of std::exp); the
// loop is the reference, and the kernel for more classes or without AVX-512.
#pragma once

#include <cstdint>

#include "common/small_gemm.h"

namespace spritetorch::train {

struct SoftmaxLossSums {
  double loss = 0.0;    // sum over the rows of -log softmax(logits)[label]
  int64_t correct = 0;  // rows whose first largest logit is the label's (torch's argmax)
};

// logits, dz: (rows, classes) row-major; labels in [0, classes). Writes
//   dz[r][k] = (softmax(logits[r])[k] - (k == labels[r])) * grad_scale
// (grad_scale = 1 / batch gives the batch-mean loss's gradient). kernel: avx512 where available
// takes the vector form (rows of <= 16 classes), anything else the loop.
SoftmaxLossSums softmax_cross_entropy(const float* logits, const int64_t* labels, int rows,
                                      int classes, float grad_scale, float* dz,
                                      gemm::Kernel kernel = gemm::best_kernel());

}  // namespace spritetorch::train
