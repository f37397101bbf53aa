// --cuda-graphs: the whole training step (zero_grad, forward, loss, backward, unscale, clip,
// optimizer step, scaler update) captured once as a CUDA graph on static buffers and replayed for
// every batch, so a step costs one graph launch instead of a few hundred kernel launches.
//
// Lifecycle: the first kWarmupSteps batches run eagerly on a side stream (cuBLAS/cuDNN workspaces,
// the autograd engine's streams and the optimizer's device step counter get created outside the
// capture), the next batch is captured on that side stream and then replayed, every later batch is
// copied into the static input buffers and replayed.
//
// Restrictions, checked by check_cuda_graphs() with a clear error: a CUDA device (the CPU and MPS
// have no graphs), the resident data path (fixed shapes, batches already on the device), full
// batches only: the trainer drops the last partial batch of each epoch (padding it would need a
// masked loss in every step; one dropped batch per epoch costs < 0.2 % of Fashion-MNIST).
// The optimizer runs with FlatOptimizer::step_on_device (no host scalars baked into the graph) and
// autocast without its weight-cast cache.
//
// CUDA-only code: in a CPU-only build the class exists but its constructor throws.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "data/loader.h"
#include "precision/grad_scaler.h"
#include "train/flat_optimizer.h"
#include "train/train_step.h"

namespace spritetorch::train {

// Throws spritetorch::Error explaining why graphs cannot be used: device not CUDA, a LibTorch
// without CUDA, or a data path other than "resident".
void check_cuda_graphs(const torch::Device& device, const std::string& data_path);

class CudaGraphStep {
 public:
  static constexpr int kWarmupSteps = 3;

  // step, optimizer and scaler (may be null) must outlive this object. batch_size: every batch
  // passed to run() must have exactly this many samples.
  CudaGraphStep(TrainStep& step, FlatOptimizer& optimizer, precision::GradScaler* scaler,
                double clip_grad_norm, int64_t batch_size, torch::Device device);
  ~CudaGraphStep();

  // One whole training step for `batch`; adds its loss sum and correct count to the accumulators
  // (() float32 / () int64 on the device).
  void run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct);
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spritetorch::train
