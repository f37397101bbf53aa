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

#include "data/dataset.h"

namespace spritetorch::data {

// Local shards (--dist-shard local): an alternative to re-sharding every epoch's order. The
// dataset is split once, from a shuffle seeded by `seed` alone, into R fixed disjoint shards of
// equal size (padded or dropped as above), and each rank keeps only its own; every epoch then
// reshuffles within the shard. A rank's resident copy costs 1/R of the dataset's device memory,
// at the price of batches that differ from a single process's (each rank sees a fixed subset).
//
// full: the whole dataset -> rank's shard (its rows, copied; named "<name>, shard r/R").
Dataset local_shard(const Dataset& full, int64_t rank, int64_t ranks, uint64_t seed,
                    bool drop_tail);

// Samples per rank per epoch.
int64_t shard_size(int64_t n, int64_t ranks, bool drop_tail);

// order: (n) int64 -> (shard_size) int64, rank's share, on order's device.
torch::Tensor shard_order(const torch::Tensor& order, int64_t rank, int64_t ranks, bool drop_tail);

}  // namespace spritetorch::data
