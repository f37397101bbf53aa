// Adam and SGD over flat buffers.
//
// The stock LibTorch optimizers launch a dozen small kernels per parameter tensor every step. Here
// the parameters and their gradients are re-pointed into two contiguous buffers once, so zeroing
// the gradients is one fill and a step is a few whole-buffer operations (one fused loop on the
// CPU). The arithmetic is PyTorch's (torch.optim.Adam / AdamW / SGD, weight decay included); tests
// compare them.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/shard_pool.h"
#include "train/parameter_share.h"

namespace spritetorch::train {

struct OptimizerOptions {
  std::string kind = "adam";  // "adam", "adamw" or "sgd"
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double momentum = 0.0;                          // sgd
  // adam, sgd: L2 (wd * p added to the gradient); adamw: decoupled (p *= 1 - lr * wd first).
  double weight_decay = 0.0;
};

// PyTorch's default weight decay for an optimizer kind: 0.01 for adamw, 0 for the others.
double default_weight_decay(const std::string& kind);
// Throws Error for an unknown kind, a learning rate <= 0, a negative weight decay, or either beyond
// float's range (the update runs in float).
void check_optimizer_options(const OptimizerOptions& options);

class FlatOptimizer {
 public:
  // All parameters must share one dtype and device. Their data (and grads) become views into the
  // flat buffers; values are kept.
  FlatOptimizer(const std::vector<torch::Tensor>& parameters, OptimizerOptions options);

  void zero_grad() { grads_.zero_(); }
  // The learning rate of the next steps (train/lr_schedule.h sets it before each step). Once
  // step_on_device() has run, the value is also written into its device tensor (one fill kernel,
  // no sync), which a captured CUDA graph reads at replay.
  void set_lr(double lr);
  void step();
  // CPU: split step()'s Adam loop over these threads (the fused step's, train_step.h); null: one.
  void use_thread_pool(std::shared_ptr<ShardPool> pool) {
    pool_ = std::move(pool);
    ranges_.clear();
  }
  // CPU: shard t of step()'s loop updates shares[t] instead of an even t-th of the flat buffer:
  // the parameters whose gradients that thread of the fused step wrote (CpuMlpStep::update_shares),
  // so the update finds them in its own core's cache. A share split with the other thread cost
  // that thread 1.7x its update on a Zen 5 (docs/benchmarks.md). Needs the pool first, one list
  // per shard, parameters inside this optimizer's buffer, and every element in exactly one share;
  // otherwise false and the even split stays.
  bool use_thread_shares(const ParameterShares& shares);
  // The same update with nothing read from or decided on the host, for CUDA graph capture and for
  // fp16 loss scaling without a per-step synchronisation (precision/grad_scaler.h): the step count
  // lives on the device and the bias corrections are computed there. found_inf: (1) or () float on
  // the buffers' device, or undefined; where it is nonzero the step changes nothing (parameters,
  // moments and step count stay as they were, inf/NaN in the gradients never reach the moments).
  // Several small kernels where step() has one loop on the CPU: use step() when neither applies.
  // Adam and AdamW on CUDA with a LibTorch that has PyTorch's fused Adam kernel (2.2 on): that one
  // kernel instead (should it refuse the buffers, a note on stderr and the tensor ops).
  void step_on_device(const torch::Tensor& found_inf = {});
  // Whether step_on_device() has run PyTorch's fused Adam kernel (false before its first call).
  bool fused_kernel() const { return fused_adam_.has_value(); }

  torch::Tensor& values() { return values_; }  // (P) all parameters, in registration order
  torch::Tensor& grads() { return grads_; }    // (P) their gradients
  int64_t steps_taken() const;
  const OptimizerOptions& options() const { return options_; }

  // For checkpoints: named state tensors (on the CPU when saved), and back.
  std::map<std::string, torch::Tensor> state() const;
  void load_state(const std::map<std::string, torch::Tensor>& state);

 private:
  // The CPU update over all elements: update(begin, end) on each of the pool's threads over its
  // share (or once over all of them without a pool).
  void over_threads(const std::function<void(int64_t begin, int64_t end)>& update) const;
  // use_thread_shares' plan as ranges of the flat buffer, per shard; empty: the even split.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges_;
  void adam_step();
  void sgd_step();

  OptimizerOptions options_;
  torch::Tensor values_, grads_;        // (P)
  torch::Tensor exp_avg_, exp_avg_sq_;  // (P) adam moments; exp_avg_ doubles as sgd momentum
  int64_t steps_ = 0;
  std::shared_ptr<ShardPool> pool_;
  torch::Tensor
      step_t_;  // () float32 on device once step_on_device() ran; then it counts, not steps_
  torch::Tensor lr_t_;  // () float32 on device once step_on_device() ran: options_.lr there
  std::optional<c10::OperatorHandle> fused_adam_;  // set by step_on_device()'s first call
  // With fused_adam_: its lists (views of values_, grads_, exp_avg_, exp_avg_sq_; step_t_ per view)
  std::vector<std::vector<torch::Tensor>> fused_lists_;
};

const std::vector<std::string>& optimizer_names();

// What step_on_device() gives PyTorch's fused Adam kernel for each flat (P) buffer: up to 36
// consecutive views of near-equal size (the last may be shorter) that together are the whole
// buffer, so the kernel spreads the update over more thread blocks than one tensor gets.
std::vector<torch::Tensor> fused_adam_views(const torch::Tensor& flat);

}  // namespace spritetorch::train
