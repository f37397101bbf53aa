#include "data/distributed_sampler.h"

#include "common/error.h"
#include "data/loader.h"

namespace spritetorch::data {

int64_t shard_size(int64_t n, int64_t ranks, bool drop_tail) {
  if (ranks <= 0) throw Error("distributed sampler: the number of ranks must be positive");
  return drop_tail ? n / ranks : (n + ranks - 1) / ranks;
}

torch::Tensor shard_order(const torch::Tensor& order, int64_t rank, int64_t ranks, bool drop_tail) {
  if (rank < 0 || rank >= ranks)
    throw Error("distributed sampler: rank " + std::to_string(rank) + " outside [0, " +
                std::to_string(ranks) + ")");
  const int64_t n = order.size(0);
  const int64_t per_rank = shard_size(n, ranks, drop_tail);
  if (per_rank == 0)
    throw Error("distributed sampler: " + std::to_string(n) + " samples cannot feed " +
                    std::to_string(ranks) + " ranks",
                "use fewer ranks or more data");
  const int64_t total = per_rank * ranks;
  // Positions rank, rank + R, ...; wrapped modulo n when padding.
  auto positions = torch::arange(rank, total, ranks, torch::TensorOptions().dtype(torch::kInt64));
  if (total > n) positions = positions.remainder(n);
  return order.index_select(0, positions.to(order.device()));
}

Dataset local_shard(const Dataset& full, int64_t rank, int64_t ranks, uint64_t seed,
                    bool drop_tail) {
  // The split must not depend on the epoch: epoch_order's epoch argument is fixed to -1, which no
  // training epoch uses, so the split differs from every epoch's own order.
  const auto order = epoch_order(full.size(), seed, /*epoch=*/-1, /*shuffle=*/true);
  const auto rows = shard_order(order, rank, ranks, drop_tail);  // (shard) int64, CPU
  Dataset shard = full;
  shard.inputs = full.inputs.index_select(0, rows.to(full.inputs.device()));
  shard.labels = full.labels.index_select(0, rows.to(full.labels.device()));
  shard.name = full.name + ", shard " + std::to_string(rank) + "/" + std::to_string(ranks);
  return shard;
}

}  // namespace spritetorch::data
