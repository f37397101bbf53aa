// Which elements of which parameters a thread of a split CPU step updates.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace spritetorch::train {

// Elements [begin, end) of `parameter` (contiguous, counted flat).
struct ParameterShare {
  torch::Tensor parameter;
  int64_t begin = 0, end = 0;
};

// Per thread of a ShardPool: shares[t] is what shard t updates.
using ParameterShares = std::vector<std::vector<ParameterShare>>;

}  // namespace spritetorch::train
