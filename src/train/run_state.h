// Mid-run state of a training run, so that a resumed run continues exactly where one stopped.
//
// Bit-identical resume (CPU, fixed seed) needs, beyond weights and optimizer state: the epoch and
// the step within it (the data order is a pure function of (seed, epoch): data::epoch_order), the
// running metric sums, and the global RNG state (dropout draws from it). A checkpoint carries them
// as meta["run"] plus "run.*" tensors; a checkpoint without them resumes at an epoch boundary.
//
// Periodic checkpoints (--checkpoint-every N, and the one an interrupt writes) sit beside the final
// one: for --save runs/cnn.pt they are runs/cnn.step<global step>.pt. They belong to the run: it
// replaces them freely when it resumes and --keep-last K deletes all but the newest K.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "models/classifier.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace spritetorch::train {

struct RunState {
  int64_t epoch = 0;             // 0-based epoch in progress
  int64_t step = 0;              // steps done within it (0..batches per epoch)
  int64_t samples = 0;           // samples seen in this epoch
  int64_t interval_samples = 0;  // samples since the last log
  torch::Tensor loss_sum;        // () float32: summed loss of the epoch's logged intervals
  torch::Tensor correct;         // () int64: correct predictions in this epoch
  torch::Tensor interval_loss;   // () float32: summed loss since the last log
  torch::Tensor cpu_rng;         // uint8: the default CPU generator's state
  torch::Tensor cuda_rng;        // uint8: the current CUDA device's generator state, or undefined
  // The run's training time so far, its earlier processes' included: a resumed run's clock starts
  // from it. 0 in checkpoints written before it was kept.
  double train_seconds = 0;
};

// Captures the global RNG states into `state` (the metric fields are the caller's).
void capture_rng(RunState& state, torch::Device device);
// Restores them; throws DataError naming `source` when a state does not fit this build.
void restore_rng(const RunState& state, torch::Device device, const std::string& source);

// Every default generator of the process (the CPU's, each CUDA device's): a run seeds them with
// --seed, and Trainer::fit puts the caller's back after, so the caller's random stream goes on as
// if no run had drawn from it.
struct ProcessRng {
  torch::Tensor cpu;
  std::vector<torch::Tensor> cuda;  // one per device; empty on the CPU build
};
ProcessRng save_process_rng();
void restore_process_rng(const ProcessRng& saved);

// Stores `state` in the checkpoint (meta["run"] and the "run.*" tensors, copied to the CPU).
void store_run_state(const RunState& state, Checkpoint& checkpoint);
// The run state a checkpoint carries, with tensors on `device`; nullopt for an epoch-boundary
// checkpoint. Throws DataError naming `source` when it is malformed.
std::optional<RunState> load_run_state(const Checkpoint& checkpoint, torch::Device device,
                                       const std::string& source);

// "runs/cnn.pt" -> "runs/cnn.step1200.pt".
std::string periodic_checkpoint_path(const std::string& base, int64_t global_step);
// `path`, or where a file is there already "<stem>-2<ext>", "-3", ...: the checkpoint of a stopped
// run that writes no periodic ones (check_run_outputs let it start beside another run's).
std::string unused_checkpoint_path(const std::string& path);
// The periodic checkpoints of `base` that exist, oldest (lowest step) first.
std::vector<std::string> periodic_checkpoints(const std::string& base);
// Deletes all but the newest `keep` periodic checkpoints of `base` up to `written_step`, the one
// just written (keep <= 0: keeps all), and but `known_good` (the newest whose weights were seen to
// train on, when that is older); later steps' files are another run's and are left alone.
void prune_periodic_checkpoints(const std::string& base, int64_t keep, int64_t written_step,
                                const std::string& known_good = "");
// Removes the temporaries of `base`'s periodic checkpoints that writers killed mid-save left (a
// SIGKILL or power loss during a save): each step's name is written once, so no later save of the
// same name would remove them. Returns how many.
int remove_dead_periodic_temporaries(const std::string& base);

// The model a checkpoint describes, bounded before it is built, so that a hostile file cannot size
// our allocations: 1 to 3 input dimensions of 1..65536, 2..65536 classes, and no more input values
// per sample or classes than the file holds weights (`file_values`: every model's first and last
// layers have at least that many). Throws DataError naming `source`.
void check_model_spec(const models::ModelSpec& spec, int64_t file_values,
                      const std::string& source);

// The path periodic and interrupt checkpoints are named after: --save, else ./spritetorch-run.pt.
std::string run_checkpoint_base(const TrainConfig& config);
// The overwrite rule, checked before any work: --save must not exist unless --overwrite or the run
// resumes in place (--resume is --save or one of its periodic checkpoints); a fresh run (no
// --resume) must not find periodic checkpoints of another run at its base unless --overwrite.
void check_run_outputs(const TrainConfig& config, const std::string& base);
// A resumed run trains the checkpoint's task on the checkpoint's data: the task named in its
// metadata (a generator is resumed by --task generate), the same kind of dataset, and for sprite
// sets the same split and preparation (--holdout, --data-seed, --size, ...): another split would
// put sprites the model trained on into its test split. `task` is the run's task name. Throws
// Error naming the checkpoint and the options to pass; checkpoints without the fields pass.
void check_resumed_data(const TrainConfig& config, const std::string& task,
                        const Checkpoint& checkpoint);
// A resumed classifier's output units keep their meaning: the data's class names must be those
// the checkpoint was trained on (a folder of other classes, in the same number, would relabel
// them silently). Checkpoints or data without names pass.
void check_resumed_classes(const TrainConfig& config, const Checkpoint& checkpoint,
                           const std::vector<std::string>& class_names);
// A mid-epoch resume must see the same batches: same --batch-size, --seed, --drop-last,
// --class-sampling and training set size (`train_samples`: --train-limit), and the same number of
// ddp ranks (`world_size`) with the same kind of data shards (`local_shards`): a step consumes
// world_size x batch samples, so another world size would skip another number of them. Checkpoints
// without a field pass it.
void check_mid_run_resume(const TrainConfig& config, const Checkpoint& checkpoint,
                          const RunState& state, int64_t train_samples, int world_size = 1,
                          bool local_shards = false);
// The error for a CUDA out-of-memory in step `step` (0-based) of epoch `epoch` (0-based), after
// `save` has tried to write the run state (it returns the checkpoint's path).
Error out_of_memory(const std::exception& oom, const TrainConfig& config, int64_t epoch,
                    int64_t step, const std::function<std::string()>& save);

}  // namespace spritetorch::train
