// Mixed precision in the training loop: the autocast training step, the ordered optimizer update
// (unscale -> clip -> step unless inf/NaN -> rescale) and the channels_last conversion for CNNs.
// train_step.h's steps stay the fp32 path; make_precision_train_step picks between them.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "precision/autocast_guard.h"
#include "precision/grad_scaler.h"
#include "precision/precision.h"
#include "train/flat_optimizer.h"
#include "train/train_step.h"

namespace spritetorch::train {

// fp32 without loss scaling or channels_last: make_train_step(model, max_batch, kind) unchanged.
// Otherwise, for a ReLU MLP in bf16 on a CPU with AVX512_BF16 (bf16::available), the fused CPU
// step with layer 1 in bf16 (CpuMlpStep, MlpCompute::bf16) unless kind is "autograd"; else
// AutogradStep over the classifier's loss with `precision`, and kind "fused" is an error (at the
// seed's sizes autocast's per-op casts cost more than the bf16 matmuls save: docs/precision.md).
std::unique_ptr<TrainStep> make_precision_train_step(const models::Classifier& model,
                                                     int64_t max_batch, StepKind kind,
                                                     const StepPrecision& precision,
                                                     int cpu_threads = 1);

// The update after backward, in the only correct order:
//   unscale the gradients (scaler) -> clip their norm (clip_grad_norm > 0) -> optimizer step,
//   skipped when the scaler found inf/NaN -> let the scaler back off or grow.
// on_device: decide the skip on the device (FlatOptimizer::step_on_device, no host read; needed for
// CUDA graphs and avoids a sync per step on CUDA). Otherwise the scaler's found_inf is read once
// (free on the CPU, where nothing is asynchronous) and the fast FlatOptimizer::step() runs.
void finish_step(FlatOptimizer& optimizer, precision::GradScaler* scaler, double clip_grad_norm,
                 bool on_device);

// Converts the model's 4-D parameters (conv weights) to channels_last in place. Call before
// building the FlatOptimizer (it keeps their strides).
void apply_channels_last(torch::nn::Module& model);
// The other way: 4-D parameters back to NCHW (a module of the user's own, given back as it came).
void apply_contiguous(torch::nn::Module& model);

}  // namespace spritetorch::train
