// One training step's forward and backward: the gradients land in the model's .grad tensors (the
// flat optimizer's buffer) and the batch's loss sum and correct count are added to on-device
// accumulators. The optimizer step is the caller's.
//
// Two implementations with the same results (tests compare them):
//  - AutogradStep: a task's loss (train/task.h), backward. Any model, any task; under autocast and
//    with loss scaling when the run's precision asks for them.
//  - FusedMlpStep: for ReLU MLPs (ann, simplenn), forward and backward written out as a dozen
//    whole-batch kernels into buffers allocated once: no autograd graph, no allocation per step.
//    At the seed's batch of 64 the autograd bookkeeping costs as much as the matrix work. Any
//    device; on the CPU in float32, make_train_step picks its raw-buffer, multi-threaded twin
//    CpuMlpStep (cpu_mlp_step.h) instead.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "common/shard_pool.h"
#include "data/loader.h"
#include "models/classifier.h"
#include "precision/precision.h"
#include "train/config.h"
#include "train/parameter_share.h"

namespace spritetorch::precision {
class GradScaler;
}

namespace spritetorch::train {

// The loss of one batch, as a task computes it (train/task.h).
struct StepLoss {
  torch::Tensor loss;     // () mean over the batch, float32, attached to the autograd graph
  torch::Tensor correct;  // () int64 correct predictions in the batch; undefined when none
};
using LossFn = std::function<StepLoss(const data::Batch& batch)>;

// How a step computes: the resolved precision plan, the loss scaler, the memory format.
struct StepPrecision {
  precision::PrecisionPlan plan;                  // resolved (precision/precision.h)
  const precision::GradScaler* scaler = nullptr;  // set when plan.grad_scaling
  bool channels_last = false;                     // feed 4-D batches as channels_last
  bool autocast_cache = true;                     // false under CUDA graph capture
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;
  // loss_sum: () float32 and correct: () int64, both on the batch's device.
  virtual void run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) = 0;
  virtual const char* name() const = 0;
  // True when run() writes the gradients rather than adding to them (no zero_grad needed).
  virtual bool overwrites_grads() const = 0;
  // Threads the step splits its own work over (CPU); BLAS should then run one thread each.
  virtual int threads() const { return 1; }
  // Those threads, for the optimizer's step to use as well (null when the step has none).
  virtual std::shared_ptr<ShardPool> thread_pool() const { return nullptr; }
  // For the optimizer's step on those threads: what each one should update (the parameters whose
  // gradients it wrote; FlatOptimizer::use_thread_shares). Empty: no preference.
  virtual ParameterShares update_shares() const { return {}; }
  // Whether run() reads data::Batch::thread_inputs (a copy of the inputs per pool thread), so the
  // loader should make them.
  virtual bool reads_thread_inputs() const { return false; }
  // The matrix kernel of a step that runs its own (gemm::kernel_name), else null.
  virtual const char* kernel() const { return nullptr; }
  // Each batch in up to `count` chunks (TrainConfig::micro_batches). False for a step that cannot
  // split its batches (the fused MLP step: its buffers and kernels take the whole batch).
  virtual bool set_micro_batches(int64_t count) { return count == 1; }
  virtual int64_t micro_batches() const { return 1; }

  // Called with each parameter whose gradient run() has finished writing, during the backward
  // pass, so a distributed gradient reducer can start its all-reduce early. The fused step calls
  // it layer by layer; autograd steps leave it to autograd hooks (distributed/grad_reducer.h).
  using GradReadyFn = std::function<void(const torch::Tensor& parameter)>;
  void on_grad_ready(GradReadyFn fn) { grad_ready_ = std::move(fn); }

 protected:
  GradReadyFn grad_ready_;
};

// loss(batch) under AutocastGuard (precision.plan) when autocast is on, then backward outside it,
// on the scaled loss when a scaler is set. Weights and gradients stay fp32: autocast casts copies
// of the weights for the matmuls, and autograd casts their gradients back to fp32.
class AutogradStep : public TrainStep {
 public:
  // needs_correct: the task reports an accuracy (TaskTraits::has_accuracy), so each step must
  // count its correct predictions; without a count the run would report 0 as if measured.
  explicit AutogradStep(LossFn loss, StepPrecision precision = {}, bool needs_correct = false);
  void run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) override;
  const char* name() const override { return "autograd"; }
  bool overwrites_grads() const override { return false; }
  // Chunks of ceil(B / count) samples (the last smaller); each chunk's mean loss is weighted by
  // its share of the batch before its backward, so the gradients add up to the batch's mean.
  bool set_micro_batches(int64_t count) override;
  int64_t micro_batches() const override { return micro_batches_; }

 private:
  // Forward and backward of one chunk; `weight`: its share of the batch.
  void run_chunk(const data::Batch& chunk, double weight, torch::Tensor& loss_sum,
                 torch::Tensor& correct);
  LossFn loss_;
  StepPrecision precision_;
  bool needs_correct_;
  int64_t micro_batches_ = 1;
};

// A classifier's loss: cross-entropy of forward(inputs) against the labels, computed in fp32
// outside autocast (LibTorch 1.13's CPU autocast would run log_softmax in bf16), and the correct
// count. forward: (B, ...) float32 -> (B, K) logits.
using ForwardFn = std::function<torch::Tensor(const torch::Tensor& inputs)>;
// label_smoothing: the targets put 1 - s on the label and s / K on every class (PyTorch's).
LossFn classifier_loss(ForwardFn forward, double label_smoothing = 0);
LossFn classifier_loss(const models::Classifier& model, double label_smoothing = 0);

class FusedMlpStep : public TrainStep {
 public:
  // layers: the model's Linear layers in order, ReLU between them
  // (ClassifierImpl::relu_mlp_layers). Their parameters must have gradients defined (the flat
  // optimizer does that).
  FusedMlpStep(std::vector<torch::nn::Linear> layers, int64_t max_batch);
  void run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) override;
  const char* name() const override { return "fused-mlp"; }
  bool overwrites_grads() const override { return true; }

 private:
  std::vector<torch::nn::Linear> layers_;
  std::vector<torch::Tensor> z_;   // per layer: (max_batch, out) pre-activations, ReLU'd in place
  std::vector<torch::Tensor> dz_;  // per layer: (max_batch, out) gradient w.r.t. z
  torch::Tensor log_probs_;        // (max_batch, K)
  torch::Tensor minus_ones_;       // (max_batch, 1) of -1, for subtracting one-hot labels
  torch::Tensor loss_, correct_;   // () this step's loss sum and correct count
  int64_t max_batch_;
};

// kind: auto (fused when the model is a ReLU MLP, else autograd), autograd or fused (an error for
// models that are not ReLU MLPs). cpu_threads: threads the fused step may split
// each step over on the CPU (CpuMlpStep); ignored elsewhere.
std::unique_ptr<TrainStep> make_train_step(const models::Classifier& model, int64_t max_batch,
                                           StepKind kind, int cpu_threads = 1);

}  // namespace spritetorch::train
