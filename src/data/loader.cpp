#include "data/loader.h"

#include "common/error.h"
#include "data/distributed_sampler.h"

namespace spritetorch::data {

torch::Tensor epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (!shuffle) return torch::arange(n, torch::kInt64);
  // One generator per epoch, seeded from both numbers, so epoch k's order does not depend on how
  // many random numbers earlier epochs drew (this is what makes a resumed run see the same data).
  const uint64_t mixed = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mixed);
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
}

int64_t count_batches(int64_t samples, int64_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

ResidentLoader::ResidentLoader(const Dataset& dataset, torch::Device device, LoaderOptions options)
    : device_(device), options_(options) {
  if (options_.batch_size <= 0)
    throw Error("batch size must be positive, got " + std::to_string(options_.batch_size));
  if (dataset.size() == 0) throw Error("dataset '" + dataset.name + "' is empty");
  inputs_ = dataset.inputs.to(device_).contiguous();
  labels_ = dataset.labels.to(device_).contiguous();
}

int64_t ResidentLoader::batches_per_epoch() const {
  return count_batches(epoch_size(), options_.batch_size, options_.drop_last);
}

int64_t ResidentLoader::epoch_size() const {
  const int64_t n = inputs_.size(0);
  return options_.shard_count > 1 ? shard_size(n, options_.shard_count, options_.drop_last) : n;
}

int64_t ResidentLoader::samples_per_epoch() const {
  const int64_t n = epoch_size();
  return options_.drop_last ? n / options_.batch_size * options_.batch_size : n;
}

void ResidentLoader::start_epoch(int64_t epoch) {
  cursor_ = 0;
  order_ = options_.shuffle
               ? epoch_order(inputs_.size(0), options_.seed, epoch, true).to(device_)
               : torch::Tensor();
  if (options_.shard_count > 1) {
    const auto full = order_.defined() ? order_ : torch::arange(inputs_.size(0), torch::kInt64).to(device_);
    order_ = shard_order(full, options_.shard_rank, options_.shard_count, options_.drop_last);
  }
}

bool ResidentLoader::next(Batch& batch) {
  const int64_t n = epoch_size();
  const int64_t remaining = n - cursor_;
  if (remaining <= 0 || (options_.drop_last && remaining < options_.batch_size)) return false;
  const int64_t b = std::min(options_.batch_size, remaining);
  if (order_.defined()) {
    const auto index = order_.narrow(0, cursor_, b);
    batch.inputs = to_model_input(inputs_.index_select(0, index));
    batch.labels = labels_.index_select(0, index);
  } else {
    batch.inputs = to_model_input(inputs_.narrow(0, cursor_, b));
    batch.labels = labels_.narrow(0, cursor_, b);
  }
  cursor_ += b;
  return true;
}

}  // namespace spritetorch::data
