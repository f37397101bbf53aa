// The Trainer: one epoch loop for every task (train/task.h) — device, data path, precision,
// strategy, CUDA graphs, optimizer and schedule, clipping, resume, interrupts, periodic
// checkpoints, divergence and out-of-memory handling — composed once. The library prints nothing:
// progress reaches the caller through a TrainObserver.
//
//   train::TrainConfig options;                 // epochs, batch size, precision, save, resume, ...
//   train::ClassifierTask task(MyNet(), "mynet");
//   train::TrainReport report = train::Trainer(options).fit(task, {train_set, test_set});
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "device/device.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluator.h"
#include "train/task.h"
#include "train/thread_governor.h"
#include "train/time_budget.h"

namespace spritetorch::train {

struct StepLog {
  int64_t epoch = 0, step = 0, steps = 0;  // 1-based epoch and step within it
  double running_loss = 0;                 // mean loss since the last log
  double lr = 0;                           // the learning rate of the interval's last step
  int64_t global_step = 0;  // optimizer steps since the run's first epoch (resumed ones included)
};

// After every step: host-side counters only (reading them costs no device sync).
struct StepTick {
  int64_t epoch = 0, epochs = 0;  // 1-based epoch, epochs in the run
  int64_t step = 0, steps = 0;    // steps done in this epoch, steps per epoch
  int64_t samples = 0;            // samples done in this epoch (this rank)
  // Optimizer steps since the run's first epoch (resumed ones included): TrainReport::steps at
  // the end, whatever --batch-size the epochs before a resume had.
  int64_t global_step = 0;
};

struct EpochReport {
  int64_t epoch = 0, epochs = 0;  // 1-based
  double loss = 0;                // mean training loss over the epoch's samples
  double accuracy = 0;            // training accuracy over the epoch (model in train mode)
  bool has_accuracy = true;       // false for tasks with no classes to be right about
  double seconds = 0;             // the epoch's training only (its test evaluation is not in it)
  // The samples this process trained over `seconds`: a resumed epoch's restored ones are not.
  double images_per_second = 0;
  int64_t samples = 0;      // the epoch's, a resumed one's before the checkpoint included
  int64_t global_step = 0;  // optimizer steps since the run's first epoch, at the epoch's end
  // The test set after this epoch (--eval-every; always after the last epoch). Rank 0 only.
  bool has_test = false;
  double test_loss = 0, test_accuracy = 0;
};

// Up to kMisclassifiedKept test samples the final model gets wrong, in test-set order.
struct Misclassified {
  torch::Tensor inputs;     // (M, ...) the samples as stored (uint8 images), on the CPU
  torch::Tensor labels;     // (M) int64 true classes
  torch::Tensor predicted;  // (M) int64 predicted classes
  int64_t total = 0;        // misclassified samples in the whole test set
};
constexpr int64_t kMisclassifiedKept = 36;

// One test evaluation during training (--eval-every, --eval-every-steps, --target-accuracy).
struct EvalPoint {
  int64_t step = 0;          // optimizer steps since the run's first epoch
  double epoch = 0;          // epochs done, fractional (2.5: half-way through the third)
  double train_seconds = 0;  // the run's training time so far (resumed: in all), no evaluation
  double loss = 0, accuracy = 0;
  bool has_accuracy = true;  // false for tasks with no classes to be right about
};

struct TrainReport {
  std::string task;    // Task::name(): "classify", "generate", ...
  std::string device;  // display name, e.g. "cpu (AMD EPYC 7B13)"
  Settings settings;
  bool has_accuracy = true;  // the task's traits
  int64_t start_epoch = 0;   // epochs already done by a resumed checkpoint
  std::vector<EpochReport> epochs;
  // The epoch loop, device-synchronised, without its evaluations, plus what build() learned from
  // the data (Task::setup_train_seconds: the whitened first convolution's filters). The whole
  // run's: a resumed run's includes the training time its checkpoint records.
  double train_seconds = 0;
  double eval_seconds = 0;    // the per-epoch test evaluations (--eval-every)
  double sample_seconds = 0;  // the task's end-of-epoch work (a generator's sample sheets)
  int64_t steps = 0;          // optimizer steps since the run's first epoch (resumed ones included)
  // The run's peak memory at the end of its epochs (device::peak_memory: tensors allocated on
  // CUDA since the run started, the process's peak RSS on the CPU); bytes -1 where unknown.
  device::PeakMemory peak_memory;
  // On the CPU: the thread governor's changes (train/thread_governor.h); empty when the threads
  // stayed as set.
  std::vector<ThreadChange> thread_changes;
  std::vector<EvalPoint> evals;  // every test evaluation during training, in order; rank 0 only
  // --target-accuracy: the first evaluation that reached it (absent: not reached). With
  // stop_at_target the run ended there.
  std::optional<EvalPoint> target_reached;
  bool stopped_at_target = false;
  // --time-budget: the epochs planned (absent without a budget, or when the whole run was too
  // short to time: it then trained its --epochs).
  std::optional<BudgetPlan> budget;
  bool has_test = false;  // the test set was evaluated (it is not empty); rank 0 only
  EvalReport test;
  Misclassified misclassified;  // from the final evaluation (no extra pass), classifiers only
  std::vector<std::string> class_names;
  bool main_rank = true;  // false on ranks other than 0 of a ddp run: no test report, no checkpoint
};

// {"bytes", "what"}: a run's peak memory as `train --json` and summary.json write it.
nlohmann::json peak_memory_json(const device::PeakMemory& peak);
// [{"step", "from", "threads", "others_cpus"}, ...]: the thread changes as `train --json` and
// summary.json write them.
nlohmann::json thread_changes_json(const std::vector<ThreadChange>& changes);

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const std::string& /*device*/, const Settings& /*settings*/) {}
  // Every step, from the training loop: must stay cheap (counters only, no device reads).
  virtual void on_step(const StepTick& /*tick*/) {}
  virtual void on_log(const StepLog& /*log*/) {}
  virtual void on_epoch(const EpochReport& /*report*/) {}
  // A test evaluation within an epoch (--eval-every-steps, --target-accuracy), rank 0 only, `at`
  // the step it followed. One at an epoch's end is in that epoch's EpochReport instead; a run that
  // stops within an epoch reports its last evaluation in both.
  virtual void on_eval(const EvalPoint& /*point*/, const StepTick& /*at*/) {}
  // --time-budget: once, when the run's epochs are planned (StepTick and EpochReport carry the
  // planned number from then on).
  virtual void on_plan(const BudgetPlan& /*plan*/) {}
  // Generators (sample_every): sprites (N, 4, S, S) uint8 on the CPU, drawn with the EMA weights
  // after `epoch` (1-based), `per_class` consecutive sprites per class.
  virtual void on_samples(int64_t /*epoch*/, const torch::Tensor& /*sprites*/,
                          int64_t /*per_class*/) {}
};

struct Datasets {
  data::Dataset train, test;  // test may be empty: then no evaluation
  // What the data is, as checkpoints record it and --resume / eval compare it: the --dataset spec
  // load_datasets read, or a name of the caller's. Empty: kInMemoryDataset.
  std::string source = {};  // (a default, so that {train, test} stays warning-free)
};

// The parameters the optimizer trains: those with requires_grad (a frozen layer stays as it is,
// weight decay included). Throws Error when a module with parameters has none of them trainable.
std::vector<torch::Tensor> trainable_parameters(torch::nn::Module& module);
// The config's dataset, with train_limit / test_limit applied. Fashion-MNIST's .gz files go
// through the dataset cache the environment asks for (data::IdxCache::from_environment).
Datasets load_datasets(const TrainConfig& config);
// Its test split alone, with test_limit applied: what eval of a classifier reads. Fashion-MNIST's
// training files are neither needed nor read (a folder of the two t10k files evaluates); a sprite
// dataset is read whole, as its held-out split is drawn from all of it. The class names are the
// dataset's, as training recorded them.
data::Dataset load_test_dataset(const TrainConfig& config);

class Trainer {
 public:
  // The options of every run this trainer fits (the task-specific ones, task, model, unet_base and
  // activation_checkpointing, are the task's: see tasks/make_task.h). Options a task cannot honour
  // are refused by fit().
  explicit Trainer(TrainConfig options);
  // Trains `task` on data.train and evaluates it on data.test. Throws spritetorch::Error for an
  // impossible request (before any work), DataError for bad input (labels that do not match the
  // samples or the class names, a test set of another shape or other classes), Interrupted after
  // a SIGINT / SIGTERM checkpoint. Runs with gradients on whatever guard the caller holds; after
  // it the module's parameters hold gradients of their own (not views of the run's buffers).
  TrainReport fit(Task& task, const Datasets& data, TrainObserver* observer = nullptr);
  const TrainConfig& options() const { return options_; }

 private:
  TrainConfig options_;
};

}  // namespace spritetorch::train
