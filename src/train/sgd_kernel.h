// The CPU SGD update of FlatOptimizer::step(): one pass over the flat buffers, split over the fused
// step's threads like the Adam update (train/adam_kernels.h), with subnormals flushed
// (common/flush_subnormals.h: the momentum of a parameter whose gradient stays 0 decays into them).
// PyTorch's arithmetic (torch.optim.SGD): tests compare the two.
#pragma once

#include <cstdint>

namespace spritetorch::train {

struct SgdScalars {
  float lr;
  float momentum;      // 0: none (then `buf` is not touched and may be null)
  float weight_decay;  // L2: the gradient is g + weight_decay * p (0: none)
  bool first_step;     // momentum: the buffer starts as the first gradient
};

// Elements [begin, end) of the parameters p, gradients g and momentum buffer buf (float32):
//   g' = g + weight_decay p;  buf = first_step ? g' : momentum buf + g';  p -= lr (buf or g')
void sgd_update(float* p, const float* g, float* buf, int64_t begin, int64_t end,
                const SgdScalars& k);

}  // namespace spritetorch::train
