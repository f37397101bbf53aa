// How the training work is split (the "strategy" axis, next to device and precision):
//   single — one process, one device;
//   ddp    — one process per device, started by `spritetorch launch`, torchrun or a Slurm wrapper
//            (distributed/dist_env.h); parameters broadcast from rank 0, the training data sharded
//            (data/distributed_sampler.h), gradients averaged by distributed::GradReducer, metrics
//            summed over ranks; only rank 0 evaluates, reports and writes checkpoints;
//   dp     — DataParallel: one process, each batch split over the visible GPUs (CUDA builds).
// auto = ddp when the process was started as a rank (RANK / WORLD_SIZE set), else single.
//
// For single, every method here is a no-op, so the trainer calls them unconditionally.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "distributed/communicator.h"
#include "distributed/dist_env.h"
#include "distributed/grad_reducer.h"
#include "models/classifier.h"
#include "train/config.h"
#include "train/flat_optimizer.h"
#include "train/train_step.h"

namespace spritetorch::train {

enum class StrategyKind { kSingle, kDataParallel, kDdp };

// The settings the ranks of a run must share, as (flag or name, value) pairs in a fixed order.
using RunSettings = std::vector<std::pair<std::string, std::string>>;
// A fixed number of bytes, so that ranks with other settings still exchange buffers of one size;
// names and values longer than fit are cut (hash long values: settings_hash).
constexpr size_t kRunSettingsBytes = 8192;
std::string encode_run_settings(const RunSettings& settings);  // at most kRunSettingsBytes
RunSettings decode_run_settings(const std::string& bytes);
// The index of the first entry of `mine` that differs from `root`'s (missing counts), or -1.
int first_differing_setting(const RunSettings& mine, const RunSettings& root);
// A short, stable digest of `text` (FNV-1a, 16 hex digits), for values too long to exchange.
std::string settings_hash(const std::string& text);

class ParallelRun {
 public:
  // Resolves --strategy and, for ddp, reads and validates the rank environment (no network yet).
  // Throws spritetorch::Error for a bad combination (dp without CUDA, bad env, ...).
  ParallelRun(const TrainConfig& config, const distributed::EnvLookup& env);
  ~ParallelRun();

  StrategyKind kind() const { return kind_; }
  bool distributed() const { return kind_ == StrategyKind::kDdp; }
  bool is_main() const { return env_.rank == 0; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }

  // The device for this rank: under ddp, "auto" / "cuda" become cuda:LOCAL_RANK.
  torch::Device pick_device(const std::string& text) const;
  // The cores this process may use: under ddp the ranks of one machine share its cores.
  int cores() const;
  // Rendezvous and process group (ddp only); call once the device is known.
  void connect(const torch::Device& device);

  // Before broadcast_model: every rank compares its settings with rank 0's (ddp only; one
  // fixed-size broadcast and one all-reduce, so that ranks started with other flags meet no
  // collective of another size first). Ranks with other settings would crash in Gloo (another model
  // or batch), wait out --dist-timeout (other --epochs), or train apart (another --lr or --seed):
  // every rank throws an Error naming the differing ranks and the first setting that differs.
  void check_same_settings(const RunSettings& mine);
  // Rank 0's parameters (the optimizer's flat buffer) and the model's buffers to every rank.
  void broadcast_model(torch::nn::Module& model, FlatOptimizer& optimizer);
  // Builds the gradient reducer and hooks it to autograd and to `step`.
  void attach(TrainStep& step, FlatOptimizer& optimizer, const std::vector<torch::Tensor>& params);
  // dp: the GPUs a batch is split over, cuda:0 first (empty otherwise).
  const std::vector<torch::Device>& data_parallel_devices() const { return dp_devices_; }
  // The training data this rank loads. ddp with local shards (--dist-shard): a fixed 1/R share of
  // `full`, kept alone (data::local_shard); otherwise `full` itself, with `options` set to take
  // this rank's share of every epoch's order. auto = local on CUDA, where device memory is what
  // runs out, and global elsewhere (batches identical to a single process's; docs/distributed.md).
  const data::Dataset& shard(const data::Dataset& full, data::LoaderOptions& options);
  // Set by connect(): this rank keeps only a fixed local shard of the training data.
  bool local_shards() const { return local_shards_; }
  // After backward, before the optimizer step: averaged gradients on every rank.
  void reduce_gradients();
  // The signal that stops the run after global step `step` (0: go on), given this process's own
  // pending signal. ddp: ranks must stop at the same step, or those still training would wait in
  // a collective for the stopped ones until --dist-timeout. So a signal is acted on only every
  // kInterruptCheckSteps steps, where the ranks exchange their pending signals and stop together
  // (SIGTERM wins over SIGINT). Single: `local_signal` at once.
  int agreed_interrupt(int local_signal, int64_t step);
  static constexpr int64_t kInterruptCheckSteps = 10;
  // Element-wise sums over ranks (identity for single).
  std::vector<double> sum(std::vector<double> values);
  // Throws when the ranks' parameters differ (a bug or a corrupted rank), after training.
  void check_in_sync(FlatOptimizer& optimizer);

  // The reducer of a ddp run after attach(); nullptr otherwise. For tests and reports.
  const distributed::GradReducer* reducer() const { return reducer_.get(); }

  // One settings row: "ddp, rank 0 of 2, gloo, buckets 1 x 25 MB, overlapped".
  std::string describe() const;

 private:
  StrategyKind kind_ = StrategyKind::kSingle;
  distributed::DistEnv env_;
  distributed::CommOptions comm_options_;
  distributed::ReducerOptions reducer_options_;
  bool overlap_off_for_micro_batches_ = false;  // --micro-batches: all-reduce after the last
  torch::Device device_ = torch::kCPU;
  std::vector<torch::Device> dp_devices_;
  DistShard dist_shard_ = DistShard::kAuto;
  bool local_shards_ = false;
  data::Dataset
      local_data_;  // local shards: this rank's share  // dp: every visible GPU, cuda:0 first
  std::shared_ptr<distributed::Communicator> comm_;
  std::unique_ptr<distributed::GradReducer> reducer_;
};

const std::vector<std::string>& strategy_names();  // auto, single, dp, ddp

}  // namespace spritetorch::train
