#include "train/parallel.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <sstream>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/fnv1a.h"
#include "data/distributed_sampler.h"
#include "device/device.h"

#if SPRITETORCH_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace spritetorch::train {

namespace {
constexpr char kNameEnd = '\x1f', kEntryEnd = '\x1e';  // ASCII unit and record separators
}  // namespace

std::string encode_run_settings(const RunSettings& settings) {
  std::string out;
  for (const auto& [name, value] : settings) {
    const std::string entry = name + kNameEnd + value + kEntryEnd;
    if (out.size() + entry.size() > kRunSettingsBytes) break;  // whole entries only
    out += entry;
  }
  return out;
}

RunSettings decode_run_settings(const std::string& bytes) {
  RunSettings out;
  const std::string text = bytes.substr(0, bytes.find('\0'));
  size_t at = 0;
  for (size_t end; (end = text.find(kEntryEnd, at)) != std::string::npos; at = end + 1) {
    const std::string entry = text.substr(at, end - at);
    const size_t split = entry.find(kNameEnd);
    if (split == std::string::npos) break;
    out.emplace_back(entry.substr(0, split), entry.substr(split + 1));
  }
  return out;
}

int first_differing_setting(const RunSettings& mine, const RunSettings& root) {
  for (size_t i = 0; i < mine.size(); ++i)
    if (i >= root.size() || mine[i] != root[i]) return static_cast<int>(i);
  return mine.size() < root.size() ? static_cast<int>(mine.size()) : -1;
}

std::string settings_hash(const std::string& text) {
  uint64_t h = fnv1a(text);
  static const char* kHex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[static_cast<size_t>(i)] = kHex[h & 15];
  return out;
}

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> kNames = choices_of(Strategy{}).names();
  return kNames;
}

ParallelRun::ParallelRun(const TrainConfig& config, const distributed::EnvLookup& env) {
  const Strategy s = config.strategy;
  if (s == Strategy::kDataParallel) {
#if SPRITETORCH_WITH_CUDA
    kind_ = StrategyKind::kDataParallel;
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (gpus == 0)
      throw Error("--strategy dp (DataParallel) needs CUDA GPUs; none is visible",
                  "check nvidia-smi and CUDA_VISIBLE_DEVICES, or train with --strategy single");
    for (int i = 0; i < gpus; ++i)
      dp_devices_.emplace_back(torch::kCUDA, static_cast<torch::DeviceIndex>(i));
    if (config.step == StepKind::kFused)
      throw Error(
          "--step fused cannot run under --strategy dp: DataParallel replicates the model "
          "and needs autograd's backward",
          "use --step auto or autograd");
    if (config.cuda_graphs == CudaGraphs::kOn)
      throw Error(
          "--cuda-graphs cannot be combined with --strategy dp: DataParallel replicates "
          "the model on every step, which a captured graph cannot do",
          "drop --cuda-graphs, or use ddp (one process per GPU)");
#else
    throw Error(
        "--strategy dp (DataParallel over several GPUs in one process) needs a CUDA build "
        "of spritetorch; this one is CPU-only",
        "for several processes on the CPU use --strategy ddp with spritetorch launch "
        "--nproc-per-node N -- train ...");
#endif
  }
  // One process's strategy in each of several ranks would train the same run N times over, each
  // writing the same checkpoint and run files.
  if (s != Strategy::kDdp && s != Strategy::kAuto && distributed::launched_as_rank(env)) {
    const int world = distributed::read_dist_env(env).world_size;
    if (world > 1)
      throw Error("--strategy " + choice_name(s) + " runs one process, but this is one of " +
                      std::to_string(world) + " ranks (WORLD_SIZE=" + std::to_string(world) +
                      "): each would train the whole run and write the same files",
                  "drop --strategy (under launch or torchrun it is ddp), or run one process "
                  "without the launcher");
  }
  if (s == Strategy::kDdp || (s == Strategy::kAuto && distributed::launched_as_rank(env))) {
    kind_ = StrategyKind::kDdp;
    env_ = distributed::read_dist_env(env);
    if (!distributed::distributed_available())
      distributed::create_communicator(env_, {});  // throws the stub's explanation
  }
  comm_options_.backend = choice_name(config.dist_backend);
  comm_options_.timeout_s = config.dist_timeout_s;
  distributed::check_dist_timeout(comm_options_.timeout_s);
  dist_shard_ = config.dist_shard;
  reducer_options_.bucket_mb = config.bucket_mb;
  // Micro-batches run backward once per chunk: a bucket is complete only after the last one.
  reducer_options_.overlap = config.overlap && config.micro_batches == 1;
  overlap_off_for_micro_batches_ = config.overlap && config.micro_batches > 1;
  if (!(reducer_options_.bucket_mb > 0))
    throw Error("--bucket-mb must be positive, got " + std::to_string(config.bucket_mb));
  // The process group's options mean nothing to one process: given, they are refused rather
  // than ignored (no variable mirrors them, so a value other than the default was asked for).
  if (kind_ != StrategyKind::kDdp) {
    const TrainConfig defaults;
    const std::pair<const char*, bool> ddp_only[] = {
        {"--dist-backend", config.dist_backend != defaults.dist_backend},
        {"--dist-timeout", config.dist_timeout_s != defaults.dist_timeout_s},
        {"--bucket-mb", config.bucket_mb != defaults.bucket_mb},
        {"--no-overlap", config.overlap != defaults.overlap},
        {"--dist-shard", config.dist_shard != defaults.dist_shard},
    };
    for (const auto& [flag, set] : ddp_only)
      if (set)
        throw Error(std::string(flag) + " applies to ddp runs (one process per device); this run " +
                        (kind_ == StrategyKind::kDataParallel ? "is dp, one process over its GPUs"
                                                              : "is a single process"),
                    "start it with spritetorch launch --nproc-per-node N -- train ... (or "
                    "torchrun), or leave " +
                        std::string(flag) + " out");
  }
}

ParallelRun::~ParallelRun() = default;

torch::Device ParallelRun::pick_device(const std::string& text) const {
  if (kind_ == StrategyKind::kDataParallel) {
    // DataParallel gathers on the first GPU: the model, the data and the loss live there.
    const torch::Device picked = device::pick_device(text);
    if (picked != dp_devices_.front())
      throw Error("--strategy dp trains on every visible GPU and gathers on cuda:0; --device " +
                      text + " resolves to " + picked.str(),
                  "use --device auto or cuda, and choose the GPUs with CUDA_VISIBLE_DEVICES");
    return picked;
  }
  if (!distributed()) return device::pick_device(text);
  const auto spec = device::parse_device_spec(text);
  torch::Device picked = device::resolve_device(spec, device::probe_availability());
  // One rank per GPU: cuda (or auto on a CUDA machine) means this rank's local GPU.
  if (picked.is_cuda() && spec.index < 0) {
    device::DeviceSpec local{device::DeviceKind::kCuda, env_.local_rank};
    picked = device::resolve_device(local, device::probe_availability());
  }
  return picked;
}

int ParallelRun::cores() const { return cpu_cores(distributed() ? env_.local_world_size : 1); }

void ParallelRun::connect(const torch::Device& device) {
  device_ = device;
  if (!distributed()) return;
#if SPRITETORCH_WITH_CUDA
  // Make this rank's GPU the current one, so that no rank opens a context on cuda:0 by default.
  if (device.is_cuda()) c10::cuda::set_device(static_cast<c10::DeviceIndex>(device.index()));
#endif
  if (comm_options_.backend == "auto") comm_options_.backend = device.is_cuda() ? "nccl" : "gloo";
  if (comm_options_.backend == "nccl" && !device.is_cuda())
    throw Error("--dist-backend nccl needs CUDA devices; this rank trains on " + device.str(),
                "use --dist-backend gloo on the CPU");
  comm_ = distributed::create_communicator(env_, comm_options_);
  local_shards_ =
      dist_shard_ == DistShard::kLocal || (dist_shard_ == DistShard::kAuto && device.is_cuda());
}

void ParallelRun::check_same_settings(const RunSettings& mine) {
  if (!comm_) return;
  const std::string encoded = encode_run_settings(mine);
  auto buffer = torch::zeros({static_cast<int64_t>(kRunSettingsBytes)}, torch::kUInt8);
  std::memcpy(buffer.data_ptr<uint8_t>(), encoded.data(), encoded.size());
  buffer = buffer.to(device_);
  comm_->broadcast(buffer, 0);
  buffer = buffer.cpu();
  const RunSettings root = decode_run_settings(
      std::string(reinterpret_cast<const char*>(buffer.data_ptr<uint8_t>()), kRunSettingsBytes));
  const int differs = first_differing_setting(mine, root);
  // Every rank learns which ranks differ, and where each first does, so that all of them stop.
  std::vector<double> firsts(static_cast<size_t>(env_.world_size), 0.0);
  firsts[static_cast<size_t>(env_.rank)] = differs + 1.0;
  firsts = sum(std::move(firsts));
  std::string ranks;
  size_t first_index = 0;  // where the lowest differing rank first differs
  for (size_t r = 0; r < firsts.size(); ++r) {
    if (firsts[r] == 0) continue;
    if (ranks.empty()) first_index = static_cast<size_t>(firsts[r]) - 1;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (ranks.empty()) return;
  auto value_in = [](const RunSettings& settings, size_t i) {
    return i < settings.size() ? settings[i].second : std::string("(none)");
  };
  auto name_in = [&](size_t i) {
    return i < mine.size() ? mine[i].first : i < root.size() ? root[i].first : "a setting";
  };
  std::string detail;
  if (differs >= 0) {  // this rank's own differences, up to three
    int listed = 0;
    for (size_t i = static_cast<size_t>(differs); i < std::max(mine.size(), root.size()); ++i) {
      if (i < mine.size() && i < root.size() && mine[i] == root[i]) continue;
      if (listed++ == 3) break;
      detail += (detail.empty() ? "" : "; ") + name_in(i) + " " + value_in(mine, i) + " here, " +
                value_in(root, i) + " on rank 0";
    }
  } else {  // rank 0, or a rank that agrees with it: the first difference of the first rank
    detail = "first " + name_in(first_index) + ", " + value_in(root, first_index) + " on rank 0";
  }
  throw Error("rank " + std::to_string(env_.rank) + ": the ranks were started with different " +
                  "settings: rank(s) " + ranks + " differ from rank 0 (" + detail + ")",
              "every rank must run the same train command (only the launcher's RANK, LOCAL_RANK "
              "and such differ): start them with the same flags, or with spritetorch launch");
}

void ParallelRun::broadcast_model(torch::nn::Module& model, FlatOptimizer& optimizer) {
  if (!comm_) return;
  torch::NoGradGuard no_grad;
  comm_->broadcast(optimizer.values(), 0);  // every parameter: one flat buffer, one collective
  for (auto& buffer : model.buffers()) {
    auto contiguous = buffer.contiguous();
    comm_->broadcast(contiguous, 0);
    if (!contiguous.is_same(buffer)) buffer.copy_(contiguous);
  }
}

void ParallelRun::attach(TrainStep& step, FlatOptimizer& optimizer,
                         const std::vector<torch::Tensor>& params) {
  if (!comm_) return;
  reducer_ = std::make_unique<distributed::GradReducer>(comm_, params, optimizer.grads(),
                                                        reducer_options_);
  if (reducer_options_.overlap) {
    reducer_->install_autograd_hooks();
    auto* reducer = reducer_.get();
    step.on_grad_ready([reducer](const torch::Tensor& p) { reducer->mark_ready(p); });
  }
}

const data::Dataset& ParallelRun::shard(const data::Dataset& full, data::LoaderOptions& options) {
  if (!distributed()) return full;
  if (!local_shards_) {
    options.shard_rank = env_.rank;
    options.shard_count = env_.world_size;
    return full;
  }
  local_data_ =
      data::local_shard(full, env_.rank, env_.world_size, options.seed, options.drop_last);
  return local_data_;
}

void ParallelRun::reduce_gradients() {
  if (reducer_) reducer_->finish();
}

int ParallelRun::agreed_interrupt(int local_signal, int64_t step) {
  if (!comm_) return local_signal;
  if (step % kInterruptCheckSteps != 0) return 0;
  // Ten steps between checks: a small host read every few tens of milliseconds even on a GPU.
  const auto pending =
      sum({local_signal == SIGINT ? 1.0 : 0.0, local_signal == SIGTERM ? 1.0 : 0.0});
  if (pending[1] > 0) return SIGTERM;
  return pending[0] > 0 ? SIGINT : 0;
}

std::vector<double> ParallelRun::sum(std::vector<double> values) {
  if (!comm_ || values.empty()) return values;
  auto t = torch::tensor(values, torch::kFloat64).to(device_);  // (V) float64
  comm_->allreduce_sum(t);
  t = t.cpu();
  for (size_t i = 0; i < values.size(); ++i) values[i] = t[static_cast<int64_t>(i)].item<double>();
  return values;
}

void ParallelRun::check_in_sync(FlatOptimizer& optimizer) {
  if (!comm_) return;
  torch::NoGradGuard no_grad;
  auto root = optimizer.values().clone();
  comm_->broadcast(root, 0);
  const double diff = (root - optimizer.values()).abs().max().item<double>();
  // Every rank must learn the verdict, or the good ones would wait for the bad one's next move.
  const double worst = sum({diff})[0];
  if (worst != 0.0)
    throw Error("rank " + std::to_string(env_.rank) +
                    ": the ranks' parameters differ after "
                    "training (largest difference summed over ranks: " +
                    std::to_string(worst) + ")",
                "this is a bug in spritetorch's gradient reduction; please report it");
}

std::string ParallelRun::describe() const {
  if (kind_ == StrategyKind::kDataParallel) {
    std::string s = "dp (DataParallel) over " + std::to_string(dp_devices_.size()) + " GPU(s):";
    for (const auto& d : dp_devices_) s += " " + d.str();
    return dp_devices_.size() == 1 ? s + " (one GPU: nothing to split)" : s;
  }
  if (!distributed()) return "single process";
  std::ostringstream s;
  s << "ddp, rank " << env_.rank << " of " << env_.world_size << ", "
    << (comm_ ? comm_->backend() : comm_options_.backend);
  if (reducer_)
    s << ", " << reducer_->buckets().size() << " bucket(s) <= " << reducer_options_.bucket_mb
      << " MB, "
      << (reducer_options_.overlap         ? "overlapped with backward"
          : overlap_off_for_micro_batches_ ? "after backward (the last micro-batch's)"
                                           : "after backward");
  s << ", " << (local_shards_ ? "local data shards" : "global data shards") << ", timeout "
    << comm_options_.timeout_s << " s";
  return s.str();
}

}  // namespace spritetorch::train
