// Batches for the training loop, already on the training device.
//
// Both loaders visit every sample exactly once per epoch, in the order epoch_order() gives for
// (seed, epoch), so the same seed yields the same batches whichever loader serves them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/choice.h"
#include "common/shard_pool.h"
#include "data/dataset.h"

namespace spritetorch::data {

struct Batch {
  torch::Tensor inputs;  // (B, C, H, W) or (B, F) float32, on the loader's device
  torch::Tensor labels;  // (B) int64, on the loader's device
  // Optional, CPU only: one copy of `inputs` per step thread, each written by that thread, so a
  // step split by output units (train/cpu_mlp_step.h) reads its whole batch from its own core's
  // cache. thread_inputs[0] is `inputs` itself (the same storage); the copies hold the same values.
  // Empty unless the loader was asked for them (Loader::use_thread_pool). A step uses them only
  // while thread_inputs[0] is still `inputs`: replacing `inputs` (augmentation) retires them, and
  // code that changes `inputs` in place must clear them.
  std::vector<torch::Tensor> thread_inputs = {};
};

// out[j] = in[j] / 255 as float32 for j < n, the values to_model_input gives, with the CPU's
// widest vectors (AVX-512, AVX2 or a loop).
void uint8_to_unit_floats(const uint8_t* in, float* out, int64_t n);

// Steps in an epoch of `samples` samples: the last partial batch counts unless drop_last.
int64_t count_batches(int64_t samples, int64_t batch_size, bool drop_last);

// The sample order of one epoch: a permutation of 0..n-1 drawn from a generator seeded with
// (seed, epoch), or 0..n-1 when not shuffling. (n) int64 on the CPU.
torch::Tensor epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// How often each class comes up in a shuffled epoch. natural: every sample once, so classes as
// often as the dataset holds them. balanced: the epoch's N draws split equally over the classes
// present, each class's samples cycled in fresh random orders (a class of 30 among 954 samples
// and 13 classes comes up 73 times, its samples 2-3 times each; a class of 290 samples comes up
// 73 times too, without repeats). For generators asked for every class alike (docs/sprites.md).
enum class ClassSampling { kNatural, kBalanced };
const Choices<ClassSampling>& choices_of(ClassSampling);  // natural, balanced

// The balanced order of one epoch (see ClassSampling): labels (N) int64 on the CPU, classes any
// non-negative values; (N) int64 row indices on the CPU, a pure function of (labels, seed, epoch).
torch::Tensor balanced_epoch_order(const torch::Tensor& labels, uint64_t seed, int64_t epoch);

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;  // drop the last partial batch instead of serving it short
  uint64_t seed = 1;
  // Distributed training (data/distributed_sampler.h): this rank's share of each epoch's order.
  // drop_last also decides the tail: dropped when set, padded otherwise.
  int64_t shard_rank = 0, shard_count = 1;
  ClassSampling class_sampling = ClassSampling::kNatural;  // with shuffle only
};

// The rows one epoch visits, in order: epoch_order, balanced_epoch_order (labels (N) int64 on the
// CPU) or, without shuffling, undefined (0..N-1); not yet sharded.
torch::Tensor training_order(const LoaderOptions& options, const torch::Tensor& labels,
                             int64_t epoch);

class Loader {
 public:
  virtual ~Loader() = default;
  virtual int64_t batches_per_epoch() const = 0;
  virtual int64_t samples_per_epoch() const = 0;
  virtual void start_epoch(int64_t epoch) = 0;
  // Fills `batch` and returns true, or returns false at the end of the epoch.
  virtual bool next(Batch& batch) = 0;
  virtual torch::Device device() const = 0;
  // CPU: assemble each batch on these threads (the fused step's, which are idle meanwhile), and
  // with copy_per_thread give each thread its own copy of the inputs (Batch::thread_inputs).
  // Loaders that do their work elsewhere ignore it.
  virtual void use_thread_pool(std::shared_ptr<ShardPool> /*pool*/, bool /*copy_per_thread*/) {}
};

// "Prepare data on the GPU if possible": the whole dataset is uploaded once, as uint8, and each
// batch is gathered and converted on the device. No host work and no copy per step; one copy of
// the epoch's order (n int64) per epoch.
class ResidentLoader : public Loader {
 public:
  ResidentLoader(const Dataset& dataset, torch::Device device, LoaderOptions options);
  int64_t batches_per_epoch() const override;
  int64_t samples_per_epoch() const override;
  void start_epoch(int64_t epoch) override;
  bool next(Batch& batch) override;
  torch::Device device() const override { return device_; }
  void use_thread_pool(std::shared_ptr<ShardPool> pool, bool copy_per_thread) override {
    pool_ = std::move(pool);
    copy_per_thread_ = copy_per_thread;
  }

 private:
  int64_t epoch_size() const;  // samples this loader serves per epoch (this rank's shard)
  // CPU, uint8 inputs: rows[0..b) (or [start, start + b) when rows is null) as float32 / 255
  // into batch.inputs (and, with copy_per_thread_, every thread its own batch.thread_inputs[t]),
  // and a prefetch of next_rows[0..next_count), the next batch's. Written into the tensors the
  // batch held where that can be done unseen (see reusable), else into new ones.
  void gather_cpu_uint8(const int64_t* rows, int64_t start, int64_t b, const int64_t* next_rows,
                        int64_t next_count, Batch& batch);
  // (b) int64, into `reuse` where it can be.
  torch::Tensor gather_cpu_labels(const int64_t* rows, int64_t b, torch::Tensor reuse) const;
  // CPU, uint8 inputs: start fetching the dataset rows rows[begin..end).
  void prefetch_rows(const int64_t* rows, int64_t begin, int64_t end) const;
  torch::Tensor inputs_;       // the dataset's inputs, on device_
  torch::Tensor labels_;       // (N) int64, on device_
  torch::Tensor host_labels_;  // (N) int64 on the CPU, for balanced class sampling only
  torch::Tensor order_;        // (N) int64, on device_; undefined when not shuffling
  torch::Device device_;
  LoaderOptions options_;
  int64_t cursor_ = 0;
  std::shared_ptr<ShardPool> pool_;  // null: one thread
  bool copy_per_thread_ = false;
};

}  // namespace spritetorch::data
