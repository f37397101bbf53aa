// The streaming data path, for datasets that should not (or cannot) live on the device.
//
// Worker threads gather batches from the host copy of the dataset (in the epoch's order, the same
// order as ResidentLoader), into pinned host memory when the device is CUDA. The consumer sends
// each batch to the device as uint8 (4x fewer bytes than float) with a non-blocking copy on a side
// stream, keeping `prefetch` batches in flight, so the copy of batch k+1 overlaps the compute of
// batch k; the conversion to float happens on the device.
//
//   workers 0: batches are gathered in the caller's thread, in next().
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "data/loader.h"

namespace spritetorch::data {

// Threads one loader may start: beyond a machine's cores they only queue for them, and an unbounded
// count (a typo'd 99999) would start threads until the system refuses.
constexpr int kMaxWorkers = 256;

struct StreamingOptions {
  int workers = 2;          // 0..kMaxWorkers
  int prefetch = 2;         // device batches in flight ahead of the one being used (>= 1)
  bool pin_memory = false;  // pinned host buffers (only meaningful for CUDA)
};

class StreamingLoader : public Loader {
 public:
  StreamingLoader(const Dataset& dataset, torch::Device device, LoaderOptions options,
                  StreamingOptions streaming);
  ~StreamingLoader() override;
  StreamingLoader(const StreamingLoader&) = delete;
  StreamingLoader& operator=(const StreamingLoader&) = delete;

  int64_t batches_per_epoch() const override;
  int64_t samples_per_epoch() const override;
  void start_epoch(int64_t epoch) override;
  bool next(Batch& batch) override;
  torch::Device device() const override { return device_; }

 private:
  struct HostBatch {
    torch::Tensor inputs, labels;  // stored dtype (uint8 images / float features), int64; host
  };
  HostBatch gather(int64_t index) const;  // batch `index` of the current epoch, on the host
  Batch to_device(const HostBatch& host);
  void stop_workers();
  void worker_loop();

  torch::Tensor inputs_, labels_;  // host, contiguous
  torch::Device device_;
  LoaderOptions options_;
  StreamingOptions streaming_;
  torch::Tensor order_;  // (N) int64, host
  int64_t batches_ = 0;
  int64_t epoch_size_ = 0;  // samples per epoch: the dataset, or this rank's shard

  // Producer/consumer state. Workers claim batch indices in order but only up to `capacity`
  // ahead of the consumer, so memory stays bounded.
  std::mutex mutex_;
  std::condition_variable produced_, consumed_;
  std::map<int64_t, HostBatch> ready_;
  int64_t next_to_claim_ = 0, next_to_take_ = 0;
  bool stopping_ = false;
  std::exception_ptr worker_error_;
  std::vector<std::thread> threads_;

  std::deque<Batch> in_flight_;  // device batches already sent, oldest first
  int64_t next_to_send_ = 0;
};

}  // namespace spritetorch::data
