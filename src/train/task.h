// What a training task supplies to the Trainer (train/trainer.h), in the spirit of PyTorch
// Lightning's LightningModule: its module, the loss of one batch, its evaluation, what it keeps in
// a checkpoint, and a few optional hooks. The Trainer owns everything else, once: device, data
// path, precision (autocast + gradient scaling), strategy (single / dp / ddp), CUDA graphs,
// optimizer and schedule, gradient clipping, resume, interrupts, periodic checkpoints, divergence
// and out-of-memory handling, observers.
//
// Built-in tasks: train::ClassifierTask (train/classifier_task.h: any module that maps inputs to
// logits, ours or the user's) and diffusion::GeneratorTask (diffusion/generator_task.h).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluator.h"
#include "train/train_step.h"

namespace spritetorch::train {

class TrainObserver;
using Settings = std::vector<std::pair<std::string, std::string>>;

// What the Trainer may do with a task; each "false" turns the matching option into a clear error.
struct TaskTraits {
  bool has_accuracy = true;    // training_step fills `correct`, evaluate() an accuracy
  bool cuda_graphs = true;     // the step is a fixed sequence of kernels (no host-side work)
  bool data_parallel = false;  // use_data_parallel() is implemented (--strategy dp)
  bool drop_last = false;      // every batch full (always, whatever --drop-last says)
  // One of spritetorch's own models: it runs on channels_last tensors, and a LibTorch error in
  // its step is a bug of ours (exit 1). A module of the user's own is tried in that layout on two
  // samples first (a .view() of a convolution's output fails there), and an error in its step is
  // the user's to mend: an Error naming the epoch, the step and the batch.
  bool builtin_model = false;
  std::string no_cuda_graphs;  // why not, when cuda_graphs is false
};

// What build() gets: the training data and, when resuming, the checkpoint (already CRC-checked).
struct TaskSetup {
  const data::Dataset& train;
  const Checkpoint* resumed = nullptr;  // --resume, else null
  std::string resume_source;            // its path, for errors
  uint64_t seed = 0;
  // Where the run trains: work build() does on the data runs there (the module stays on the CPU).
  torch::Device device = torch::kCPU;
};

// What fast_step() gets to build a step of its own.
struct FastStepSetup {
  int64_t max_batch = 0;
  StepKind kind = StepKind::kAuto;  // --step
  const StepPrecision& precision;
  int cpu_threads = 1;
};

// An option of the other task, refused: "OPTION does not apply to --task TASK: WHY", hint "drop"
// its flag (OPTION may carry a value: "--model fastcnn").
Error not_for_task(const std::string& option, const std::string& task, const std::string& why);

class Task {
 public:
  virtual ~Task() = default;
  // "classify", "generate", or the user's own name: settings, checkpoints and run folders say it.
  virtual std::string name() const = 0;
  virtual TaskTraits traits() const { return {}; }

  // Makes (or adopts) the module for this data, on the CPU; the global seed is already set, so
  // its initial weights are reproducible. The Trainer then moves it to the device once.
  // The run's options, before build(): a task takes the ones that are its own (ClassifierTask:
  // label_smoothing, test_time_augment) and refuses values it cannot honour. This default, for a
  // task of the user's own, refuses every option of the built-in tasks (model, label smoothing,
  // test-time augmentation, the whitened first convolution, activation checkpointing, the
  // generator's design and sample sheets) unless it has its default value: a task that takes one
  // overrides configure and reads it.
  virtual void configure(const TrainConfig& options);
  virtual void build(const TaskSetup& setup) = 0;
  // Seconds build() spent learning from the training data (ClassifierTask: the whitened first
  // convolution's filters), device-synchronised. The run's training time counts them, as a
  // time-to-accuracy run must: they are part of what it takes to reach the accuracy.
  virtual double setup_train_seconds() const { return 0; }
  virtual torch::nn::Module& module() = 0;
  // After the module moved to `device`: state of the task's own on that device (EMA copies, ...).
  virtual void to_device(torch::Device /*device*/) {}

  // The loss of one batch (inputs float32 on the device, already augmented), the module in train
  // mode. Runs under autocast when mixed precision is on: compute the loss itself in fp32 (cast
  // the outputs first), as PyTorch's AMP recipe does.
  virtual StepLoss training_step(const data::Batch& batch) = 0;
  // After every optimizer step (e.g. an exponential moving average of the weights).
  virtual void after_optimizer_step() {}
  // A step of the task's own (e.g. the fused MLP step), or null for the Trainer's autograd step
  // over training_step(). Errors when setup.kind asks for a step the task does not have.
  virtual std::unique_ptr<TrainStep> fast_step(const FastStepSetup& setup);
  // --strategy dp: run training_step's forward over `devices` (traits().data_parallel).
  virtual void use_data_parallel(const std::vector<torch::Device>& /*devices*/) {}

  // The test set (inference mode, the module in eval mode, restored after). keep_predictions:
  // the final evaluation, whose predictions feed the misclassified grid.
  virtual EvalReport evaluate(data::Loader& test, bool keep_predictions) = 0;
  // After each epoch, on the main rank only (e.g. a sheet of samples), outside the timed training.
  virtual void on_epoch_end(int64_t /*epoch*/, bool /*last*/, TrainObserver& /*observer*/) {}

  // Checkpoints. The Trainer has put the module's state, the optimizer's and the common metadata
  // (epoch, seed, optimizer, precision, ...) in `checkpoint`; the task adds its own.
  virtual void save(Checkpoint& /*checkpoint*/) const {}
  // Puts a checkpoint's weights into the module (and the task's own state); every name and shape
  // checked, errors name `source`. Called after build() and to_device().
  virtual void load(const Checkpoint& checkpoint, const std::string& source);
  // Rows for the settings table: at least "model".
  virtual Settings settings() const = 0;
};

}  // namespace spritetorch::train
