#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/notes.h"
#include "common/output_file.h"
#include "common/small_gemm.h"
#include "common/timer.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/dummy.h"
#include "data/sprite_sources.h"
#include "device/device.h"
#include "models/eval_mode.h"
#include "precision/grad_scaler.h"
#include "precision/precision.h"
#include "train/amp_step.h"
#include "train/cpu_mlp_step.h"
#include "train/cuda_graph_step.h"
#include "train/flat_optimizer.h"
#include "train/interrupt.h"
#include "train/model_state.h"
#include "train/optimization.h"
#include "train/parallel.h"
#include "train/run_state.h"
#include "train/time_budget.h"
#include "train/train_step.h"

namespace spritetorch::train {

namespace {

// A non-finite loss as "nan" or "inf": its sign depends on the order of the float operations that
// produced it, which says nothing to the user.
std::string loss_text(double loss) {
  if (std::isnan(loss)) return "nan";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "-inf";
  return std::to_string(loss);
}

// The first kMisclassifiedKept test samples whose prediction is wrong. predictions: (N) int64 on
// the CPU in test-set order (the test loader does not shuffle).
Misclassified pick_misclassified(const data::Dataset& test, const torch::Tensor& predictions) {
  Misclassified out;
  if (!predictions.defined() || predictions.size(0) != test.size()) return out;
  const auto wrong = torch::nonzero(predictions != test.labels.cpu()).flatten();  // (E) int64
  out.total = wrong.size(0);
  const auto kept = wrong.narrow(0, 0, std::min(out.total, kMisclassifiedKept));
  out.inputs = test.inputs.cpu().index_select(0, kept);
  out.labels = test.labels.cpu().index_select(0, kept);
  out.predicted = predictions.index_select(0, kept);
  return out;
}

// Where an epoch's counters start: step 0, zero sums on `device` (the RNG fields are
// capture_rng's).
RunState epoch_start(int64_t epoch, torch::Device device) {
  const auto on_device = torch::TensorOptions().device(device);
  RunState state;
  state.epoch = epoch;
  state.loss_sum = torch::zeros({}, on_device.dtype(torch::kFloat32));
  state.correct = torch::zeros({}, on_device.dtype(torch::kInt64));
  state.interval_loss = torch::zeros({}, on_device.dtype(torch::kFloat32));
  return state;
}

// Threads of the fused CPU step (--step-threads 0: automatic). It splits each step over the cores
// itself; BLAS then runs one thread in each (more would oversubscribe the cores:
// docs/benchmarks.md). Under ddp the ranks of a machine share its cores.
int choose_step_threads(const TrainConfig& config, const ParallelRun& parallel) {
  if (config.step_threads > 0) return config.step_threads;
  const int cores = parallel.cores();
  return config.blas_threads > 0 ? std::max(1, cores / config.blas_threads) : cores;
}

// "fused-mlp (2 threads, avx512 kernel)".
std::string describe_step(const TrainStep& step) {
  std::vector<std::string> parts;
  if (step.threads() > 1) parts.push_back(std::to_string(step.threads()) + " threads");
  if (step.kernel()) parts.push_back(std::string(step.kernel()) + " kernel");
  if (step.micro_batches() > 1)
    parts.push_back(std::to_string(step.micro_batches()) + " micro-batches a batch");
  std::string out = step.name();
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : " (") + parts[i];
  return parts.empty() ? out : out + ")";
}

// load_datasets, or with `test_only` its test split alone (train left empty): Fashion-MNIST then
// reads no training files.
Datasets load_splits(const TrainConfig& config, bool test_only) {
  if (config.dataset == kInMemoryDataset)
    throw Error("dataset '" + config.dataset +
                    "' is data a program gave Trainer::fit in memory; it cannot be loaded by name",
                "pass --dataset with that data (fashion-mnist, folder:PATH, sheet:FILE or "
                "npy:FILE[,LABELS.npy])");
  const bool sprites = data::is_sprite_dataset(config.dataset);
  if (!sprites && config.dataset != "fashion-mnist" && config.dataset != "dummy")
    throw Error("unknown dataset '" + config.dataset +
                "': expected fashion-mnist, dummy, sprites, "
                "folder:PATH, sheet:FILE or npy:FILE[,LABELS.npy]");
  data::check_sprite_options_apply(config.dataset, config.sprites);  // before reading anything
  Datasets out;
  out.source = config.dataset;
  if (config.dataset == "fashion-mnist") {
    const auto cache = data::IdxCache::from_environment();
    if (!test_only)
      out.train = data::load_fashion_mnist(config.data_dir, data::Split::kTrain, cache);
    out.test = data::load_fashion_mnist(config.data_dir, data::Split::kTest, cache);
  } else if (config.dataset == "dummy") {
    if (!test_only) out.train = data::make_dummy_dataset(4096, config.seed);
    out.test = data::make_dummy_dataset(1024, config.seed + 1);
  } else {
    // The held-out split is drawn from the whole set, so a sprite dataset is read whole.
    auto split = data::holdout_split(data::load_sprite_dataset(config.dataset, config.sprites),
                                     config.sprites.holdout, config.sprites.seed);
    if (!test_only) out.train = split.train;
    out.test = split.test;
  }
  // Sprite splits are in the dataset's order, which is by class (a folder's subfolders, a sheet's
  // labels): a limit takes samples stratified by class (every class keeps one, however
  // unbalanced), or it would keep the first class or two.
  // Fashion-MNIST's files are in no class order, and its first N are what the seeds' figures use.
  const auto limited = [sprites](const data::Dataset& set, int64_t limit) {
    return sprites ? set.spread(limit) : set.head(limit);
  };
  if (config.train_limit > 0 && !test_only) out.train = limited(out.train, config.train_limit);
  if (config.test_limit > 0) out.test = limited(out.test, config.test_limit);
  return out;
}

}  // namespace

Datasets load_datasets(const TrainConfig& config) { return load_splits(config, false); }

data::Dataset load_test_dataset(const TrainConfig& config) {
  return load_splits(config, true).test;
}

namespace {

// One call of Trainer::fit(): what is set up once (where, the task's module and its optimizer, the
// step, the data paths), then the epoch loop over it. A class so that each phase is a function of
// its own; it lives only for the call. The constructor keeps the set-up order, which matters: an
// impossible request fails before the model is built or data moved, and the seed is set before the
// weights are drawn.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& config, Task& task, const Datasets& data, TrainObserver* observer);
  // A module of the user's own leaves as it came, however the run ends: NCHW parameters again
  // where the run made them channels_last (the caller's own forward may .view() a convolution's
  // output).
  ~TrainingRun() {
    if (!channels_last_ || !users_module_) return;
    try {
      apply_contiguous(task_.module());
    } catch (const std::exception&) {  // out of memory: the module stays as the run made it
    }
  }
  TrainingRun(const TrainingRun&) = delete;  // observer_ may point at silent_
  TrainingRun& operator=(const TrainingRun&) = delete;

  TrainReport run();

 private:
  void check_task_options() const;  // options the task cannot honour are errors
  // Whether this run captures its step as a CUDA graph (--cuda-graphs on: it must, or an Error
  // says why; auto: where valid, else no_graphs_ says why).
  bool decide_cuda_graphs();
  void set_up_model();  // the task's module on the device, optimizer, resumed state, rank 0's
  void set_up_step();   // augmentation, the train step (and its CUDA graph), ddp hooks
  void fit_precision_to_weights(const torch::nn::Module& module);
  void set_up_data_paths();  // this rank's training data and the test data, resident or streaming
  Settings describe() const;
  // One epoch's training; its loss, accuracy and samples summed over the ranks.
  EpochReport train_epoch(int64_t epoch);
  // epochs_done and steps (optimizer steps since the run's first epoch) go into its metadata.
  Checkpoint make_checkpoint(int64_t epochs_done, int64_t steps) const;
  // A periodic or interrupt checkpoint of `progress` (its path; rank 0 writes it). One that cannot
  // be written where it belongs goes to the temp folder (rescue_path): its path is returned and
  // rescued_ says where it was meant to go and why it is not there.
  std::string save_run_checkpoint(RunState progress);
  // ddp: `progress` with the epoch's running sums (loss, correct, samples, the interval's) summed
  // over the ranks, as a checkpoint records them: on resume rank 0 restores them and the other
  // ranks start from zero, so the epoch's totals count each sample once. A collective: every rank
  // calls it at the same step. Single: `progress`.
  RunState summed_over_ranks(RunState progress);
  // What the ranks must share (ParallelRun::check_same_settings), once the model and the resumed
  // state are known.
  RunSettings settings_ranks_share() const;
  Error diverged(const std::string& what, int64_t epoch, const std::string& where) const;
  void check_test_loss(double loss, int64_t epoch, const std::string& where) const;
  // Every trainable parameter finite: one pass over the flat values and one read (a device sync).
  bool finite_weights() const { return torch::isfinite(optimizer_->values()).all().item<bool>(); }
  // A user's model failing in the step (0-based epoch and step) on `inputs`, a batch of `samples`.
  Error step_failed(int64_t epoch, int64_t step, const torch::Tensor& inputs, int64_t samples,
                    const std::string& message) const;
  // Training time so far: the run's clock less its evaluations and end-of-epoch work.
  double train_seconds_now() const;
  // A test evaluation after `step` steps of `epoch` (0-based), outside the timed training: kept in
  // last_test_ and evals_ (rank 0), checked against --target-accuracy. Returns whether the run
  // stops here, agreed by every rank (each calls it at the same steps).
  bool evaluate_point(int64_t epoch, int64_t step, bool keep_predictions);
  // --time-budget, after every step: starts the clock after kBudgetSkipSteps steps and, after
  // kBudgetTimedSteps more, sets epochs_ to what fits (rank 0's plan on every rank); then revises
  // the plan at next_revision_ from the speed of every step timed so far.
  void follow_budget(int64_t epoch);
  // --time-budget used up at the end of `epoch`, before the plan (its steps still being timed): a
  // plan that ends the run there (rank 0's clock decides for every rank; a collective).
  void end_spent_budget(int64_t epoch);
  // `plan` becomes the run's: its steps and warm-up filled in, epochs_ set, its next revision
  // planned where `revisable`, and the observer told.
  void adopt_plan(BudgetPlan plan, bool revisable);
  // --resume of a run sized by --time-budget: the checkpoint's plan carried on under this run's
  // --time-budget (see the definition).
  void continue_budget_plan();
  // A resumed run whose epochs are all done: an Error saying what would train on (more --epochs,
  // or a larger --time-budget when the budget's plan is what ends it).
  void check_something_to_train() const;
  // A warm-up at least as long as the run's steps (the most --time-budget may plan): the lr never
  // reaches --lr. An Error when the user chose it, else warmup_note_ says so.
  void check_warmup();
  void check_step_schedule() const;
  void note_resumed_changes() const;
  // The run's global step (0-based) at step `step` of 0-based `epoch`: every step before it, in
  // this process and those it resumed. An end-of-run checkpoint may be resumed with another
  // --batch-size, so its epochs count as the steps they had (start_steps_), not as steps_ each;
  // a mid-epoch one may not (the same steps_).
  int64_t global_step(int64_t epoch, int64_t step) const {
    return start_steps_ - resumed_within_ + (epoch - start_epoch_) * steps_ + step;
  }
  // This process's optimizer steps in a plan of `epochs` in total.
  int64_t steps_planned(int64_t epochs) const {
    return std::max<int64_t>(0, (epochs - start_epoch_) * steps_ - resumed_within_);
  }
  // The thread governor (train/thread_governor.h) over the pool that holds the cores: on the CPU,
  // one process, no thread count given, and --thread-governor on, or auto where the pool's results
  // do not depend on its threads (the fused step's).
  void set_up_thread_governor();

  const TrainConfig& config_;
  Task& task_;
  const TaskTraits traits_;
  const Datasets& data_;
  TrainObserver silent_;
  TrainObserver* observer_;  // silent_ when none is given, and on ddp ranks other than 0
  const std::string run_base_;
  ParallelRun parallel_;
  const torch::Device device_;       // resolved once, named the seeds' way
  const Optimization optimization_;  // optimizer options and lr schedule
  CpuThreads threads_;
  std::unique_ptr<ThreadGovernor> governor_;
  std::string governor_note_;  // the settings row: what it governs, or why it is off
  std::string warmup_note_;    // the settings row: a warm-up not chosen that outlasts the run
  precision::PrecisionPlan plan_;

  std::optional<Checkpoint> resumed_;  // --resume, read and checked once
  bool has_conv_ = false;              // a 4-D parameter: --channels-last concerns this model
  bool channels_last_ = false;
  std::string channels_last_refused_;  // why a module of the user's own stays NCHW
  bool users_module_ = false;          // not one of ours (TaskTraits::builtin_model)
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::unique_ptr<precision::GradScaler> scaler_;  // fp16 only
  int64_t start_epoch_ = 0;
  int64_t start_steps_ = 0;           // optimizer steps before this run (resumed)
  int64_t resumed_within_ = 0;        // steps of epoch start_epoch_ done before this run
  double resumed_train_seconds_ = 0;  // training time of the processes before this run
  int64_t steps_done_ = 0;            // optimizer steps in this run
  int64_t epochs_ = 0;  // the run's epochs in total: --epochs, or what --time-budget planned
  double budget_clock_start_ = 0;             // training seconds when the timed steps began
  std::optional<BudgetPlan> budget_;          // the plan, once made
  bool replan_budget_ = false;                // resumed with another --time-budget than its plan's
  int64_t next_revision_ = 0;                 // steps_done_ at which the plan is revised (0: never)
  int64_t max_revisions_ = kBudgetRevisions;  // the plan's revisions count, at most
  std::optional<RunState> run_state_;         // resuming mid-epoch: where

  data::AugmentOptions augment_;
  std::unique_ptr<TrainStep> step_;
  bool use_graphs_ = false;
  std::string no_graphs_;                      // why not, on a CUDA device
  std::unique_ptr<CudaGraphStep> graph_step_;  // replays full batches; a partial one runs eagerly

  bool drop_last_ = false;
  data::DataPath train_path_, test_path_;
  int64_t steps_ = 0;  // per epoch
  // A periodic checkpoint is written when the losses so far are finite, but its own weights'
  // loss is the next step's: it is good once a later check finds that finite. Until then it is
  // `unconfirmed_`, and --keep-last keeps `last_good_` beside it.
  std::string last_good_;    // newest periodic checkpoint known good
  std::string unconfirmed_;  // newer one, written after the last finite loss check
  void losses_finite() {     // a check of the losses since the newest checkpoint passed
    if (unconfirmed_.empty()) return;
    last_good_ = std::move(unconfirmed_);
    unconfirmed_.clear();
  }
  bool tidied_periodic_ = false;  // the killed writers' periodic temporaries removed (first save)
  // --save there at the start was allowed to be replaced (--overwrite, or the file resumed from);
  // one made by another process while this run trained is not.
  const IfExists save_existing_;
  struct Rescued {
    std::string wanted, why;  // the path asked for; the write's error
  };
  std::optional<Rescued> rescued_;  // the newest run checkpoint went to the temp folder

  std::optional<DeviceTimer> run_timer_;          // the epoch loop's clock
  double eval_seconds_ = 0, sample_seconds_ = 0;  // outside the timed training
  std::optional<EvalReport> last_test_;           // the newest evaluation (rank 0)
  std::vector<EvalPoint> evals_;
  std::optional<EvalPoint> target_reached_;
  bool stop_ = false;                       // --target-accuracy reached (stop_at_target)
  std::optional<RunState> stopped_within_;  // where, when that was within an epoch
};

TrainingRun::TrainingRun(const TrainConfig& config, Task& task, const Datasets& data,
                         TrainObserver* observer)
    : config_(config),
      task_(task),
      traits_(task.traits()),
      data_(data),
      observer_(observer ? observer : &silent_),
      run_base_(run_checkpoint_base(config)),
      parallel_(config, distributed::process_env()),
      device_(parallel_.pick_device(config.device)),
      optimization_(optimization_of(config)),
      epochs_(config.epochs),
      save_existing_(config.overwrite || std::filesystem::exists(config.save) ? IfExists::kReplace
                                                                              : IfExists::kKeep) {
  if (!parallel_.is_main()) observer_ = &silent_;  // under ddp only rank 0 talks to the observer
  check_task_options();
  if (!config_.resume.empty()) {
    resumed_ = load_checkpoint(config_.resume);
    check_resumed_data(config_, task_.name(), *resumed_);
    check_resumed_classes(config_, *resumed_, data_.train.class_names);
    check_resumed_optimizer(*resumed_, config_.resume, config_);
  }
  parallel_.connect(device_);
  // Precision (docs/precision.md): resolved once against the device, before any data is read, so
  // an impossible combination fails at once.
  plan_ = precision::resolve_precision(config_.precision, device::describe_device(device_));
  use_graphs_ = decide_cuda_graphs();
  torch::manual_seed(config_.seed);
  set_up_model();
  // A checkpoint holds the parameters and at least one optimizer moment of each: with less room
  // than that, --save would fail after the training (periodic checkpoints go beside it).
  if (parallel_.is_main() && (!config_.save.empty() || config_.checkpoint_every > 0)) {
    uint64_t bytes = 0;
    for (const auto& p : task_.module().parameters())
      bytes += 2 * static_cast<uint64_t>(p.numel()) * p.element_size();
    check_room_for(run_base_, bytes, config_.save.empty() ? "--checkpoint-every" : "--save");
  }
  set_up_step();
  // CPU threads, once the model and the step are known (common/cpu_threads.h: conv nets want
  // LibTorch's pool, MLPs BLAS's). The fused CPU step splits each step over the cores itself, so
  // BLAS runs one thread inside each.
  const bool step_owns_cores = step_->threads() > 1 && config_.blas_threads == 0;
  threads_ = apply_cpu_threads(config_.threads, step_owns_cores ? 1 : config_.blas_threads,
                               cpu_work_of(task_.module()), parallel_.cores());
  set_up_data_paths();
  continue_budget_plan();  // another --time-budget may give the run more epochs, or fewer
  check_something_to_train();
  check_warmup();
  check_step_schedule();
  note_resumed_changes();
}

// A resumed run that draws with another --seed, or computes in another precision, than the run it
// continues no longer gives the weights one longer run would have (docs/reliability.md): allowed,
// as another --lr is, but not silently (a bf16 run resumed without --precision went on in fp32).
void TrainingRun::note_resumed_changes() const {
  if (!resumed_ || !parallel_.is_main()) return;
  const auto& meta = resumed_->meta;
  if (const auto it = meta.find("seed");
      it != meta.end() && it->is_number_unsigned() && it->get<uint64_t>() != config_.seed)
    spritetorch::note("--resume " + config_.resume + " was trained with --seed " +
                      std::to_string(it->get<uint64_t>()) + "; this run goes on with " +
                      std::to_string(config_.seed) + ", so it shuffles and draws as one longer " +
                      "run would not (pass --seed " + std::to_string(it->get<uint64_t>()) +
                      " to continue it as it was)");
  const std::string now = precision::to_string(plan_.precision);
  if (const auto it = meta.find("precision");
      it != meta.end() && it->is_string() && it->get<std::string>() != now)
    spritetorch::note("--resume " + config_.resume + " was trained in " + it->get<std::string>() +
                      "; this run goes on in " + now + " (pass --precision " +
                      it->get<std::string>() + " to continue it as it was)");
}

// A step schedule whose first step comes after the run's last epoch trains as a constant lr would:
// a note says so (a later --resume with more --epochs reaches it, so it is not refused).
void TrainingRun::check_step_schedule() const {
  const LrSchedule& schedule = optimization_.schedule;
  if (schedule.kind != LrSchedule::Kind::kStep || config_.time_budget_s > 0 ||
      schedule.every_epochs < epochs_ || !parallel_.is_main())
    return;
  spritetorch::note("--lr-schedule step:" + std::to_string(schedule.every_epochs) +
                    " first lowers the lr after epoch " + std::to_string(schedule.every_epochs) +
                    ", and this run ends after epoch " + std::to_string(epochs_) +
                    ": its lr stays --lr (a --resume with more --epochs reaches the step)");
}

void TrainingRun::check_warmup() {
  const int64_t warmup = optimization_.schedule.warmup_steps;
  // The schedule counts the global step from the run's first (a resumed run's included). A warm-up
  // as long as the run reaches --lr at its last step.
  const int64_t total = global_step(epochs_, 0);
  if (warmup == 0 || warmup <= total || steps_planned(epochs_) == 0) return;
  // The lr of the last step, (total / warmup) of --lr: "1.6%", "50%".
  const std::string peak =
      lr_percent_text(static_cast<double>(total) / static_cast<double>(warmup));
  const std::string run = "(" + std::string(config_.time_budget_s > 0 ? "at most " : "") +
                          std::to_string(total) + " steps: " + std::to_string(epochs_) +
                          (epochs_ == 1 ? " epoch" : " epochs") + " of " + std::to_string(steps_) +
                          ")";
  const std::string lr =
      "the lr only reaches " + peak + "% of --lr " + c10::str(optimization_.options.lr);
  if (config_.warmup_steps_origin.empty())
    throw Error("--warmup-steps " + std::to_string(warmup) + " spans the whole run " + run + ": " +
                    lr + ", at the last step",
                "pass a --warmup-steps below " + std::to_string(total) +
                    " (a tenth of the run's steps or less is usual), or more --epochs");
  warmup_note_ = config_.warmup_steps_origin + "'s " + std::to_string(warmup) +
                 " warm-up steps span the whole run " + run + ": " + lr +
                 ", at the last step (--warmup-steps sets the warm-up)";
}

void TrainingRun::check_something_to_train() const {
  if (!resumed_ || start_epoch_ < epochs_ || (run_state_ && run_state_->step > 0)) return;
  const std::string nothing = "nothing to train: " + config_.resume + " has " +
                              std::to_string(start_epoch_) + " epochs done, and the run has " +
                              std::to_string(epochs_);
  const std::string eval = "; `spritetorch eval --checkpoint " + config_.resume + "` evaluates it";
  // The plan of --time-budget, not --epochs, ends it: more epochs would change nothing.
  if (budget_ && epochs_ < config_.epochs)
    throw Error(nothing + ": the plan of its --time-budget (" +
                    format_duration(config_.time_budget_s, /*keep_tenths=*/true) + ", " +
                    format_duration(resumed_train_seconds_, /*keep_tenths=*/true) +
                    " of it trained) ends there",
                "pass a larger --time-budget to plan again, or --time-budget 0 to train to "
                "--epochs" +
                    eval);
  throw Error(nothing,
              "pass --epochs " + std::to_string(start_epoch_ + 1) + " or more to train on" + eval);
}

void TrainingRun::check_task_options() const {
  const std::string task = "task '" + task_.name() + "'";
  if (config_.cuda_graphs == CudaGraphs::kOn && !traits_.cuda_graphs)
    throw Error("--cuda-graphs cannot capture the step of " + task + ": " + traits_.no_cuda_graphs,
                "drop --cuda-graphs");
  if (config_.target_accuracy > 0 && !traits_.has_accuracy)
    throw Error("--target-accuracy needs a task with an accuracy; " + task + " has none",
                "drop --target-accuracy");
  // The options that act on the test set only: without one they would silently do nothing.
  if (data_.test.size() == 0) {
    const struct {
      bool given;
      const char* flag;
      const char* what;  // what it does to the test set
    } test_options[] = {{config_.target_accuracy > 0, "--target-accuracy", "is checked on"},
                        {config_.eval_every_steps > 0, "--eval-every-steps", "evaluates"},
                        {config_.test_limit > 0, "--test-limit", "limits"}};
    for (const auto& option : test_options)
      if (option.given)
        throw Error(
            std::string(option.flag) + " " + option.what + " the test set; this run has none",
            "drop " + std::string(option.flag) +
                ", or hold out a test set (--holdout for sprite sets)");
  }
  if (parallel_.kind() == StrategyKind::kDataParallel && !traits_.data_parallel)
    throw Error("--strategy dp replicates our built-in classifiers only; " + task +
                    " cannot be split that way",
                "use --strategy ddp (one process per device: spritetorch launch)");
  // --thread-governor on where it could not act is refused, not dropped (auto and off are always
  // honoured: they ask for nothing more than the defaults).
  check_thread_governor_counts(config_);
  if (config_.thread_governor == ThreadGovernorMode::kOn) {
    if (!device_.is_cpu())
      throw Error("--thread-governor on governs CPU threads; this run trains on " +
                      device::display_name(device_),
                  "drop --thread-governor");
    if (parallel_.distributed())
      throw Error(
          "--thread-governor on does not apply to ddp: its ranks share the machine's "
          "cores by design",
          "drop --thread-governor");
  }
}

bool TrainingRun::decide_cuda_graphs() {
  if (config_.cuda_graphs == CudaGraphs::kOff) {
    no_graphs_ = "--no-cuda-graphs";
    return false;
  }
  const bool required = config_.cuda_graphs == CudaGraphs::kOn;
  std::optional<Error> why = cuda_graphs_unavailable(
      device_, config_.data_path.data_on == "host" ? "streaming" : "resident");
  if (!why && !traits_.cuda_graphs)  // (--cuda-graphs on was refused by check_task_options)
    why = Error("the step of task '" + task_.name() +
                "' cannot be captured: " + traits_.no_cuda_graphs);
  if (!why && parallel_.distributed())
    why = Error(
        "--cuda-graphs cannot be combined with ddp: the gradient all-reduce runs outside the "
        "captured step",
        "drop --cuda-graphs, or train with one process");
  if (!why && parallel_.kind() == StrategyKind::kDataParallel)
    why = Error("DataParallel replicates the model on every step, outside any graph",
                "use ddp (one process per GPU) or drop --cuda-graphs");
  if (!why) return true;
  if (required) throw *why;
  no_graphs_ = why->what();
  return false;
}

namespace {

// The task's step on two training samples in channels_last (eval mode, no gradient), its module's
// 4-D parameters already converted: "" when it runs, else the first line of why not. A step that
// fails in NCHW too is left to fail where it runs, with its own error.
std::string channels_last_failure(Task& task, torch::nn::Module& module, const data::Dataset& train,
                                  torch::Device device) {
  if (train.size() == 0 || train.inputs.dim() != 4) return "";
  const int64_t n = std::min<int64_t>(2, train.size());
  data::Batch probe;
  probe.inputs = data::to_model_input(train.inputs.narrow(0, 0, n)).to(device);
  probe.labels = train.labels.narrow(0, 0, n).to(device, torch::kInt64);
  auto runs = [&](torch::MemoryFormat format) -> std::string {
    data::Batch batch = probe;
    batch.inputs = probe.inputs.contiguous(format);
    try {
      torch::NoGradGuard no_grad;
      task.training_step(batch);
    } catch (const c10::Error& e) {
      return first_line(e.what_without_backtrace());
    } catch (const std::exception& e) {
      return first_line(e.what());
    }
    return "";
  };
  models::EvalModeScope eval_mode(module);
  std::string failure = runs(torch::MemoryFormat::ChannelsLast);
  if (!failure.empty()) {
    apply_contiguous(module);
    if (!runs(torch::MemoryFormat::Contiguous).empty()) failure.clear();
    apply_channels_last(module);
  }
  return failure;
}

}  // namespace

// A model whose weights are not float32 (a TorchScript model kept in float64 or bf16) trains in its
// own dtype: autocast leaves float64 operations as they are, so --precision bf16 changed nothing
// while the settings said "bf16 autocast, fp32 weights". Its plan is fp32's (no autocast, no
// scaler) with a row naming the dtype; a --precision it cannot apply is refused.
void TrainingRun::fit_precision_to_weights(const torch::nn::Module& module) {
  std::set<torch::ScalarType> dtypes;
  for (const auto& p : module.parameters())
    if (p.is_floating_point()) dtypes.insert(p.scalar_type());
  if (dtypes.empty() || dtypes == std::set<torch::ScalarType>{torch::kFloat32}) return;
  const auto name = [](torch::ScalarType t) -> std::string {
    switch (t) {
      case torch::kFloat64:
        return "float64";
      case torch::kFloat32:
        return "float32";
      case torch::kBFloat16:
        return "bf16";
      case torch::kFloat16:
        return "fp16";
      default:
        return c10::toString(t);
    }
  };
  std::string names;
  for (const auto t : dtypes) names += (names.empty() ? "" : " and ") + name(t);
  const precision::Precision asked = config_.precision;
  const bool own = dtypes.size() == 1 &&
                   ((asked == precision::Precision::kBf16 && *dtypes.begin() == torch::kBFloat16) ||
                    (asked == precision::Precision::kFp16 && *dtypes.begin() == torch::kFloat16));
  if (asked != precision::Precision::kFp32 && asked != precision::Precision::kAuto && !own)
    throw Error("--precision " + precision::to_string(asked) +
                    " changes nothing for this model: its weights are " + names +
                    ", and autocast leaves " + names + " operations as they are",
                "drop --precision (the model trains in its own " + names +
                    ") or give the model float32 weights");
  plan_ =
      precision::resolve_precision(precision::Precision::kFp32, device::describe_device(device_));
  plan_.description =
      names + " weights and operations, the model's own (--precision sets a " + "float32 model's)";
}

void TrainingRun::set_up_model() {
  task_.build(
      {data_.train, resumed_ ? &*resumed_ : nullptr, config_.resume, config_.seed, device_});
  // After build(): a classifier knows only then whether its model is a TorchScript file.
  users_module_ = !task_.traits().builtin_model;
  torch::nn::Module& module = task_.module();
  module.to(device_);  // once, before the loop
  task_.to_device(device_);
  fit_precision_to_weights(module);
  // channels_last must be set before the flat optimizer re-points the parameters (it keeps their
  // strides).
  for (const auto& p : module.parameters()) has_conv_ |= p.dim() == 4;
  // On CUDA and on a CPU with AVX2 or AVX-512 (device::channels_last_pays; docs/precision.md).
  channels_last_ = device::channels_last_pays(device_) && config_.channels_last && has_conv_;
  if (channels_last_) apply_channels_last(module);
  if (channels_last_ && users_module_) {
    channels_last_refused_ = channels_last_failure(task_, module, data_.train, device_);
    if (!channels_last_refused_.empty()) {
      channels_last_ = false;
      apply_contiguous(module);
    }
  }
  if (device_.is_cuda()) at::globalContext().setBenchmarkCuDNN(config_.cudnn_benchmark);
  optimizer_ = std::make_unique<FlatOptimizer>(trainable_parameters(module), optimization_.options);
  if (resumed_) {
    task_.load(*resumed_, config_.resume);
    try {
      optimizer_->load_state(resumed_->optimizer);
    } catch (const DataError&) {
      throw;
    } catch (const Error& e) {
      throw DataError(config_.resume, "the optimizer state of this model", e.what());
    }
    start_epoch_ = resumed_->meta.value("epoch", int64_t{0});
    start_steps_ = resumed_->meta.value("steps", int64_t{0});
    run_state_ = load_run_state(*resumed_, device_, config_.resume);
    resumed_within_ = run_state_ ? run_state_->step : 0;
    // The run's clock goes on from the training time its checkpoint records: that of its run
    // state, or of an older final checkpoint's metadata (older periodic ones recorded none: 0).
    resumed_train_seconds_ = run_state_ ? run_state_->train_seconds : 0;
    if (const auto it = resumed_->meta.find("train_seconds");
        resumed_train_seconds_ == 0 && it != resumed_->meta.end() && it->is_number() &&
        std::isfinite(it->get<double>()) && it->get<double>() > 0)
      resumed_train_seconds_ = it->get<double>();
    // A run sized by --time-budget goes on with its plan, so its schedule keeps its length: a new
    // plan from this process's speed would move the end of the cosine decay
    // (continue_budget_plan). This --epochs caps it as the first run's did.
    if (config_.time_budget_s > 0 && resumed_->meta.contains("time_budget")) {
      budget_ = budget_from_json(resumed_->meta.at("time_budget"), config_.resume);
      // Another --time-budget: the plan is made again at once (continue_budget_plan), up to this
      // --epochs; the same budget keeps the plan, which this --epochs may only shorten.
      replan_budget_ = budget_->budget_s != config_.time_budget_s;
      budget_->max_epochs =
          replan_budget_ ? config_.epochs : std::min(budget_->max_epochs, config_.epochs);
      budget_->epochs = std::min(budget_->epochs, budget_->max_epochs);
      epochs_ = std::min(epochs_, budget_->epochs);
    }
    // Mid-epoch only: an epoch boundary may change --batch-size (its state carries just the RNG).
    if (run_state_ && run_state_->step > 0)
      check_mid_run_resume(config_, *resumed_, *run_state_, data_.train.size(),
                           parallel_.world_size(), parallel_.local_shards());
  }
  if (parallel_.distributed()) parallel_.check_same_settings(settings_ranks_share());
  parallel_.broadcast_model(module, *optimizer_);
  if (plan_.grad_scaling) {
    scaler_ = std::make_unique<precision::GradScaler>(device_);
    if (resumed_ && resumed_->meta.contains("grad_scaler"))
      scaler_->load_state(resumed_->meta.at("grad_scaler"), config_.resume);
  }
}

void TrainingRun::set_up_step() {
  augment_ = data::parse_augment(config_.augment);
  if (augment_.shift > 0 && data_.train.inputs.dim() == 4 &&
      2 * augment_.shift >= std::min(data_.train.inputs.size(2), data_.train.inputs.size(3)))
    throw Error("--augment " + config_.augment + ": a shift of " + std::to_string(augment_.shift) +
                    " pixels moves most of " + data_.train.name + "'s " +
                    std::to_string(data_.train.inputs.size(2)) + "x" +
                    std::to_string(data_.train.inputs.size(3)) + " images out of the frame",
                "shift by less than half the image's side (shift:2 is the usual)");
  // A square as wide as the image blanks over half of it on average (9/16 of a square image), and
  // from 2 sides - 1 all of it wherever its centre falls: the model would learn from blank images.
  const int64_t side = data_.train.inputs.dim() == 4
                           ? std::max(data_.train.inputs.size(2), data_.train.inputs.size(3))
                           : 0;
  if (augment_.cutout > 0 && side > 0 && augment_.cutout >= side)
    throw Error(
        "--augment " + config_.augment + ": a cutout of " + std::to_string(augment_.cutout) +
            " pixels blanks most of each of " + data_.train.name + "'s " +
            std::to_string(data_.train.inputs.size(2)) + "x" +
            std::to_string(data_.train.inputs.size(3)) + " images" +
            (augment_.cutout >= 2 * side - 1 ? " (all of it, wherever the square falls)" : ""),
        "cut out a square smaller than the image's side, " + std::to_string(side) +
            " pixels (cutout:8 on 28x28 images is the usual)");
  if (augment_.enabled() && data_.train.inputs.dim() != 4)
    throw Error("--augment " + config_.augment + " needs image data; " + data_.train.name +
                " holds feature vectors");
  if (parallel_.kind() == StrategyKind::kDataParallel)
    task_.use_data_parallel(parallel_.data_parallel_devices());
  const int cpu_threads = device_.is_cpu() ? choose_step_threads(config_, parallel_) : 1;
  // The step's buffers: no batch is larger than the data when every sample comes once an epoch
  // (--batch-size 10^8 on 256 samples must not allocate for 10^8).
  const int64_t largest_batch =
      config_.class_sampling == data::ClassSampling::kNatural
          ? std::min(config_.batch_size, std::max<int64_t>(1, data_.train.size()))
          : config_.batch_size;
  // --precision auto on a CPU whose native bf16 auto takes (DeviceInfo::bf16_auto): where the model
  // has the fused CPU step, its bf16 form (layer 1 in bf16, common/bf16_gemm.h) is ~9% faster
  // than its fp32 form on Zen 5 at the same accuracy, and both beat bf16 autocast (autograd) by
  // ~2x (docs/precision.md), so auto takes the fused bf16 step where the CPU runs its kernels and
  // the fused fp32 step where it does not; other models (conv nets: bf16 1.27x faster on Zen 5)
  // keep bf16 autocast.
  // --micro-batches splits the autograd step's batches; auto then picks it over the fused one.
  if (config_.micro_batches < 1 || config_.micro_batches > config_.batch_size)
    throw Error("--micro-batches " + std::to_string(config_.micro_batches) +
                ": expected 1 to the batch size, " + std::to_string(config_.batch_size));
  const bool split = config_.micro_batches > 1;
  const StepKind step_kind =
      split && config_.step == StepKind::kAuto ? StepKind::kAutograd : config_.step;
  if (config_.precision == precision::Precision::kAuto && device_.is_cpu() && plan_.autocast &&
      step_kind != StepKind::kAutograd) {
    const StepPrecision native{plan_, nullptr, channels_last_, !use_graphs_};
    auto fused_bf16 = task_.fast_step({largest_batch, step_kind, native, cpu_threads});
    if (fused_bf16 && fused_bf16->kernel()) step_ = std::move(fused_bf16);
  }
  if (!step_ && config_.precision == precision::Precision::kAuto && device_.is_cpu() &&
      plan_.autocast && step_kind != StepKind::kAutograd) {
    auto fp32 =
        precision::resolve_precision(precision::Precision::kFp32, device::describe_device(device_));
    const StepPrecision plain{fp32, nullptr, channels_last_, !use_graphs_};
    auto fused = task_.fast_step({largest_batch, step_kind, plain, cpu_threads});
    if (fused && fused->kernel()) {
      fp32.description += " (auto: this model's fused fp32 CPU step is faster than bf16 here)";
      plan_ = fp32;
      step_ = std::move(fused);
    }
  }
  const StepPrecision precision{plan_, scaler_.get(), channels_last_,
                                /*autocast_cache=*/!use_graphs_};
  if (!step_) step_ = task_.fast_step({largest_batch, step_kind, precision, cpu_threads});
  if (!step_)
    step_ = std::make_unique<AutogradStep>(
        [this](const data::Batch& batch) { return task_.training_step(batch); }, precision,
        traits_.has_accuracy);
  // The fused step in bf16 rounds only layer 1's operands: the row says so, not "autocast".
  if (const auto* mlp = dynamic_cast<const CpuMlpStep*>(step_.get());
      mlp && mlp->compute() == MlpCompute::bf16)
    plan_.description =
        std::string("bf16 in layer 1's products (fused step), fp32 weights and later layers") +
        (config_.precision == precision::Precision::kAuto
             ? " (auto: faster than fp32 here, same accuracy)"
             : "");
  if (!step_->set_micro_batches(config_.micro_batches))
    throw Error(std::string("--micro-batches splits the autograd step's batches; this run's step "
                            "is ") +
                    step_->name() + ", which takes each batch whole",
                "use --step autograd (or auto), or drop --micro-batches");
  // --step-threads splits the fused CPU step (the kernel-backed one); another step would drop it.
  if (config_.step_threads > 0 && device_.is_cpu() && !step_->kernel())
    throw Error(
        std::string("--step-threads splits the fused CPU step of ReLU MLPs; this run's step is ") +
            step_->name() +
            (std::string(step_->name()) == "fused-mlp"
                 ? std::string(" on LibTorch's matrix products (the matrix kernel here is ") +
                       gemm::kernel_name(gemm::best_kernel()) + ", or the layers are not float32)"
                 : std::string()),
        "drop --step-threads (--threads sets LibTorch's threads for it)");
  optimizer_->use_thread_pool(step_->thread_pool());  // the optimizer step splits over them too
  // Each thread over what it wrote: refused (the even split) where the plan does not fit.
  optimizer_->use_thread_shares(step_->update_shares());
  parallel_.attach(*step_, *optimizer_, trainable_parameters(task_.module()));
  if (use_graphs_)
    graph_step_ = std::make_unique<CudaGraphStep>(
        *step_, *optimizer_, scaler_.get(), config_.clip_grad_norm, config_.batch_size, device_);
}

void TrainingRun::set_up_data_paths() {
  drop_last_ = config_.drop_last || traits_.drop_last;
  data::LoaderOptions train_options{config_.batch_size, /*shuffle=*/true, drop_last_, config_.seed};
  train_options.class_sampling = config_.class_sampling;
  // ddp: this rank's share (parallel_ may keep it, so it lives as long as the run).
  const data::Dataset& train_data = parallel_.shard(data_.train, train_options);
  train_path_ = data::make_data_path(train_data, device_, train_options, config_.data_path);
  train_path_.loader->use_thread_pool(step_->thread_pool(), step_->reads_thread_inputs());
  steps_ = train_path_.loader->batches_per_epoch();
  if (steps_ == 0 && epochs_ > start_epoch_)
    throw Error("the training data (" + std::to_string(train_data.size()) +
                    " samples on this rank) fills no batch of " +
                    std::to_string(config_.batch_size) +
                    (drop_last_ ? " (every batch must be full)" : ""),
                "use a smaller --batch-size");
  if (data_.test.size() > 0)
    test_path_ = data::make_data_path(
        data_.test, device_,
        {evaluation_batch(device_, cpu_work_of(task_.module()), config_.batch_size), false, false,
         config_.seed},
        config_.data_path);
}

Settings TrainingRun::describe() const {
  Settings settings = {{"device", device::display_name(device_)}};
  for (auto& row : task_.settings()) settings.push_back(std::move(row));
  const Settings common = {
      {"dataset", data_.train.name + " (" + std::to_string(data_.train.size()) + " train, " +
                      std::to_string(data_.test.size()) + " test, " +
                      std::to_string(data_.train.num_classes()) + " classes)"},
      {"data path", train_path_.description},
      {"batch",
       std::to_string(config_.batch_size) +
           // ddp: each rank's; a step averages the ranks' gradients over all of them.
           (parallel_.distributed() && parallel_.world_size() > 1
                ? " per rank, " + std::to_string(config_.batch_size * parallel_.world_size()) +
                      " a step over " + std::to_string(parallel_.world_size()) + " ranks"
                : "") +
           (drop_last_ ? " (drop last)" : "")},
      {"epochs",
       std::to_string(epochs_) + (config_.time_budget_s > 0 ? " at most" : "") +
           (start_epoch_ ? " (resuming after " + std::to_string(start_epoch_) + ")" : "")},
      {"optimizer", optimization_.describe() + " (flat buffers)"},
      {"augment", augment_.describe()},
      {"class sampling", config_.class_sampling == data::ClassSampling::kBalanced
                             ? "balanced (each class equally often per epoch)"
                             : "natural (every sample once per epoch)"},
      {"step", describe_step(*step_)},
      {"precision",
       plan_.description + (config_.clip_grad_norm > 0
                                ? ", clip grad norm " + c10::str(config_.clip_grad_norm)
                                : std::string())},
      {"seed", std::to_string(config_.seed)},
      {"threads", describe_cpu_threads(threads_)},
      {"strategy", parallel_.describe()},
  };
  settings.insert(settings.end(), common.begin(), common.end());
  if (!governor_note_.empty()) settings.emplace_back("thread governor", governor_note_);
  if (!warmup_note_.empty()) settings.emplace_back("warm-up", warmup_note_);
  if (device_.is_cpu())
    if (const std::string blas = openblas_core_warning(); !blas.empty())
      settings.emplace_back("blas", blas);
  if (config_.time_budget_s > 0)
    settings.emplace_back(
        "time budget",
        budget_
            ? format_duration(config_.time_budget_s, /*keep_tenths=*/true) +
                  " of training for the whole run, " +
                  format_duration(resumed_train_seconds_, /*keep_tenths=*/true) +
                  " of it used: the plan of the run resumed, " + std::to_string(budget_->epochs) +
                  " epochs at " + c10::str(budget_->seconds_per_step) +
                  " s a step, revised from the speed of this run's steps " +
                  std::to_string(kBudgetSkipSteps + 1) + "-" +
                  std::to_string(kBudgetSkipSteps + kBudgetTimedSteps) + " on"
            : format_duration(config_.time_budget_s, /*keep_tenths=*/true) +
                  " of training: the epochs that fit, planned from the speed of steps " +
                  std::to_string(kBudgetSkipSteps + 1) + "-" +
                  std::to_string(kBudgetSkipSteps + kBudgetTimedSteps) +
                  ", revised halfway and three-quarters through");
  // On MPS the option is said to do nothing, not dropped silently (docs/precision.md).
  if (!config_.cudnn_benchmark && !device_.is_cuda())
    settings.emplace_back("cudnn benchmark", "--cudnn-benchmark false unused: cuDNN runs on CUDA");
  if (!config_.channels_last && !has_conv_)  // the default (true) says nothing here either
    settings.emplace_back("memory format",
                          "--channels-last false unused: this model has no convolutions");
  if (config_.channels_last && has_conv_)
    settings.emplace_back("memory format",
                          channels_last_ ? "channels_last"
                          : !channels_last_refused_.empty()
                              ? "NCHW: the model's step fails on channels_last tensors (" +
                                    channels_last_refused_ +
                                    "); .reshape() instead of .view() lets it run channels_last"
                              : "NCHW (--channels-last applies to CUDA and to CPUs with AVX2)");
  if (graph_step_)
    settings.emplace_back("cuda graphs", "whole step captured after " +
                                             std::to_string(CudaGraphStep::kWarmupSteps) +
                                             " eager warm-up steps, lr read on the device" +
                                             " (a partial last batch runs eagerly)");
  else if (device_.is_cuda())
    settings.emplace_back("cuda graphs", "off: " + no_graphs_);
  else if (config_.cuda_graphs == CudaGraphs::kOff)
    settings.emplace_back("cuda graphs",
                          "off: --no-cuda-graphs unused here, graphs are captured on CUDA only");
  return settings;
}

// Every checkpoint of this run: the final one (--save) and the periodic/interrupt ones.
Checkpoint TrainingRun::make_checkpoint(int64_t epochs_done, int64_t steps) const {
  Checkpoint checkpoint;
  checkpoint.meta = {
      {"task", task_.name()},
      {"class_names", data_.train.class_names},
      {"dataset", config_.dataset},
      {"epoch", epochs_done},
      {"steps", steps},
      {"seed", config_.seed},
      {"batch_size", config_.batch_size},  // per rank
      {"world_size", parallel_.world_size()},
      {"local_shards", parallel_.local_shards()},
      {"drop_last", config_.drop_last},
      {"class_sampling", choice_name(config_.class_sampling)},
      {"train_samples", data_.train.size()},
      {"spritetorch_version", SPRITETORCH_VERSION},
      {"precision", precision::to_string(plan_.precision)},
  };
  checkpoint.meta.update(optimization_.meta(config_.lr_schedule));
  if (budget_) checkpoint.meta["time_budget"] = budget_json(*budget_);
  if (scaler_) checkpoint.meta["grad_scaler"] = scaler_->state();
  if (data::is_sprite_dataset(config_.dataset))
    checkpoint.meta["sprites"] = data::sprite_options_json(config_.sprites);
  checkpoint.model = model_state(task_.module());
  checkpoint.optimizer = optimizer_->state();
  task_.save(checkpoint);
  return checkpoint;
}

// The budget is the whole run's training time: the seconds trained before the checkpoint count
// against it (train_seconds_now starts from them). The same budget keeps the plan until this
// process has timed its own steps (another machine, another load: its speed is not the plan's),
// then revises it from them, after kBudgetSkipSteps + kBudgetTimedSteps steps, and kBudgetRevisions
// times more as a fresh run does. Another --time-budget revises the plan at once, at the plan's
// speed, so that a smaller one is not overrun while this process times its steps.
void TrainingRun::continue_budget_plan() {
  if (!budget_) return;
  budget_->steps = steps_planned(budget_->epochs);
  budget_->revised_at_step = 0;
  if (replan_budget_) {
    // At an epoch's end no epoch is in progress: a budget already spent leaves none to train.
    const int64_t in_progress = resumed_within_ > 0 ? start_epoch_ : start_epoch_ - 1;
    const BudgetInput in{config_.time_budget_s,
                         resumed_train_seconds_,
                         budget_->seconds_per_step,
                         resumed_within_,
                         steps_,
                         start_epoch_,
                         in_progress,
                         budget_->max_epochs};
    budget_ = revise_budget_plan(*budget_, in, budget_->timed_steps);
    budget_->steps = steps_planned(budget_->epochs);
    budget_->revised_at_step = 0;
    epochs_ = budget_->epochs;
  }
  max_revisions_ = budget_->revisions + 1 + kBudgetRevisions;
  const int64_t timed_at = kBudgetSkipSteps + kBudgetTimedSteps;
  next_revision_ = timed_at < budget_->steps ? timed_at : 0;
}

void TrainingRun::follow_budget(int64_t epoch) {
  if (steps_done_ == kBudgetSkipSteps) budget_clock_start_ = train_seconds_now();
  const bool plan_now = !budget_ && steps_done_ == kBudgetSkipSteps + kBudgetTimedSteps;
  const bool revise_now = budget_ && next_revision_ > 0 && steps_done_ == next_revision_;
  if (!plan_now && !revise_now) return;
  const double now = train_seconds_now();
  const int64_t timed = steps_done_ - kBudgetSkipSteps;
  const BudgetInput in{config_.time_budget_s,
                       now,
                       (now - budget_clock_start_) / static_cast<double>(timed),
                       resumed_within_ + steps_done_,
                       steps_,
                       start_epoch_,
                       epoch,
                       budget_ ? budget_->max_epochs : epochs_};
  BudgetPlan plan;
  if (revise_now) {
    plan = revise_budget_plan(*budget_, in, timed);
  } else {
    plan.budget_s = config_.time_budget_s;
    plan.timed_steps = timed;
    plan.seconds_per_step = in.seconds_per_step;
    plan.max_epochs = epochs_;
    plan.epochs = epochs_within_budget(in);
    plan.spent = now >= config_.time_budget_s;
  }
  // ddp: every rank runs rank 0's plan (their clocks differ; their epochs must not).
  plan.epochs = static_cast<int64_t>(
      parallel_.sum({parallel_.is_main() ? static_cast<double>(plan.epochs) : 0.0})[0]);
  plan.revised_at_step = revise_now ? steps_done_ : 0;
  adopt_plan(plan, /*revisable=*/true);
}

void TrainingRun::end_spent_budget(int64_t epoch) {
  if (config_.time_budget_s <= 0 || budget_ || epoch + 1 >= epochs_) return;
  const double now = train_seconds_now();
  const bool spent = parallel_.is_main() && now >= config_.time_budget_s;
  if (parallel_.sum({spent ? 1.0 : 0.0})[0] == 0) return;
  // The speed of the steps timed so far, or of every step when none was timed yet.
  const int64_t timed = std::max<int64_t>(steps_done_ - kBudgetSkipSteps, 0);
  BudgetPlan plan;
  plan.budget_s = config_.time_budget_s;
  plan.timed_steps = timed;
  plan.seconds_per_step = timed > 0 ? (now - budget_clock_start_) / static_cast<double>(timed)
                                    : (now - resumed_train_seconds_) /
                                          static_cast<double>(std::max<int64_t>(steps_done_, 1));
  plan.max_epochs = epochs_;
  plan.epochs = epoch + 1;
  plan.spent = true;
  adopt_plan(plan, /*revisable=*/false);
}

void TrainingRun::adopt_plan(BudgetPlan plan, bool revisable) {
  plan.steps = steps_planned(plan.epochs);
  // A plan shorter than the warm-up (check_warmup saw the longest run, --epochs): its lr never
  // reaches --lr, which the plan's line says.
  const int64_t warmup = optimization_.schedule.warmup_steps;
  const int64_t total = global_step(plan.epochs, 0);  // the schedule counts every step of the run
  plan.warmup_steps = warmup > 0 && warmup > total ? warmup : 0;
  plan.warmup_lr_share =
      plan.warmup_steps > 0 ? static_cast<double>(total) / static_cast<double>(warmup) : 1.0;
  epochs_ = plan.epochs;
  budget_ = plan;
  next_revision_ = revisable ? next_budget_revision(plan, steps_done_, max_revisions_) : 0;
  observer_->on_plan(plan);
}

void TrainingRun::set_up_thread_governor() {
  const bool given = config_.threads > 0 || config_.blas_threads > 0 || config_.step_threads > 0;
  const auto mode = config_.thread_governor;
  if (!device_.is_cpu() || parallel_.distributed() || mode == ThreadGovernorMode::kOff || given)
    return;
  std::function<void(int)> set;
  int max = 1;
  std::string what;
  bool same_bits = false;  // the results do not depend on the thread count
  if (auto pool = step_->thread_pool(); pool && pool->size() > 1) {
    max = pool->size();
    set = [pool](int threads) { pool->set_threads(threads); };
    what = "the step's " + std::to_string(max) + " threads";
    same_bits = true;  // the shards stay; only the threads that run them change
  } else if (threads_.intra_op > 1) {
    max = threads_.intra_op;
    set = [](int threads) { at::set_num_threads(threads); };
    what = "the " + std::to_string(max) + " intra-op threads";
  } else if (threads_.blas > 1) {
    max = threads_.blas;
    set = [](int threads) { set_blas_threads(threads); };
    what = "the " + std::to_string(max) + " BLAS threads";
  }
  if (max < 2) {
    if (mode == ThreadGovernorMode::kOn)
      governor_note_ = "off: this run has one CPU thread, none to take away";
    return;
  }
  if (!same_bits && mode == ThreadGovernorMode::kAuto) {
    governor_note_ = "off: " + what +
                     " split this model's sums, so fewer would change its last bits "
                     "(--thread-governor on: fewer while other processes take the cores)";
    return;
  }
  governor_ = std::make_unique<ThreadGovernor>(max, std::move(set));
  if (!governor_->active()) {  // no /proc/stat
    governor_.reset();
    governor_note_ = "off: the CPUs' load cannot be read here (/proc/stat)";
    return;
  }
  governor_note_ = what + ": fewer while other processes take the cores" +
                   (same_bits ? ", same results" : ", last bits then vary") +
                   " (--thread-governor off keeps them)";
}

double TrainingRun::train_seconds_now() const {
  return resumed_train_seconds_ + task_.setup_train_seconds() + run_timer_->seconds() -
         eval_seconds_ - sample_seconds_;
}

bool TrainingRun::evaluate_point(int64_t epoch, int64_t step, bool keep_predictions) {
  bool reached = false;
  if (parallel_.is_main() && test_path_.loader) {
    EvalPoint point;
    point.train_seconds = train_seconds_now();
    point.step = start_steps_ + steps_done_;
    point.epoch = static_cast<double>(epoch) +
                  static_cast<double>(step) / static_cast<double>(std::max<int64_t>(steps_, 1));
    DeviceTimer eval_timer(device_);
    last_test_ = task_.evaluate(*test_path_.loader, keep_predictions);
    eval_seconds_ += eval_timer.seconds();
    check_test_loss(last_test_->loss, epoch, "at step " + std::to_string(point.step));
    point.loss = last_test_->loss;
    point.accuracy = last_test_->accuracy;
    point.has_accuracy = traits_.has_accuracy;
    evals_.push_back(point);
    if (config_.target_accuracy > 0 && !target_reached_ &&
        point.accuracy >= config_.target_accuracy) {
      target_reached_ = point;
      reached = true;
    }
  }
  if (config_.target_accuracy <= 0 || !config_.stop_at_target) return false;
  if (!parallel_.distributed()) return reached;
  return parallel_.sum({reached ? 1.0 : 0.0})[0] > 0;  // rank 0 decides for all
}

Error TrainingRun::diverged(const std::string& what, int64_t epoch,
                            const std::string& where) const {
  std::string hint;
  if (!last_good_.empty())
    hint = "last good checkpoint: " + last_good_ + " (--resume it)";
  else if (!config_.resume.empty())
    hint = "the last good state is the checkpoint this run resumed from: " + config_.resume;
  else if (config_.checkpoint_every > 0 || config_.keep_last > 0)
    hint = "no checkpoint was known good before it";
  else
    hint = "no checkpoint was written (--checkpoint-every N saves the run as it goes)";
  if (!unconfirmed_.empty())
    hint += "; " + unconfirmed_ + " was written after the last finite loss and may hold the " +
            "diverging weights";
  // Decoupled weight decay scales the weights by (1 - lr * decay) each step: at 1 or more the
  // decay alone overshoots, whatever the gradients.
  hint += config_.weight_decay * config_.lr >= 1 ? "; lower --weight-decay (times --lr it is 1 "
                                                   "or more)"
                                                 : "; lower --lr";
  return Error(
      "training diverged: " + what + " in epoch " + std::to_string(epoch + 1) + ", " + where, hint);
}

// The last update can be the one that blows the weights up, after the last loss was computed: the
// test set's loss is the first to see it (or huge but finite weights whose outputs overflow).
void TrainingRun::check_test_loss(double loss, int64_t epoch, const std::string& where) const {
  if (!std::isfinite(loss))
    throw diverged(
        "the test set's loss is " + loss_text(loss) + " (the model's outputs are not " + "finite)",
        epoch, where);
}

Error TrainingRun::step_failed(int64_t epoch, int64_t step, const torch::Tensor& inputs,
                               int64_t samples, const std::string& message) const {
  return Error("epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(step + 1) +
                   ": the training step failed on a batch of shape " + c10::str(inputs.sizes()) +
                   ": " + first_line(message),
               samples < config_.batch_size
                   ? "it was the epoch's last batch, of " + std::to_string(samples) +
                         " samples: drop_last (--drop-last) leaves a partial batch out"
                   : "the model's forward or loss fails on this batch");
}

RunState TrainingRun::summed_over_ranks(RunState progress) {
  if (!parallel_.distributed()) return progress;
  const auto sums = parallel_.sum(
      {progress.loss_sum.item<double>(), static_cast<double>(progress.correct.item<int64_t>()),
       static_cast<double>(progress.samples), progress.interval_loss.item<double>(),
       static_cast<double>(progress.interval_samples)});
  progress.loss_sum = torch::full({}, sums[0], progress.loss_sum.options());
  progress.correct = torch::full({}, static_cast<int64_t>(sums[1]), progress.correct.options());
  progress.samples = static_cast<int64_t>(sums[2]);
  progress.interval_loss = torch::full({}, sums[3], progress.interval_loss.options());
  progress.interval_samples = static_cast<int64_t>(sums[4]);
  return progress;
}

namespace {

// The training data as this rank holds it: its shape and type, and a digest of its labels and of
// 64 images spread over it. A folder read at another --size or --resize, other files under the
// same name, or procedural sprites of another --sprite-seed differ here, not only in their count.
std::string training_data_digest(const data::Dataset& train) {
  if (!train.inputs.defined()) return "none";
  const int64_t n = train.size();
  const torch::Tensor picks = torch::linspace(0, static_cast<double>(std::max<int64_t>(n - 1, 0)),
                                              std::min<int64_t>(n, 64), torch::kDouble)
                                  .to(torch::kLong);
  const torch::Tensor images =
      train.inputs.index_select(0, picks.to(train.inputs.device())).contiguous().cpu();
  std::string bytes(static_cast<const char*>(images.data_ptr()), images.nbytes());
  if (train.labels.defined()) {
    const torch::Tensor labels = train.labels.contiguous().cpu();
    bytes.append(static_cast<const char*>(labels.data_ptr()), labels.nbytes());
  }
  return c10::str(train.inputs.sizes(), " ", train.inputs.scalar_type(), " #",
                  settings_hash(bytes));
}

}  // namespace

RunSettings TrainingRun::settings_ranks_share() const {
  auto number = [](double value) {
    std::ostringstream s;
    s << std::setprecision(17) << value;
    return s.str();
  };
  std::string shapes;  // what broadcast_model sends, in its order
  int64_t values = 0;
  for (const auto& p : task_.module().parameters()) {
    shapes += c10::str(p.sizes()) + " ";
    values += p.numel();
  }
  shapes += "| ";
  for (const auto& b : task_.module().buffers()) shapes += c10::str(b.sizes()) + " ";
  const std::string resumed_at = "epoch " + std::to_string(start_epoch_) + ", step " +
                                 std::to_string(run_state_ ? run_state_->step : 0) + " of " +
                                 std::to_string(start_steps_);
  const std::string model = config_.model.empty() ? default_model(config_) : config_.model;
  // Every setting that decides a collective's size or count, the batches, or the arithmetic.
  return {
      {"spritetorch version", SPRITETORCH_VERSION},
      {"--task", task_.name()},
      {"--model", model.substr(0, model.find(':'))},  // a script's path may differ
      {"parameters", std::to_string(values) + " values, shapes #" + settings_hash(shapes)},
      {"--dataset (kind)", config_.dataset.substr(0, config_.dataset.find(':'))},
      {"training samples (--train-limit)", std::to_string(data_.train.size())},
      {"training data", training_data_digest(data_.train)},
      {"--batch-size", std::to_string(config_.batch_size)},
      {"--epochs", std::to_string(epochs_)},
      {"--time-budget", number(config_.time_budget_s)},
      {"--seed", std::to_string(config_.seed)},
      {"--lr", number(config_.lr)},
      {"--optimizer", config_.optimizer},
      {"--momentum", number(config_.momentum)},
      // As the run applies them: a default given or left out is the same setting.
      {"--weight-decay", number(optimization_.options.weight_decay)},
      {"--lr-schedule", config_.lr_schedule},
      {"--warmup-steps", std::to_string(config_.warmup_steps)},
      {"--precision", precision::to_string(plan_.precision)},
      {"--clip-grad-norm", number(config_.clip_grad_norm)},
      {"--label-smoothing", number(config_.label_smoothing)},
      {"--first-conv", config_.first_conv},
      {"--prediction", config_.prediction},
      {"--noise-schedule", config_.noise_schedule},
      {"--min-snr-gamma", number(config_.min_snr_gamma)},
      {"--augment", config_.augment},
      {"--drop-last", config_.drop_last ? "on" : "off"},
      {"--class-sampling", choice_name(config_.class_sampling)},
      {"--step", choice_name(config_.step)},
      {"--micro-batches", std::to_string(config_.micro_batches)},
      {"--log-every", std::to_string(config_.log_every)},
      {"--checkpoint-every", std::to_string(config_.checkpoint_every)},
      {"--eval-every-steps", std::to_string(config_.eval_every_steps)},
      {"--target-accuracy", number(config_.target_accuracy)},
      {"--stop-at-target", config_.stop_at_target ? "on" : "off"},
      {"--bucket-mb", number(config_.bucket_mb)},
      {"--no-overlap", config_.overlap ? "off" : "on"},
      {"--dist-shard", choice_name(config_.dist_shard)},
      {"--resume (where it starts)", resumed_at},
  };
}

// Written only when the loss since the last log and the weights are finite; known good once the
// losses after it are (losses_finite), so that a divergence names one whose weights train on.
std::string TrainingRun::save_run_checkpoint(RunState progress) {
  const double pending = progress.interval_loss.item<double>();
  const bool weights_finite = finite_weights();
  if (!std::isfinite(pending) || !weights_finite)
    throw diverged(
        weights_finite ? "loss is " + loss_text(pending) : std::string("weights are not finite"),
        progress.epoch, "at or before step " + std::to_string(progress.step));
  losses_finite();
  const int64_t steps = global_step(progress.epoch, progress.step);
  std::string path = periodic_checkpoint_path(run_base_, steps);
  IfExists existing = IfExists::kReplace;
  if (config_.checkpoint_every == 0 && config_.keep_last == 0 && !config_.overwrite &&
      !(!config_.resume.empty() && same_file(path, config_.resume))) {
    path = unused_checkpoint_path(path);  // another run's file may have this name
    existing = IfExists::kKeep;           // or have it by the time this one is written
  }
  if (!parallel_.is_main()) return path;  // ddp: ranks are identical; rank 0 writes
  capture_rng(progress, device_);
  progress.train_seconds = train_seconds_now();
  Checkpoint checkpoint = make_checkpoint(progress.epoch, steps);
  store_run_state(progress, checkpoint);
  try {
    save_checkpoint(path, checkpoint, existing);
  } catch (const Error& e) {
    // A full disk must not cost the steps since the last checkpoint: the temp folder, as for the
    // final --save. The older checkpoints are not pruned: they are the ones on the disk asked for.
    const std::string rescue = rescue_path(path);
    try {
      save_checkpoint(rescue, checkpoint, IfExists::kKeep);
    } catch (const Error&) {
      throw IncompleteRun(
          std::string(e.what()) + "; the run's state at epoch " +
              std::to_string(progress.epoch + 1) + ", step " + std::to_string(progress.step) +
              " could not be saved to " + rescue + " either",
          last_good_.empty() ? make_room_hint(e.what()) + " and train again"
                             : "the newest checkpoint written: " + last_good_ + " (--resume it)");
    }
    rescued_ = Rescued{path, e.what()};
    return rescue;
  }
  unconfirmed_ = path;
  if (!tidied_periodic_) {
    tidied_periodic_ = true;
    remove_dead_periodic_temporaries(run_base_);
  }
  prune_periodic_checkpoints(run_base_, config_.keep_last, steps, last_good_);
  return path;
}

EpochReport TrainingRun::train_epoch(int64_t epoch) {
  task_.module().train();
  DeviceTimer epoch_timer(device_);
  const double evaluated_before = eval_seconds_;
  data::Loader& loader = *train_path_.loader;
  loader.start_epoch(epoch);
  data::Batch batch;
  // The epoch so far; its tensors are accumulated on the device and read at log intervals and at
  // the end of the epoch only.
  RunState progress;
  if (run_state_ && run_state_->epoch == epoch) {  // resuming mid-epoch: skip the batches done
    progress = *run_state_;
    run_state_.reset();
    // The checkpoint's sums are all ranks' (summed_over_ranks): rank 0 carries them on.
    if (!parallel_.is_main()) {
      const RunState zero = epoch_start(epoch, device_);
      progress.loss_sum = zero.loss_sum;
      progress.correct = zero.correct;
      progress.interval_loss = zero.interval_loss;
      progress.samples = progress.interval_samples = 0;
    }
    for (int64_t skipped = 0; skipped < progress.step; ++skipped)
      if (!loader.next(batch))
        throw DataError(config_.resume, "at most " + std::to_string(steps_) + " steps per epoch",
                        "step " + std::to_string(progress.step));
  } else {
    progress = epoch_start(epoch, device_);
  }
  const int64_t restored_samples = progress.samples;  // trained before the checkpoint
  int64_t& step = progress.step;
  while (loader.next(batch)) {
    if (step == 0)
      device::expect_on_device(batch.inputs, optimizer_->values().device(), "the training batch",
                               "the model");
    const int64_t b = batch.labels.size(0);
    if (augment_.enabled()) batch.inputs = data::augment_batch(batch.inputs, augment_);
    optimization_.set_step_lr(*optimizer_, global_step(epoch, step), epoch,
                              global_step(epochs_, 0));
    try {
      if (graph_step_) {
        graph_step_->run(batch, progress.interval_loss, progress.correct);
      } else {
        if (!step_->overwrites_grads()) optimizer_->zero_grad();
        step_->run(batch, progress.interval_loss, progress.correct);
        parallel_.reduce_gradients();  // ddp: averaged gradients before unscaling / clipping
        // fp16 on CUDA: the skip-on-inf decision stays on the device (no sync per step).
        finish_step(*optimizer_, scaler_.get(), config_.clip_grad_norm,
                    /*on_device=*/scaler_ != nullptr && device_.is_cuda());
      }
      task_.after_optimizer_step();
    } catch (const c10::OutOfMemoryError& e) {
      throw out_of_memory(e, config_, epoch, step, [&] { return save_run_checkpoint(progress); });
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      if (!users_module_ || is_host_allocation_failure(message))
        throw;  // a bug of ours, or a host allocation (main says how much)
      throw step_failed(epoch, step, batch.inputs, b, message);
    } catch (const Error&) {
      throw;  // ours, already saying what failed
    } catch (const std::bad_alloc&) {
      throw;  // main says how much
    } catch (const std::exception& e) {
      // A user's forward or loss may throw its own std::runtime_error rather than TORCH_CHECK's.
      if (!users_module_) throw;
      throw step_failed(epoch, step, batch.inputs, b, e.what());
    }
    progress.interval_samples += b;
    progress.samples += b;
    ++step;
    ++steps_done_;
    if (governor_) governor_->after_step(start_steps_ + steps_done_);
    if (config_.time_budget_s > 0 && (!budget_ || next_revision_ > 0)) follow_budget(epoch);
    observer_->on_step(
        {epoch + 1, epochs_, step, steps_, progress.samples, start_steps_ + steps_done_});
    if (config_.log_every > 0 && step % config_.log_every == 0) {
      const auto interval = parallel_.sum(
          {progress.interval_loss.item<double>(), static_cast<double>(progress.interval_samples)});
      const double mean = interval[0] / interval[1];
      if (!std::isfinite(mean))
        throw diverged("loss is " + loss_text(mean), epoch,
                       config_.log_every == 1
                           ? "step " + std::to_string(step)
                           : "steps " + std::to_string(step - config_.log_every + 1) + "-" +
                                 std::to_string(step));
      losses_finite();
      observer_->on_log(
          {epoch + 1, step, steps_, mean, optimizer_->options().lr, start_steps_ + steps_done_});
      progress.loss_sum += progress.interval_loss;
      progress.interval_loss.zero_();
      progress.interval_samples = 0;
    }
    // Within the epoch: its end is run()'s.
    if (config_.eval_every_steps > 0 && step < steps_ &&
        global_step(epoch, step) % config_.eval_every_steps == 0) {
      const size_t points_before = evals_.size();
      const bool stop = evaluate_point(epoch, step, config_.stop_at_target);
      if (evals_.size() > points_before)  // rank 0 with a test set: a point of the test curves
        observer_->on_eval(evals_.back(), {epoch + 1, epochs_, step, steps_, progress.samples,
                                           start_steps_ + steps_done_});
      task_.module().train();
      if (stop) {
        stop_ = true;
        stopped_within_ = summed_over_ranks(progress);  // each rank stops here: a collective
        break;
      }
    }
    const int signal = parallel_.agreed_interrupt(interrupt_signal(), global_step(epoch, step));
    if (signal || (config_.checkpoint_every > 0 &&
                   global_step(epoch, step) % config_.checkpoint_every == 0)) {
      const std::string path = save_run_checkpoint(summed_over_ranks(progress));
      if (signal) {
        Interrupted stopped(signal, path, epoch + 1, step, parallel_.is_main());
        if (rescued_) stopped.saved_elsewhere(rescued_->wanted, rescued_->why);
        throw stopped;
      }
      // A periodic checkpoint that did not fit: the run stops while its state is safe.
      if (rescued_)
        throw IncompleteRun(
            rescued_->why + "; the run stopped at epoch " + std::to_string(epoch + 1) + ", step " +
                std::to_string(step) + " and its state was saved to " + path + " instead",
            make_room_hint(rescued_->why) + ", then resume: mv " + path + " " + rescued_->wanted +
                " and add --resume " + rescued_->wanted + " to the command");
    }
  }
  progress.loss_sum += progress.interval_loss;
  // Over all ranks: loss sum, correct count, samples, samples trained by this process.
  const auto totals = parallel_.sum({progress.loss_sum.item<double>(),
                                     static_cast<double>(progress.correct.item<int64_t>()),
                                     static_cast<double>(progress.samples),
                                     static_cast<double>(progress.samples - restored_samples)});
  EpochReport er;
  er.epoch = epoch + 1;
  er.epochs = epochs_;
  er.samples = static_cast<int64_t>(totals[2]);
  er.loss = totals[0] / static_cast<double>(std::max<int64_t>(er.samples, 1));
  er.accuracy = totals[1] / static_cast<double>(std::max<int64_t>(er.samples, 1));
  er.has_accuracy = traits_.has_accuracy;
  er.seconds = epoch_timer.seconds() - (eval_seconds_ - evaluated_before);
  if (stop_ && last_test_) {  // stopped within the epoch: its newest evaluation
    er.has_test = true;
    er.test_loss = last_test_->loss;
    er.test_accuracy = last_test_->accuracy;
  }
  er.global_step = start_steps_ + steps_done_;
  // Resumed at the epoch's last step, this process trained none of it: 0, not 0 / 0.
  er.images_per_second = totals[3] > 0 ? totals[3] / er.seconds : 0;
  if (!std::isfinite(er.loss))
    throw diverged("loss is " + loss_text(er.loss), epoch,
                   "by its end (step " + std::to_string(step) + ")");
  losses_finite();
  return er;
}

TrainReport TrainingRun::run() {
  set_up_thread_governor();
  TrainReport report;
  report.task = task_.name();
  report.device = device::display_name(device_);
  report.start_epoch = start_epoch_;
  report.class_names = data_.train.class_names;
  report.settings = describe();
  report.main_rank = parallel_.is_main();
  report.has_accuracy = traits_.has_accuracy;
  observer_->on_start(report.device, report.settings);

  device::reset_peak_memory(device_);
  run_timer_.emplace(device_);
  if (run_state_) restore_rng(*run_state_, device_, config_.resume);
  // From here a stop request (SIGINT / SIGTERM in the CLI) ends the run after the current step
  // with a checkpoint; the application's hooks run now (train/interrupt.h).
  LoopScope loop_scope;
  const bool has_test = test_path_.loader != nullptr;
  int64_t epochs_done = -1;               // set when the run stops early
  int64_t last_epoch_run = start_epoch_;  // its index, for the final checks' messages
  for (int64_t epoch = start_epoch_; epoch < epochs_; ++epoch) {
    last_epoch_run = epoch;
    EpochReport er = train_epoch(epoch);
    end_spent_budget(epoch);  // this epoch may be the last
    er.epochs = epochs_;
    const bool stopped_within = stop_;
    // The test set after this epoch, for the test curves: rank 0 only, outside train_seconds. The
    // last epoch's evaluation is the final one (with predictions): no second pass.
    bool last_epoch = epoch + 1 == epochs_ || stop_;
    const int64_t end_step = global_step(epoch + 1, 0);
    const bool due = last_epoch ||
                     (config_.eval_every > 0 && (epoch + 1) % config_.eval_every == 0) ||
                     config_.target_accuracy > 0 ||
                     (config_.eval_every_steps > 0 && end_step % config_.eval_every_steps == 0);
    if (has_test && due && !stopped_within) {
      stop_ = evaluate_point(epoch, steps_, last_epoch || config_.stop_at_target);
      last_epoch = last_epoch || stop_;
      if (last_test_) {
        er.has_test = true;
        er.test_loss = last_test_->loss;
        er.test_accuracy = last_test_->accuracy;
      }
    }
    report.epochs.push_back(er);
    observer_->on_epoch(er);
    if (parallel_.is_main()) {  // e.g. sample sheets: outside the timed training
      DeviceTimer hook_timer(device_);
      task_.on_epoch_end(epoch, last_epoch, *observer_);
      sample_seconds_ += hook_timer.seconds();
    }
    if (stop_) {
      epochs_done = stopped_within ? epoch : epoch + 1;
      break;
    }
  }
  if (epochs_done < 0) epochs_done = std::max(epochs_, start_epoch_);
  report.train_seconds = train_seconds_now();
  report.peak_memory = device::peak_memory(device_);
  if (governor_) {
    report.thread_changes = governor_->changes();
    governor_->restore();
  }
  report.budget = budget_;
  report.eval_seconds = eval_seconds_;
  report.sample_seconds = sample_seconds_;
  report.steps = start_steps_ + steps_done_;
  report.evals = evals_;
  report.target_reached = target_reached_;
  report.stopped_at_target = stop_;
  parallel_.check_in_sync(*optimizer_);
  // The last update may be the one that blew up, after the last loss was computed: no model with
  // non-finite weights is saved (an --overwrite'n good one stays), on any rank.
  if (!finite_weights())
    throw diverged("weights are not finite", last_epoch_run,
                   "after its last step (" + std::to_string(report.steps) + ")");
  if (!parallel_.is_main()) return report;  // rank 0 evaluates, reports and saves

  if (has_test) {
    report.has_test = true;
    // The newest evaluation is the final one when it came after the last step (predictions kept).
    const bool current = !evals_.empty() && evals_.back().step == report.steps && last_test_ &&
                         last_test_->predictions.defined();
    report.test = current ? std::move(*last_test_) : task_.evaluate(*test_path_.loader, true);
    check_test_loss(report.test.loss, last_epoch_run,
                    "after its last step (" + std::to_string(report.steps) + ")");
    report.misclassified = pick_misclassified(data_.test, report.test.predictions);
  }
  losses_finite();  // the final weights' losses are: --keep-last keeps its count again
  if (!last_good_.empty())
    prune_periodic_checkpoints(run_base_, config_.keep_last, report.steps, last_good_);
  if (!config_.save.empty()) {
    Checkpoint checkpoint = make_checkpoint(epochs_done, report.steps);
    checkpoint.meta["train_seconds"] = report.train_seconds;
    // The RNG as it stands, so that a run resumed from here (more --epochs) draws what one longer
    // run would have: dropout, a generator's timesteps and noise. Stopped at a target within an
    // epoch: the epoch's place too, as a periodic checkpoint has it.
    RunState at_end = stopped_within_ ? *stopped_within_ : epoch_start(epochs_done, device_);
    capture_rng(at_end, device_);
    at_end.train_seconds = report.train_seconds;
    store_run_state(at_end, checkpoint);
    try {
      save_checkpoint(config_.save, checkpoint, save_existing_);
    } catch (const Error& e) {
      // The run is done: a disk that filled up or a folder removed meanwhile must not lose it.
      const std::string rescue = rescue_path(config_.save);
      try {
        save_checkpoint(rescue, checkpoint, IfExists::kKeep);
      } catch (const Error&) {
        throw IncompleteRun(std::string(e.what()) + "; the trained model could not be saved to " +
                                rescue + " either",
                            make_room_hint(e.what()) + " and train again");
      }
      throw IncompleteRun(
          std::string(e.what()) + "; the trained model was saved to " + rescue + " instead",
          "move it where it belongs: mv " + rescue + " " + config_.save);
    }
  }
  return report;
}

}  // namespace

Trainer::Trainer(TrainConfig options) : options_(std::move(options)) {}

nlohmann::json peak_memory_json(const device::PeakMemory& peak) {
  return {{"bytes", peak.bytes}, {"what", peak.what}};
}

nlohmann::json thread_changes_json(const std::vector<ThreadChange>& changes) {
  auto out = nlohmann::json::array();
  for (const auto& c : changes)
    out.push_back(
        {{"step", c.step}, {"from", c.from}, {"threads", c.threads}, {"others_cpus", c.others}});
  return out;
}

std::vector<torch::Tensor> trainable_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  bool any = false;
  for (const auto& p : module.parameters()) {
    any = true;
    if (p.requires_grad()) out.push_back(p);
  }
  if (any && out.empty())
    throw Error("every parameter of the model has requires_grad false: there is nothing to train");
  return out;
}

namespace {

std::string shape_text(const torch::Tensor& t) { return c10::str(t.sizes()); }

// One split's tensors against each other and against the training split: a mismatch would read
// past a tensor's end in the loader (raw pointers) or fail deep in LibTorch after the training.
void check_split(const data::Dataset& d, const std::string& role, const data::Dataset* train) {
  const std::string name = "the " + role + " set '" + d.name + "'";
  if (!d.inputs.defined() || !d.labels.defined()) {
    if (role == "training") throw Error(name + " has no inputs or no labels");
    if (d.inputs.defined() || d.labels.defined())
      throw DataError(name, "inputs and labels, or neither (no test set)",
                      d.inputs.defined() ? "inputs but no labels" : "labels but no inputs");
    return;  // no test set
  }
  if (d.labels.dim() != 1 || d.labels.size(0) != d.inputs.size(0))
    throw DataError(
        name, "one label per sample: labels of shape (" + std::to_string(d.inputs.size(0)) + ")",
        "labels of shape " + shape_text(d.labels) + " for inputs of shape " + shape_text(d.inputs));
  if (!c10::isIntegralType(d.labels.scalar_type(), /*includeBool=*/false))
    throw DataError(name, "integer class indices as labels",
                    std::string(c10::toString(d.labels.scalar_type())) + " labels");
  if (d.inputs.scalar_type() != torch::kUInt8 && d.inputs.scalar_type() != torch::kFloat32)
    throw DataError(name, "uint8 (0-255) or float32 inputs",
                    std::string(c10::toString(d.inputs.scalar_type())) + " inputs");
  if (d.size() > 0 && !d.class_names.empty()) {
    const int64_t low = d.labels.min().item<int64_t>(), high = d.labels.max().item<int64_t>();
    const int64_t classes = d.num_classes();
    if (low < 0 || high >= classes)
      throw DataError(name,
                      "labels in 0.." + std::to_string(classes - 1) + " (its " +
                          std::to_string(classes) + " class names)",
                      "label " + std::to_string(low < 0 ? low : high));
  }
  if (!train) return;
  if (d.size() > 0 && d.inputs.sizes().slice(1) != train->inputs.sizes().slice(1))
    throw DataError(
        name, "samples of the training set's shape " + c10::str(train->inputs.sizes().slice(1)),
        "samples of shape " + c10::str(d.inputs.sizes().slice(1)));
  if (d.size() > 0 && d.class_names != train->class_names)
    throw DataError(
        name,
        "the training set's " + std::to_string(train->num_classes()) + " classes, named as there",
        std::to_string(d.num_classes()) + " classes named otherwise");
}

}  // namespace

namespace {

// The values the CLI's flags refuse, refused here too: a library caller fills TrainConfig itself.
void check_config_values(const TrainConfig& o) {
  if (o.epochs < 0) throw Error("--epochs must be >= 0");
  if (o.batch_size <= 0) throw Error("--batch-size must be positive");
  auto at_least_zero = [](const char* option, double value) {
    if (!(value >= 0) || !std::isfinite(value))
      throw Error(std::string(option) + " must be a number >= 0, got " + c10::str(value));
  };
  at_least_zero("--clip-grad-norm (clip_grad_norm)", o.clip_grad_norm);
  at_least_zero("--time-budget (time_budget_s)", o.time_budget_s);
  const std::pair<const char*, int64_t> counts[] = {
      {"--log-every (log_every)", o.log_every},
      {"--eval-every (eval_every)", o.eval_every},
      {"--eval-every-steps (eval_every_steps)", o.eval_every_steps},
      {"--checkpoint-every (checkpoint_every)", o.checkpoint_every},
      {"--keep-last (keep_last)", o.keep_last},
      {"--train-limit (train_limit)", o.train_limit},
      {"--test-limit (test_limit)", o.test_limit},
      {"--threads (threads)", o.threads},
      {"--blas-threads (blas_threads)", o.blas_threads},
      {"--step-threads (step_threads)", o.step_threads}};
  for (const auto& [option, value] : counts)
    if (value < 0) throw Error(std::string(option) + " must be >= 0, got " + std::to_string(value));
  if (!(o.target_accuracy >= 0 && o.target_accuracy <= 1))
    throw Error("--target-accuracy (target_accuracy) must be in [0, 1] (0: none), got " +
                c10::str(o.target_accuracy));
}

}  // namespace

namespace {

// What a run sets for the whole process for its own sake: the CPU thread counts (LibTorch's and
// BLAS's), the default generators (seeded with --seed) and cuDNN's benchmark mode. Put back when
// fit() returns or throws, so that a program embedding the library keeps its own: its inference
// threads, its random stream. The CLI's process ends with the run; it loses nothing by it.
// Fits that overlap in several threads share the generators (LibTorch has one default generator
// per device), BLAS's count and cuDNN's mode: the first to start keeps the caller's and the last
// to end puts them back, and the later ones say that their seeds do not make them reproducible.
// LibTorch's own count is OpenMP's, one per calling thread: each fit puts back its thread's.
class CallerProcessState {
 public:
  CallerProcessState() : intra_op_threads_(at::get_num_threads()) {
    bool overlapping = false;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      overlapping = active_ > 0;
      if (!overlapping)  // (throwing here leaves the count as it was)
        saved_.reset(new Shared{current_cpu_threads().blas, save_process_rng(),
                                at::globalContext().benchmarkCuDNN()});
      ++active_;
    }
    if (overlapping)
      spritetorch::note(
          "another fit is running in this process: runs at once share LibTorch's default random "
          "generator and BLAS's threads, so their seeds do not reproduce their weights (fit one "
          "after another, or in separate processes, for that)");
  }
  ~CallerProcessState() {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::unique_ptr<Shared> saved = --active_ == 0 ? std::move(saved_) : nullptr;
    try {
      if (at::get_num_threads() != intra_op_threads_) at::set_num_threads(intra_op_threads_);
      if (!saved) return;
      if (saved->blas_threads > 0) set_blas_threads(saved->blas_threads);
      restore_process_rng(saved->rng);
      at::globalContext().setBenchmarkCuDNN(saved->cudnn_benchmark);
    } catch (const std::exception&) {  // best effort, maybe while another error is on its way out
    }
  }
  CallerProcessState(const CallerProcessState&) = delete;
  CallerProcessState& operator=(const CallerProcessState&) = delete;

 private:
  struct Shared {
    int blas_threads;
    ProcessRng rng;
    bool cudnn_benchmark;
  };
  const int intra_op_threads_;
  static std::mutex mutex_;
  static int active_;                     // fits running now, under mutex_
  static std::unique_ptr<Shared> saved_;  // the caller's, from before the first of them
};

std::mutex CallerProcessState::mutex_;
int CallerProcessState::active_ = 0;
std::unique_ptr<CallerProcessState::Shared> CallerProcessState::saved_;

}  // namespace

TrainReport Trainer::fit(Task& task, const Datasets& data, TrainObserver* observer) {
  check_config_values(options_);
  check_split(data.train, "training", nullptr);
  check_split(data.test, "test", &data.train);
  task.configure(options_);
  // Reliability: outputs are checked before any work.
  check_run_outputs(options_, run_checkpoint_base(options_));
  const CallerProcessState caller_state;
  // A caller's NoGradGuard or InferenceMode would leave nothing to differentiate.
  c10::InferenceMode no_inference_mode(false);
  torch::AutoGradMode grad_mode(true);
  // The run's config names the data it trains on: checkpoints record it and --resume compares it.
  TrainConfig config = options_;
  config.dataset = data.source.empty() ? kInMemoryDataset : data.source;
  TrainReport report = TrainingRun(config, task, data, observer).run();
  // The parameters' gradients were views of the run's flat buffer: the module's own again, so the
  // caller may zero them, use another optimizer or fit again.
  for (auto& p : task.module().parameters())
    if (p.grad().defined()) p.mutable_grad() = p.grad().clone();
  return report;
}

}  // namespace spritetorch::train
