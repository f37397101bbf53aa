#include "data/distributed_sampler.h"

#include "common/error.h"

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

}  // namespace spritetorch::data
