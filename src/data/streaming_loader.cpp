#include "data/streaming_loader.h"

#include <system_error>

#include "common/error.h"
#include "data/distributed_sampler.h"

#if SPRITETORCH_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace spritetorch::data {

StreamingLoader::StreamingLoader(const Dataset& dataset, torch::Device device,
                                 LoaderOptions options, StreamingOptions streaming)
    : inputs_(dataset.inputs.cpu().contiguous()),
      labels_(dataset.labels.cpu().contiguous()),
      device_(device),
      options_(options),
      streaming_(streaming) {
  if (options_.batch_size <= 0)
    throw Error("batch size must be positive, got " + std::to_string(options_.batch_size));
  if (dataset.size() == 0) throw Error("dataset '" + dataset.name + "' is empty");
  if (streaming_.workers < 0 || streaming_.workers > kMaxWorkers)
    throw Error("--workers " + std::to_string(streaming_.workers) + ": expected 0 to " +
                std::to_string(kMaxWorkers));
  streaming_.prefetch = std::max(1, streaming_.prefetch);
  streaming_.pin_memory = streaming_.pin_memory && device_.is_cuda();
  // Distributed: this rank's shard of each epoch (data/distributed_sampler.h).
  epoch_size_ = options_.shard_count > 1
                    ? shard_size(inputs_.size(0), options_.shard_count, options_.drop_last)
                    : inputs_.size(0);
  const int64_t n = epoch_size_;
  batches_ = count_batches(n, options_.batch_size, options_.drop_last);
}

StreamingLoader::~StreamingLoader() { stop_workers(); }

int64_t StreamingLoader::batches_per_epoch() const { return batches_; }

int64_t StreamingLoader::samples_per_epoch() const {
  return std::min(epoch_size_, batches_ * options_.batch_size);
}

StreamingLoader::HostBatch StreamingLoader::gather(int64_t index) const {
  const int64_t start = index * options_.batch_size;
  const int64_t b = std::min(options_.batch_size, epoch_size_ - start);
  HostBatch out;
  if (!order_.defined()) {  // not shuffled: a contiguous slice, no copy unless pinning
    out.inputs = inputs_.narrow(0, start, b);
    out.labels = labels_.narrow(0, start, b);
    if (streaming_.pin_memory) {
      out.inputs = out.inputs.pin_memory();
      out.labels = out.labels.pin_memory();
    }
    return out;
  }
  const auto rows = order_.narrow(0, start, b);
  auto in_sizes = inputs_.sizes().vec();
  in_sizes[0] = b;
  const auto pinned = torch::TensorOptions().pinned_memory(streaming_.pin_memory);
  out.inputs = torch::empty(in_sizes, pinned.dtype(inputs_.scalar_type()));
  out.labels = torch::empty({b}, pinned.dtype(torch::kInt64));
  torch::index_select_out(out.inputs, inputs_, 0, rows);
  torch::index_select_out(out.labels, labels_, 0, rows);
  return out;
}

void StreamingLoader::worker_loop() {
  // One LibTorch thread per worker: the workers themselves are the parallelism.
  at::set_num_threads(1);
  const int64_t capacity = streaming_.prefetch + streaming_.workers + 1;
  while (true) {
    int64_t index;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      consumed_.wait(lock, [&] {
        return stopping_ ||
               (next_to_claim_ < batches_ && next_to_claim_ < next_to_take_ + capacity);
      });
      if (stopping_) return;
      index = next_to_claim_++;
    }
    try {
      HostBatch batch = gather(index);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(index, std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      worker_error_ = std::current_exception();
      stopping_ = true;
    }
    produced_.notify_all();
  }
}

void StreamingLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  consumed_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void StreamingLoader::start_epoch(int64_t epoch) {
  stop_workers();
  order_ = training_order(options_, labels_, epoch);
  if (options_.shard_count > 1)
    order_ = shard_order(order_.defined() ? order_ : torch::arange(inputs_.size(0), torch::kInt64),
                         options_.shard_rank, options_.shard_count, options_.drop_last);
  ready_.clear();
  in_flight_.clear();
  next_to_claim_ = next_to_take_ = next_to_send_ = 0;
  stopping_ = false;
  worker_error_ = nullptr;
  try {
    for (int w = 0; w < streaming_.workers; ++w) threads_.emplace_back([this] { worker_loop(); });
  } catch (const std::system_error& e) {  // the system's thread limit
    const size_t started = threads_.size();
    stop_workers();
    throw Error("could not start " + std::to_string(streaming_.workers) +
                    " streaming workers: the system refused thread " + std::to_string(started + 1) +
                    " (" + e.what() + ")",
                "pass fewer --workers");
  }
}

Batch StreamingLoader::to_device(const HostBatch& host) {
  Batch out;
#if SPRITETORCH_WITH_CUDA
  if (device_.is_cuda()) {
    // Copy on a side stream; the compute stream waits on an event, not on the host.
    const auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
    const auto side = c10::cuda::getStreamFromPool(false, device_.index());
    {
      c10::cuda::CUDAStreamGuard guard(side);
      out.inputs = host.inputs.to(device_, /*non_blocking=*/streaming_.pin_memory);
      out.labels = host.labels.to(device_, /*non_blocking=*/streaming_.pin_memory);
    }
    at::cuda::CUDAEvent copied;
    copied.record(side);
    copied.block(compute);
    // The memory was allocated for the side stream but is used on the compute stream.
    c10::cuda::CUDACachingAllocator::recordStream(out.inputs.storage().data_ptr(), compute);
    c10::cuda::CUDACachingAllocator::recordStream(out.labels.storage().data_ptr(), compute);
    return out;
  }
#endif
  out.inputs = host.inputs.to(device_);
  out.labels = host.labels.to(device_);
  return out;
}

bool StreamingLoader::next(Batch& batch) {
  // Keep `prefetch` batches sent ahead: their copies overlap the caller's compute.
  while (next_to_send_ < batches_ &&
         static_cast<int64_t>(in_flight_.size()) < streaming_.prefetch + 1) {
    HostBatch host;
    if (streaming_.workers == 0) {
      host = gather(next_to_send_);
    } else {
      std::unique_lock<std::mutex> lock(mutex_);
      produced_.wait(lock, [&] { return worker_error_ || ready_.count(next_to_send_); });
      if (worker_error_) std::rethrow_exception(worker_error_);
      host = std::move(ready_.at(next_to_send_));
      ready_.erase(next_to_send_);
      next_to_take_ = next_to_send_ + 1;
    }
    consumed_.notify_all();
    in_flight_.push_back(to_device(host));
    ++next_to_send_;
  }
  if (in_flight_.empty()) return false;
  batch = std::move(in_flight_.front());
  in_flight_.pop_front();
  batch.inputs = to_model_input(batch.inputs);  // uint8 -> float on the device
  return true;
}

}  // namespace spritetorch::data
