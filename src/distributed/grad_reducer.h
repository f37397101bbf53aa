// Bucketed, overlapped gradient all-reduce: what DistributedDataParallel's reducer does, on the
// flat gradient buffer of train::FlatOptimizer.
//
// The flat buffer holds every gradient in parameter registration order, so a bucket is one slice
// of it: all-reduced in place, no copy in or out. Buckets are cut walking the parameters from the
// last to the first (backward produces gradients roughly in that order), about `bucket_mb` each.
// With overlap on, a bucket's asynchronous all-reduce starts as soon as all its gradients are
// ready, while backward still computes the earlier layers:
//  - autograd steps: a post-hook on each parameter's AccumulateGrad node (it runs after the
//    gradient was added to .grad; LibTorch 1.13 and 2.x both have it);
//  - the fused MLP step: it reports each layer's finished gradients (TrainStep::on_grad_ready).
// Buckets are launched strictly in bucket order on every rank (c10d matches collectives by
// sequence), so a bucket that is ready early waits for the ones before it. finish() launches what
// is left (parameters that got no gradient, or everything when overlap is off), waits for all, and
// leaves the average over ranks in the buffer: each slice is divided by the world size first.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "distributed/communicator.h"

namespace spritetorch::distributed {

struct ReducerOptions {
  double bucket_mb = 25;  // bucket capacity in MiB of gradient
  bool overlap = true;    // false: one pass over all buckets after backward (--no-overlap)
};

struct Bucket {
  int64_t offset = 0, numel = 0;          // slice of the flat gradient buffer
  size_t first_param = 0, end_param = 0;  // parameters [first, end) in registration order
};

class GradReducer {
 public:
  // parameters: in registration order; their .grad must be consecutive views of flat_grads
  // (FlatOptimizer arranges that) — checked here.
  GradReducer(std::shared_ptr<Communicator> comm, std::vector<torch::Tensor> parameters,
              torch::Tensor flat_grads, ReducerOptions options);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // With overlap on: hooks every parameter's AccumulateGrad node (autograd steps).
  void install_autograd_hooks();
  // `parameter`'s gradient for this step is complete (called by hooks and by the fused step).
  // Unknown tensors are ignored; a second call in one step is ignored.
  void mark_ready(const torch::Tensor& parameter);
  // Launches every bucket not yet launched, waits for all, leaves averaged gradients. Throws
  // spritetorch::Error when a collective fails or times out.
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  bool overlap() const { return options_.overlap; }
  // Buckets launched from hooks (during backward) in the last step; for tests and the settings.
  int64_t launched_early() const { return last_launched_early_; }

 private:
  void mark_ready_index(size_t index);
  void launch_ready_buckets();  // under mutex_

  std::shared_ptr<Communicator> comm_;
  std::vector<torch::Tensor> parameters_;
  torch::Tensor flat_grads_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_param_;
  std::unordered_map<const void*, size_t> index_of_;  // TensorImpl* -> parameter index

  // Per step, guarded by mutex_ (autograd may run hooks on a device thread).
  std::mutex mutex_;
  std::vector<bool> param_ready_;
  std::vector<int64_t> pending_in_bucket_;  // gradients still missing per bucket
  size_t next_launch_ = 0;                  // buckets [0, next_launch_) are launched
  std::vector<std::unique_ptr<PendingOp>> in_flight_;
  int64_t launched_early_ = 0, last_launched_early_ = 0;

  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

}  // namespace spritetorch::distributed
