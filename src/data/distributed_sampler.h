// The distributed sampler: each rank's share of one epoch's sample order.
//
// Every rank computes the same epoch_order(n, seed, epoch) (it is seeded by (seed, epoch) only),
// and rank r takes positions r, r + R, r + 2R, ... of it (R ranks), so the shards are disjoint,
// together cover the epoch, and are reshuffled every epoch identically on all ranks. All ranks
// must take the same number of steps, so the shards have equal sizes:
//  - pad (default): the order is extended with its own first R*ceil(n/R) - n entries, so every
//    sample is seen each epoch and at most R-1 samples twice (PyTorch's DistributedSampler does
//    the same);
//  - drop (with --drop-last): the last n mod R entries of the order are dropped this epoch (a
//    different few each epoch, since the order is reshuffled).
// With the per-rank batch B, one step over all ranks visits the same R*B samples as a single
// process with batch R*B over the same order.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace spritetorch::data {

// Samples per rank per epoch.
int64_t shard_size(int64_t n, int64_t ranks, bool drop_tail);

// order: (n) int64 -> (shard_size) int64, rank's share, on order's device.
torch::Tensor shard_order(const torch::Tensor& order, int64_t rank, int64_t ranks, bool drop_tail);

}  // namespace spritetorch::data
