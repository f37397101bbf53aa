// CUDA graphs (on by default on CUDA, --cuda-graphs to insist, --no-cuda-graphs for eager): the
// whole training step (zero_grad, forward, loss, backward, unscale, clip, optimizer step, scaler
// update) captured once as a CUDA graph on static buffers and replayed for every batch, so a step
// costs one graph launch instead of a few hundred kernel launches.
//
// Lifecycle: the first kWarmupSteps batches run eagerly on a side stream (cuBLAS/cuDNN workspaces,
// the autograd engine's streams and the optimizer's device step counter get created outside the
// capture), the next batch is captured on that side stream and then replayed, every later batch is
// copied into the static input buffers and replayed. A batch of another size (an epoch's last,
// partial one) runs the same step eagerly: no sample is dropped and the arithmetic is the same.
//
// Nothing the host decides is baked into the graph: the optimizer runs FlatOptimizer::
// step_on_device, which reads the learning rate from a device tensor that set_lr() refills before
// each replay (every lr schedule works), and autocast runs without its weight-cast cache.
//
// Where graphs cannot run, cuda_graphs_unavailable() says why: not a CUDA device (the CPU and MPS
// have no graphs), a LibTorch without CUDA, a streaming data path (batches copied in per step).
// The trainer adds its own reasons (ddp's all-reduce, DataParallel, a task whose step draws on the
// host) and, under --cuda-graphs auto, trains eagerly and says so in the settings.
//
// CUDA-only code: in a CPU-only build the class exists but its constructor throws.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "common/error.h"
#include "data/loader.h"
#include "precision/grad_scaler.h"
#include "train/flat_optimizer.h"
#include "train/train_step.h"

namespace spritetorch::train {

// Why graphs cannot capture a step on `device` with this data path ("resident" or "streaming"),
// as an Error with a hint; nullopt when they can.
std::optional<Error> cuda_graphs_unavailable(const torch::Device& device,
                                             const std::string& data_path);
// Throws cuda_graphs_unavailable()'s Error, if any.
void check_cuda_graphs(const torch::Device& device, const std::string& data_path);

class CudaGraphStep {
 public:
  static constexpr int kWarmupSteps = 3;

  // step, optimizer and scaler (may be null) must outlive this object. batch_size: the size the
  // graph is captured for; batches of other sizes run eagerly.
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
