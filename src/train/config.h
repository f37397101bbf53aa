// Everything one training run needs to know; the CLI fills it from flags, tests fill it directly.
#pragma once

#include <cstdint>
#include <string>

#include "common/choice.h"
#include "data/data_path.h"
#include "data/fashion_mnist.h"
#include "data/sprite_sources.h"
#include "precision/precision.h"

namespace spritetorch::train {

// The closed choices of a run, typed; their names are the CLI's values (choices_of below).
enum class TaskKind { kClassify, kGenerate };                 // --task
enum class StepKind { kAuto, kAutograd, kFused };             // --step (train/train_step.h)
enum class Strategy { kAuto, kSingle, kDataParallel, kDdp };  // --strategy (train/parallel.h)
enum class DistBackend { kAuto, kGloo, kNccl };               // --dist-backend
enum class DistShard { kAuto, kGlobal, kLocal };              // --dist-shard
// --cuda-graphs / --no-cuda-graphs (train/cuda_graph_step.h). auto: capture the train step wherever
// that is valid (CUDA, resident data, one process, a task whose step is a fixed kernel sequence)
// and say why not elsewhere; on: capture or fail with the reason; off: eager.
enum class CudaGraphs { kAuto, kOn, kOff };
// --thread-governor (train/thread_governor.h): fewer CPU threads while other processes take the
// cores. auto: only where that leaves the results bit-identical (the fused step's shard pool); on:
// also LibTorch's intra-op and OpenBLAS's threads (conv nets: their last bits then depend on the
// load); off: the threads as set, for the whole run.
enum class ThreadGovernorMode { kAuto, kOn, kOff };
const Choices<TaskKind>& choices_of(TaskKind);                      // classify, generate
const Choices<StepKind>& choices_of(StepKind);                      // auto, autograd, fused
const Choices<Strategy>& choices_of(Strategy);                      // auto, single, dp, ddp
const Choices<DistBackend>& choices_of(DistBackend);                // auto, gloo, nccl
const Choices<DistShard>& choices_of(DistShard);                    // auto, global, local
const Choices<CudaGraphs>& choices_of(CudaGraphs);                  // auto, on, off
const Choices<ThreadGovernorMode>& choices_of(ThreadGovernorMode);  // auto, on, off

// The dataset a checkpoint records for data given to Trainer::fit without a source
// (Datasets::source): no dataset eval or a resume could load by name (they ask for --dataset),
// and not the config's default.
inline constexpr char kInMemoryDataset[] = "in-memory";

struct TrainConfig {
  std::string model;  // ann | cnn | simplenn | unet; empty: default_model (below)
  std::string dataset = "fashion-mnist";  // fashion-mnist | dummy | sprite sets | kInMemoryDataset
  std::string data_dir = data::kDefaultFashionMnistDir;
  std::string device = "auto";  // auto | cpu | cuda | cuda:N | mps
  int64_t epochs = 5;
  // --time-budget: seconds of training this run may take (0 = none). The Trainer plans how many
  // epochs fit from the speed of its first steps, at most `epochs` (train/time_budget.h).
  double time_budget_s = 0;
  int64_t batch_size = 64;
  double lr = 1e-3;
  std::string optimizer = "adam";        // adam | adamw | sgd (train/flat_optimizer.h)
  double momentum = 0.0;                 // sgd only
  double weight_decay = -1;              // < 0: the optimizer's default (adamw 0.01, the others 0)
  std::string lr_schedule = "constant";  // constant | cosine | step:E[:G] (train/lr_schedule.h)
  int64_t warmup_steps = 0;              // linear lr warm-up over the first N steps
  // Where warmup_steps came from when the user did not choose it ("--recipe fast", "--task
  // generate", "run.toml:12"): a warm-up that outlasts the run is then a settings note.
  // Empty: chosen, and such a warm-up is refused (the lr would never reach `lr`).
  std::string warmup_steps_origin;
  // Seeds 0-9 give 0.861-0.877 test accuracy on the seed workload (docs/benchmarks.md).
  uint64_t seed = 7;
  int64_t log_every = 200;  // steps between reads of the running loss (0 = per epoch)
  // load_datasets (train/trainer.h) applies the limits; Trainer::fit trains on the data given.
  // Sprite datasets: N of the split stratified by class (Dataset::spread): every class keeps one.
  int64_t train_limit = 0;       // use only the first N training samples (0 = all)
  int64_t test_limit = 0;        // evaluate on the first N test samples (0 = all)
  int64_t eval_every = 1;        // epochs between test evaluations, untimed (0 = final only)
  int64_t eval_every_steps = 0;  // also every N optimizer steps within epochs (0 = never)
  // Time to accuracy: a test accuracy to reach (0 = none). The test set is then also evaluated at
  // the end of every epoch; the first evaluation at or above it is the report's time to target.
  double target_accuracy = 0;
  bool stop_at_target = true;  // false: record the time to target and train the whole schedule
  // Classifiers (train/classifier_task.h): cross-entropy against labels smoothed by this much,
  // and the test-time augmentation the evaluations (and the checkpoint's users) apply.
  double label_smoothing = 0;
  std::string test_time_augment = "none";  // none | flip (mean of the image's and its mirror's)
  // learned | whitened (the first convolution fixed to whiten the training images' patches and
  // frozen: models/patch_whitening.h)
  std::string first_conv = "learned";
  std::string recipe;        // the --recipe the CLI filled defaults from (train/recipe.h); a record
  int64_t sample_every = 0;  // --task generate: epochs between sample sheets (0 = none)
  int threads = 0;           // CPU intra-op threads (0 = by model: common/cpu_threads.h)
  int blas_threads = 0;      // OpenBLAS threads (0 = by model: common/cpu_threads.h)
  bool drop_last = false;
  data::DataPathOptions data_path;  // resident vs streaming (--data-on, --workers, ...)
  std::string augment = "none";     // none | flip | shift[:N] | flip,shift[:N] (data/augment.h)
  data::ClassSampling class_sampling = data::ClassSampling::kNatural;  // data/loader.h
  StepKind step = StepKind::kAuto;
  // Each batch's forward and backward in this many chunks, one optimizer step after them: the
  // memory of a chunk, the gradient of the whole batch (models with batch statistics, BatchNorm,
  // see each chunk's). The autograd step only.
  int64_t micro_batches = 1;
  int step_threads = 0;  // fused step on the CPU: threads splitting each step (0: see trainer)
  // Given counts (threads, blas_threads, step_threads) are kept whatever this says.
  ThreadGovernorMode thread_governor = ThreadGovernorMode::kAuto;
  std::string save;    // checkpoint written after the last epoch
  std::string resume;  // checkpoint to continue from
  // How work is split (train/parallel.h, docs/distributed.md).
  Strategy strategy = Strategy::kAuto;
  DistBackend dist_backend = DistBackend::kAuto;  // auto: nccl on CUDA, else gloo
  double dist_timeout_s = 300;                    // rendezvous and every collective
  double bucket_mb = 25;                          // gradient all-reduce bucket size
  bool overlap = true;                      // all-reduce buckets during backward (--no-overlap)
  DistShard dist_shard = DistShard::kAuto;  // data/distributed_sampler.h
  // Mixed precision and CUDA graphs (docs/precision.md).
  precision::Precision precision = precision::Precision::kFp32;  // precision/precision.h
  double clip_grad_norm = 0.0;                 // clip the gradients' L2 norm to this (0 = off)
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;  // capture the train step as a CUDA graph
  bool channels_last = true;    // CNNs on CUDA and AVX2 CPUs: channels_last memory format
  bool cudnn_benchmark = true;  // CUDA: let cuDNN time its algorithms (fixed shapes)
  // Reliability (train/run_state.h, docs/reliability.md).
  int64_t checkpoint_every = 0;           // steps between periodic checkpoints (0 = none)
  int64_t keep_last = 0;                  // periodic checkpoints kept (0 = all)
  bool overwrite = false;                 // --save may replace an existing file
  TaskKind task = TaskKind::kClassify;    // tasks/make_task.h
  data::SpriteOptions sprites;            // sprites | folder: | sheet: | npy: datasets
  int64_t unet_base = 16;                 // --task generate: UNet channels at full resolution
  bool activation_checkpointing = false;  // recompute UNet blocks / CNN stages in backward
  // --task generate: the design (diffusion/generator_task.h GeneratorDesign; docs/sprites.md).
  int unet_attention = 1;                 // self-attention at S/4 (1), also at S/2 (2), none (0)
  bool unet_scale_shift = true;           // the embedding scales and shifts the blocks' norms
  std::string unet_mult = "1,2,2";        // UNet widths at S, S/2, S/4 (x unet_base)
  std::string prediction = "v";           // eps | v | x0
  std::string noise_schedule = "cosine";  // linear | cosine
  double min_snr_gamma = 5.0;             // 0: unweighted MSE
};

// The model a run trains when --model is not given (the one place this rule is written): the UNet
// for --task generate, the CNN for sprite datasets, the seed's MLP (ann) otherwise. A resumed run
// takes its checkpoint's model instead (train/classifier_task.h).
std::string default_model(const TrainConfig& config);

// --thread-governor on beside a given thread count (--threads, --blas-threads, --step-threads)
// would have nothing to lower: throws Error. The trainer checks it with the rest of its options;
// bench before its first row.
void check_thread_governor_counts(const TrainConfig& config);

}  // namespace spritetorch::train
