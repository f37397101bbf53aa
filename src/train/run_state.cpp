#include "train/run_state.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/output_file.h"
#include "data/sprite_sources.h"

#if SPRITETORCH_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace spritetorch::train {

namespace {

namespace fs = std::filesystem;

torch::Tensor generator_state(at::Generator gen) {  // a handle: copies share the generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Generator gen, const torch::Tensor& state, const std::string& source,
                         const std::string& what) {
  const torch::Tensor current = generator_state(gen);
  if (!state.defined() || state.scalar_type() != torch::kUInt8 || state.numel() != current.numel())
    throw DataError(source, what + " state of " + std::to_string(current.numel()) + " bytes",
                    state.defined() ? std::to_string(state.numel()) + " elements of " +
                                          std::string(c10::toString(state.scalar_type()))
                                    : std::string("none"));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state.contiguous());
}

const torch::Tensor& run_tensor(const Checkpoint& c, const std::string& name,
                                torch::ScalarType dtype, const std::string& source) {
  auto it = c.run.find(name);
  if (it == c.run.end()) throw DataError(source, "run state tensor 'run." + name + "'", "none");
  if (it->second.scalar_type() != dtype || it->second.numel() != 1)
    throw DataError(source, "'run." + name + "' as one " + std::string(c10::toString(dtype)),
                    std::to_string(it->second.numel()) + " of " +
                        std::string(c10::toString(it->second.scalar_type())));
  return it->second;
}

// (stem, extension) of a base path: "runs/cnn.pt" -> ("runs/cnn", ".pt").
std::pair<std::string, std::string> split_base(const std::string& base) {
  const fs::path p(base);
  return {(p.parent_path() / p.stem()).string(), p.extension().string()};
}

}  // namespace

void capture_rng(RunState& state, torch::Device device) {
  state.cpu_rng = generator_state(at::detail::getDefaultCPUGenerator());
#if SPRITETORCH_WITH_CUDA
  if (device.is_cuda())
    state.cuda_rng = generator_state(at::cuda::detail::getDefaultCUDAGenerator(device.index()));
#else
  (void)device;
#endif
}

ProcessRng save_process_rng() {
  ProcessRng saved;
  saved.cpu = generator_state(at::detail::getDefaultCPUGenerator());
#if SPRITETORCH_WITH_CUDA
  if (torch::cuda::is_available())
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i)
      saved.cuda.push_back(generator_state(at::cuda::detail::getDefaultCUDAGenerator(i)));
#endif
  return saved;
}

void restore_process_rng(const ProcessRng& saved) {
  const auto put = [](at::Generator gen, const torch::Tensor& state) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  };
  put(at::detail::getDefaultCPUGenerator(), saved.cpu);
#if SPRITETORCH_WITH_CUDA
  for (size_t i = 0; i < saved.cuda.size(); ++i)
    put(at::cuda::detail::getDefaultCUDAGenerator(static_cast<int64_t>(i)), saved.cuda[i]);
#endif
}

void restore_rng(const RunState& state, torch::Device device, const std::string& source) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), state.cpu_rng, source, "a CPU RNG");
#if SPRITETORCH_WITH_CUDA
  if (device.is_cuda() && state.cuda_rng.defined())
    set_generator_state(at::cuda::detail::getDefaultCUDAGenerator(device.index()), state.cuda_rng,
                        source, "a CUDA RNG");
#else
  (void)device;
#endif
}

void store_run_state(const RunState& state, Checkpoint& checkpoint) {
  checkpoint.meta["run"] = {{"epoch", state.epoch},
                            {"step", state.step},
                            {"samples", state.samples},
                            {"interval_samples", state.interval_samples},
                            {"train_seconds", state.train_seconds}};
  checkpoint.run["loss_sum"] = state.loss_sum.detach().cpu();
  checkpoint.run["correct"] = state.correct.detach().cpu();
  checkpoint.run["interval_loss"] = state.interval_loss.detach().cpu();
  checkpoint.run["cpu_rng"] = state.cpu_rng.cpu();
  if (state.cuda_rng.defined()) checkpoint.run["cuda_rng"] = state.cuda_rng.cpu();
}

std::optional<RunState> load_run_state(const Checkpoint& checkpoint, torch::Device device,
                                       const std::string& source) {
  if (!checkpoint.meta.contains("run")) return std::nullopt;
  RunState s;
  try {
    const auto& run = checkpoint.meta.at("run");
    s.epoch = run.at("epoch").get<int64_t>();
    s.step = run.at("step").get<int64_t>();
    s.samples = run.at("samples").get<int64_t>();
    s.interval_samples = run.at("interval_samples").get<int64_t>();
    s.train_seconds = run.value("train_seconds", 0.0);  // absent before it was kept
  } catch (const nlohmann::json::exception& e) {
    throw DataError(source, "run metadata with epoch, step, samples, interval_samples", e.what());
  }
  if (s.epoch < 0 || s.step < 0 || s.samples < 0 || s.interval_samples < 0 ||
      s.interval_samples > s.samples || !std::isfinite(s.train_seconds) || s.train_seconds < 0)
    throw DataError(source, "non-negative run counters and training seconds",
                    "epoch " + std::to_string(s.epoch) + ", step " + std::to_string(s.step) + ", " +
                        std::to_string(s.train_seconds) + " s");
  s.loss_sum = run_tensor(checkpoint, "loss_sum", torch::kFloat32, source).reshape({}).to(device);
  s.correct = run_tensor(checkpoint, "correct", torch::kInt64, source).reshape({}).to(device);
  s.interval_loss =
      run_tensor(checkpoint, "interval_loss", torch::kFloat32, source).reshape({}).to(device);
  auto cpu = checkpoint.run.find("cpu_rng");
  if (cpu == checkpoint.run.end())
    throw DataError(source, "run state tensor 'run.cpu_rng'", "none");
  s.cpu_rng = cpu->second;
  auto cuda = checkpoint.run.find("cuda_rng");
  if (cuda != checkpoint.run.end()) s.cuda_rng = cuda->second;
  return s;
}

std::string periodic_checkpoint_path(const std::string& base, int64_t global_step) {
  const auto [stem, ext] = split_base(base);
  return stem + ".step" + std::to_string(global_step) + (ext.empty() ? ".pt" : ext);
}

std::string unused_checkpoint_path(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return path;
  const auto [stem, ext] = split_base(path);
  for (int k = 2;; ++k) {
    const std::string next = stem + "-" + std::to_string(k) + (ext.empty() ? ".pt" : ext);
    if (!std::filesystem::exists(next, ec)) return next;
  }
}

namespace {
// The folder of `base`'s periodic checkpoints and their names' parts: "<stem>.step<N><ext>".
struct PeriodicNames {
  explicit PeriodicNames(const std::string& base) {
    const auto [stem, ext] = split_base(base);
    const fs::path stem_path(stem);
    dir = stem_path.has_parent_path() ? stem_path.parent_path() : fs::path(".");
    prefix = stem_path.filename().string() + ".step";
    suffix = ext.empty() ? ".pt" : ext;
  }
  // The step a file name of this run's periodic checkpoints carries, -1 for any other name.
  int64_t step_of(const std::string& name) const {
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      return -1;
    const std::string digits =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return -1;
    return std::stoll(digits);
  }
  fs::path dir;
  std::string prefix, suffix;
};

// The periodic checkpoints of `base` that exist, with their global steps, lowest step first.
std::vector<std::pair<int64_t, std::string>> periodic_checkpoint_steps(const std::string& base) {
  const PeriodicNames names(base);
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(names.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = names.step_of(it->path().filename().string());
    if (step >= 0) found.emplace_back(step, periodic_checkpoint_path(base, step));
  }
  std::sort(found.begin(), found.end());
  return found;
}
}  // namespace

int remove_dead_periodic_temporaries(const std::string& base) {
  const PeriodicNames names(base);
  return remove_dead_writers_temporaries(
      names.dir.string(), [&](const std::string& name) { return names.step_of(name) >= 0; });
}

std::vector<std::string> periodic_checkpoints(const std::string& base) {
  std::vector<std::string> out;
  for (auto& f : periodic_checkpoint_steps(base)) out.push_back(std::move(f.second));
  return out;
}

void prune_periodic_checkpoints(const std::string& base, int64_t keep, int64_t written_step,
                                const std::string& known_good) {
  if (keep <= 0) return;
  // Files past `written_step` are not this run's (an --overwrite'n run's, or the steps after the
  // checkpoint a run resumed from): ranking them with this run's would delete its newest.
  std::vector<std::string> files;
  for (auto& [step, path] : periodic_checkpoint_steps(base))
    if (step <= written_step) files.push_back(std::move(path));
  for (size_t i = 0; i + static_cast<size_t>(keep) < files.size(); ++i) {
    if (files[i] == known_good) continue;
    std::error_code ec;
    fs::remove(files[i], ec);  // best effort: a file someone else removed is fine
  }
}

void check_model_spec(const models::ModelSpec& spec, int64_t file_values,
                      const std::string& source) {
  constexpr int64_t kMaxDim = 65536, kMaxClasses = 65536;
  const std::string shape = nlohmann::json(spec.input_shape).dump();
  if (spec.input_shape.empty() || spec.input_shape.size() > 3)
    throw DataError(source, "an input_shape of 1 to 3 dimensions", shape);
  int64_t features = 1;
  for (int64_t d : spec.input_shape) {
    if (d < 1 || d > kMaxDim)
      throw DataError(source, "input dimensions of 1.." + std::to_string(kMaxDim), shape);
    features *= d;  // < 2^48 after three factors of at most 2^16: no overflow
  }
  if (features > file_values)
    throw DataError(
        source, "an input_shape its " + std::to_string(file_values) + " weights can serve", shape);
  if (spec.classes < 2 || spec.classes > kMaxClasses || spec.classes > file_values)
    throw DataError(source, "2.." + std::to_string(std::min(kMaxClasses, file_values)) + " classes",
                    std::to_string(spec.classes));
}

std::string run_checkpoint_base(const TrainConfig& config) {
  return config.save.empty() ? std::string("spritetorch-run.pt") : config.save;
}

void check_run_outputs(const TrainConfig& config, const std::string& base) {
  const auto periodic = periodic_checkpoints(base);
  if (!config.save.empty()) {
    bool in_place = !config.resume.empty() && same_file(config.save, config.resume);
    for (const auto& p : periodic)
      in_place = in_place || (!config.resume.empty() && same_file(p, config.resume));
    if (!in_place) check_output_path(config.save, config.overwrite, "--save");
  }
  // Only a run that writes periodic checkpoints (and prunes them) would mix its files with another
  // run's; a run without them writes one only when stopped (Ctrl-C, out of memory), and then under
  // a name no file has (unused_checkpoint_path).
  const bool periodic_run = config.checkpoint_every > 0 || config.keep_last > 0;
  if (config.resume.empty() && !config.overwrite && !periodic.empty() && periodic_run)
    throw Error("refusing to overwrite the checkpoints of another run: " + periodic.back() +
                    " exists (periodic checkpoints are named after " + base + ")",
                "continue that run with --resume " + periodic.back() +
                    ", pass --overwrite, or choose another --save path");
}

namespace {
// "folder:views" -> "folder"; "fashion-mnist" -> "fashion-mnist".
std::string dataset_kind(const std::string& spec) { return spec.substr(0, spec.find(':')); }

// The flag and value of each sprite option in `o` (sprite_options_json's fields).
std::vector<std::pair<std::string, std::string>> sprite_flags(const data::SpriteOptions& o) {
  std::ostringstream holdout;
  holdout << o.holdout;
  return {{"--size", std::to_string(o.size)},
          {"--sprite-count", std::to_string(o.count)},
          {"--data-seed", std::to_string(o.seed)},
          {"--tile", std::to_string(o.tile_w) + "x" + std::to_string(o.tile_h)},
          {"--spacing", std::to_string(o.spacing)},
          {"--margin", std::to_string(o.margin)},
          {"--labels", o.label_map.empty() ? "\"\"" : o.label_map},
          {"--holdout", holdout.str()},
          {"--resize", o.resize}};
}
}  // namespace

void check_resumed_data(const TrainConfig& config, const std::string& task,
                        const Checkpoint& checkpoint) {
  const auto& meta = checkpoint.meta;
  const std::string& source = config.resume;
  if (meta.contains("task") && meta.at("task").is_string() && meta.at("task") != task) {
    const std::string saved = meta.at("task").get<std::string>();
    throw DataError(source, "a checkpoint of task '" + task + "' to resume",
                    "one of task '" + saved + "'",
                    task != "classify" && task != "generate"  // a task of the user's own
                        ? "resume it with the task that trained it ('" + saved + "')"
                        : saved == "generate"   ? "resume it with train --task generate"
                          : saved == "classify" ? "resume it without --task generate"
                                                : "resume it with the program that trained it");
  }
  if (!meta.contains("dataset") || !meta.at("dataset").is_string()) return;
  const std::string saved = meta.at("dataset").get<std::string>();
  // Paths may differ (the data moved, or the run resumes from another folder); the kind may not.
  if (dataset_kind(saved) != dataset_kind(config.dataset))
    throw Error(
        "--resume " + source + " was trained on " + saved + "; this run has --dataset " +
            config.dataset,
        saved == kInMemoryDataset
            ? "it was trained on data a program gave Trainer::fit without a Datasets::source: "
              "resume it with the same data, given the same way"
            : "pass --dataset " + saved +
                  (saved.find(':') != std::string::npos ? " (or where that data is now)" : "") +
                  (config.dataset == kInMemoryDataset
                       ? " (a program: Datasets::source names the data)"
                       : ""));
  if (!data::is_sprite_dataset(saved) || !meta.contains("sprites")) return;
  data::SpriteOptions then;
  try {
    then = data::sprite_options_from_json(meta.at("sprites"));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(source, "sprite options in its metadata", e.what());
  }
  const auto was = sprite_flags(data::sprite_options_read_by(saved, then));
  const auto now = sprite_flags(data::sprite_options_read_by(config.dataset, config.sprites));
  std::string was_text, now_text;
  for (size_t i = 0; i < was.size(); ++i) {
    if (was[i].second == now[i].second) continue;
    was_text += " " + was[i].first + " " + was[i].second;
    now_text += " " + now[i].first + " " + now[i].second;
  }
  if (!was_text.empty())
    throw Error("--resume " + source + " was trained with" + was_text + "; this run has" +
                    now_text + ": its test split would not be the one held out from training",
                "pass" + was_text + " (or train a new model)");
}

namespace {
// "a, b, c" (the first 8, then "and N more").
std::string names_text(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 8) out += " and " + std::to_string(names.size() - 8) + " more";
  return out;
}
}  // namespace

void check_resumed_classes(const TrainConfig& config, const Checkpoint& checkpoint,
                           const std::vector<std::string>& class_names) {
  const auto it = checkpoint.meta.find("class_names");
  if (it == checkpoint.meta.end() || !it->is_array() || it->empty() || class_names.empty()) return;
  std::vector<std::string> saved;
  for (const auto& name : *it) {
    if (!name.is_string()) return;  // model_from_checkpoint names the bad field
    saved.push_back(name.get<std::string>());
  }
  if (saved == class_names) return;
  throw Error("--resume " + config.resume + " was trained on the classes " + names_text(saved) +
                  "; the data of this run (--dataset " + config.dataset + ") has " +
                  names_text(class_names),
              "pass the --dataset it was trained on, or train a new model on this data");
}

void check_mid_run_resume(const TrainConfig& config, const Checkpoint& checkpoint,
                          const RunState& state, int64_t train_samples, int world_size,
                          bool local_shards) {
  const auto& meta = checkpoint.meta;
  auto differs = [&](const char* key, const nlohmann::json& now) {
    return meta.contains(key) && meta.at(key) != now;
  };
  // The epoch's order is dealt out to the ranks: with another world size a step takes another
  // global batch, and the batches left would not be the ones the stopped run had left.
  const bool shards_differ = world_size > 1 && differs("local_shards", local_shards);
  if (differs("world_size", world_size) || shards_differ) {
    const auto ranks = meta.value("world_size", nlohmann::json(world_size));
    const auto ranks_text = [](const nlohmann::json& n) {
      return n == 1 ? std::string("one process") : n.dump() + " ranks";
    };
    throw Error("--resume " + config.resume + " stopped inside epoch " +
                    std::to_string(state.epoch + 1) + " (step " + std::to_string(state.step) +
                    ") of a run of " + ranks_text(ranks) +
                    (shards_differ ? (meta.at("local_shards") == true ? " with local data shards"
                                                                      : " with global data shards")
                                   : std::string()) +
                    "; this run has " + ranks_text(world_size) +
                    (shards_differ ? (local_shards ? " with local ones" : " with global ones")
                                   : std::string()) +
                    ": the batches left would differ",
                ranks == 1 ? std::string("resume it as one process (without launch), or from a "
                                         "checkpoint at an epoch's end")
                           : "resume it with " + ranks.dump() +
                                 " ranks (spritetorch launch --nproc-per-node ...; the printed "
                                 "resume command has it) and the same --dist-shard, or from a "
                                 "checkpoint at an epoch's end");
  }
  // --train-limit (or other data) would reorder the epoch: the batches left would not be the ones
  // the stopped run had left.
  if (differs("train_samples", train_samples))
    throw Error("--resume " + config.resume + " stopped inside epoch " +
                    std::to_string(state.epoch + 1) + " (step " + std::to_string(state.step) +
                    ") of a training set of " + meta.at("train_samples").dump() +
                    " samples; this run's has " + std::to_string(train_samples),
                "resume with the same data and --train-limit (the printed resume command has "
                "them), or from a checkpoint at an epoch's end");
  // A checkpoint from before --class-sampling was drawn in natural order.
  const std::string sampling = meta.value("class_sampling", std::string("natural"));
  if (differs("batch_size", config.batch_size) || differs("seed", config.seed) ||
      differs("drop_last", config.drop_last) || sampling != choice_name(config.class_sampling))
    throw Error("--resume " + config.resume + " stopped inside epoch " +
                    std::to_string(state.epoch + 1) + " (step " + std::to_string(state.step) +
                    ") with --batch-size " + meta.value("batch_size", nlohmann::json()).dump() +
                    ", --seed " + meta.value("seed", nlohmann::json()).dump() + ", --drop-last " +
                    meta.value("drop_last", nlohmann::json()).dump() + ", --class-sampling " +
                    sampling + "; this run differs",
                "resume with the same --batch-size, --seed, --drop-last and --class-sampling (the "
                "printed resume command has them)");
}

Error out_of_memory(const std::exception& oom, const TrainConfig& config, int64_t epoch,
                    int64_t step, const std::function<std::string()>& save) {
  std::string saved;
  try {
    saved = "run state saved to " + save() + " (resume with --resume)";
  } catch (const std::exception& e) {
    saved = std::string("the run state could not be saved: ") + e.what();
  }
  return Error("out of device memory in epoch " + std::to_string(epoch + 1) + ", step " +
                   std::to_string(step + 1) + " (batch " + std::to_string(config.batch_size) +
                   " on " + config.device + "): " + first_line(oom.what()) + "; " + saved,
               "try a smaller --batch-size, bf16 precision, or streaming the data instead of "
               "keeping the dataset resident on the device");
}

}  // namespace spritetorch::train
