#include "train/benchmark.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include "common/cpu_load.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/timer.h"
#include "data/augment.h"
#include "data/loader.h"
#include "device/device.h"
#include "models/classifier.h"
#include "models/script_model.h"
#include "train/classifier_task.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

namespace spritetorch::train {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

struct PathSetting {
  std::string label;
  data::DataPathOptions options;
  std::string precision = "fp32";
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
};

// The rows for one device: resident per precision (and per CUDA-graph setting), then streaming in
// the first precision. Every row is listed on every device; one that cannot run there says why.
std::vector<PathSetting> path_settings(const BenchConfig& config, const torch::Device& device) {
  std::vector<PathSetting> out;
  const std::vector<std::string> precisions =
      config.precisions.empty() ? std::vector<std::string>{"fp32"} : config.precisions;
  // The precision goes into the label when the table has more than fp32 in it.
  const bool name_precision = precisions.size() > 1 || precisions[0] != "fp32";
  data::DataPathOptions resident;
  resident.data_on = "device";
  const auto graph_modes = config.cuda_graphs
                               ? std::vector<CudaGraphs>{CudaGraphs::kOff, CudaGraphs::kOn}
                               : std::vector<CudaGraphs>{CudaGraphs::kAuto};
  for (const auto& precision : precisions)
    for (const CudaGraphs graphs : graph_modes)
      out.push_back({"resident" + (name_precision ? ", " + precision : std::string()) +
                         (graphs == CudaGraphs::kOn    ? ", cuda graphs"
                          : graphs == CudaGraphs::kOff ? ", eager"
                                                       : ""),
                     resident, precision, graphs});
  if (!config.streaming) return out;
  for (int w : config.workers) {
    for (int pin : device.is_cuda() ? std::vector<int>{1, 0} : std::vector<int>{0}) {
      data::DataPathOptions s;
      s.data_on = "host";
      s.workers = w;
      s.pin_memory = pin;
      out.push_back({"streaming, " + std::to_string(w) + " workers" +
                         (device.is_cuda() ? (pin ? ", pinned" : ", pageable") : "") +
                         (name_precision ? ", " + precisions[0] : std::string()),
                     s, precisions[0], CudaGraphs::kAuto});
    }
  }
  return out;
}

// What would fail every row on every device, refused before any row runs: only a setting that one
// device cannot run (fp16 or CUDA graphs on a CPU) belongs in a row's reason.
void check_workload(const BenchConfig& config) {
  const TrainConfig& w = config.workload;
  if (config.warmup_steps < 0)
    throw Error("--warmup-steps must be >= 0, got " + std::to_string(config.warmup_steps));
  for (const int workers : config.workers)
    if (workers < 0) throw Error("--workers must be >= 0, got " + std::to_string(workers));
  if (w.train_limit < 0)
    throw Error("--train-limit must be >= 0, got " + std::to_string(w.train_limit));
  if (w.test_limit < 0)
    throw Error("--test-limit must be >= 0, got " + std::to_string(w.test_limit));
  if (w.threads < 0) throw Error("--threads must be >= 0, got " + std::to_string(w.threads));
  if (!(w.lr > 0) || !std::isfinite(w.lr))
    throw Error("--lr must be a number > 0, got " + c10::str(w.lr));
  parse_lr_schedule(w.lr_schedule, w.warmup_steps);
  data::parse_augment(w.augment);
}

// The same for the settings that the data decides.
void check_workload_data(const TrainConfig& w, const Datasets& data) {
  const bool images = data.train.inputs.dim() == 4;
  if (data::parse_augment(w.augment).enabled() && !images)
    throw Error("--augment " + w.augment + " needs image data; " + data.train.name +
                " holds feature vectors");
  if (w.test_time_augment == "flip" && !images)
    throw Error("--test-time-augment flip mirrors images; " + data.train.name +
                " holds feature vectors");
  if (w.label_smoothing > 0 && w.step == StepKind::kFused)
    throw Error("--step fused computes plain cross-entropy; it cannot smooth the labels",
                "use --step auto, or drop --label-smoothing");
}

// --step-threads splits the fused CPU step of ReLU MLPs; train refuses it for any other step.
void check_step_threads(const TrainConfig& w, bool relu_mlp) {
  if (w.step_threads <= 0) return;
  if (w.step == StepKind::kAutograd || !relu_mlp)
    throw Error(
        std::string("--step-threads splits the fused CPU step of ReLU MLPs; this bench's "
                    "step is ") +
            (w.step == StepKind::kAutograd ? "autograd" : "that of a model with no fused step"),
        "drop --step-threads (--threads sets LibTorch's threads for it)");
}

}  // namespace

double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[(v.size() - 1) / 2];
}

double mlp_train_flops_per_sample(const std::vector<std::pair<int64_t, int64_t>>& layers) {
  double flops = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const double mac = static_cast<double>(layers[l].first) * static_cast<double>(layers[l].second);
    flops += 2 * mac;             // forward
    flops += 2 * mac;             // weight gradient
    if (l > 0) flops += 2 * mac;  // input gradient (none needed for the data itself)
  }
  return flops;
}

double measure_sgemm_gflops(int samples) {
  torch::NoGradGuard no_grad;
  // The machine's rate: every core in one BLAS call, whatever threads the workload itself uses
  // (the fused step runs BLAS single-threaded per core; measuring that way would halve the floor's
  // rate and flatter the ratio). The workload's setting is restored after.
  const CpuThreads before = current_cpu_threads();
  apply_cpu_threads(1, cpu_cores(), CpuWork::kMatmuls);
  const int64_t n = 2048;
  auto a = torch::rand({n, n}), b = torch::rand({n, n}), c = torch::empty({n, n});
  at::mm_out(c, a, b);  // warm-up
  std::vector<double> rates;
  for (int i = 0; i < std::max(1, samples); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n / s / 1e9);
  }
  apply_cpu_threads(before.intra_op, before.blas > 0 ? before.blas : 0, CpuWork::kMatmuls);
  return median(rates);
}

namespace {
// A sample of the floor's sgemm rate (measure_sgemm_gflops). BLAS's workers spin on after it
// (OpenBLAS: ~0.13 s of a core), and a row timed next would share the cores with them: waits until
// they stop, and notes it in `floor` where they did not.
double sample_floor_rate(ComputeFloor& floor, int samples) {
  const double rate = measure_sgemm_gflops(samples);
  constexpr double kMostSeconds = 2.0;
  if (wait_for_own_threads_to_idle(kMostSeconds) >= kMostSeconds) floor.blas_workers_busy = true;
  return rate;
}
}  // namespace

BenchReport run_benchmark(const BenchConfig& config, BenchObserver* observer) {
  BenchObserver silent;
  if (!observer) observer = &silent;
  if (config.repeats < 1) throw Error("--repeats must be >= 1");
  BenchReport report;
  report.date = today();
  report.config = config;

  std::vector<torch::Device> devices;
  if (config.devices.empty()) {
    for (const auto& d : device::list_devices()) devices.push_back(d.device);
  } else {
    for (const auto& text : config.devices) devices.push_back(device::pick_device(text));
  }

  check_workload(config);
  const Datasets data = load_datasets(config.workload);
  const TrainConfig& w = config.workload;  // every run's train() sets its CPU threads itself
  check_workload_data(w, data);

  // The compute floor, for the models whose FLOPs we can count exactly (ReLU MLPs; a TorchScript
  // model is none of them, and building it here would load its file once more).
  if (!models::script_model_file(w.model).empty()) {
    check_step_threads(w, false);
  } else {
    auto model = models::make_model({w.model.empty() ? default_model(w) : w.model,
                                     [&] {
                                       auto s = data.train.inputs.sizes().vec();
                                       s.erase(s.begin());
                                       return s;
                                     }(),
                                     data.train.num_classes()});
    const auto layers = model->relu_mlp_layers();
    check_step_threads(w, !layers.empty());
    if (!layers.empty()) {
      std::vector<std::pair<int64_t, int64_t>> sizes;
      for (const auto& l : layers) sizes.emplace_back(l->weight.size(1), l->weight.size(0));
      ComputeFloor floor;
      floor.gflop = mlp_train_flops_per_sample(sizes) * static_cast<double>(data.train.size()) *
                    static_cast<double>(w.epochs) / 1e9;
      floor.samples.push_back(sample_floor_rate(floor, 3));
      if (const auto ns = cross_core_transfer_ns()) floor.cross_core_ns.push_back(*ns);
      floor.cross_core_median_ns = lower_median(floor.cross_core_ns);
      floor.sgemm_gflops = floor.samples.back();
      floor.seconds = floor.gflop / floor.sgemm_gflops;
      floor.blas_warning = openblas_core_warning();
      report.floor = floor;
    }
  }

  for (const auto& device : devices) {
    for (const auto& setting : path_settings(config, device)) {
      BenchRow row;
      row.device = device.str();
      row.device_name = device::describe_device(device).name;
      row.data_path = setting.label;
      row.precision = setting.precision;
      TrainConfig run = w;
      run.device = device.str();
      run.data_path = setting.options;
      run.precision = precision::parse_precision(setting.precision);
      run.cuda_graphs = setting.cuda_graphs;
      run.save.clear();
      run.resume.clear();
      run.log_every = 0;
      run.eval_every = 0;  // bench times training; only the final evaluation, outside the timer
      try {
        // The bench trains classifiers (a fresh task each run: a task holds its module).
        auto classifier = [&w] { return ClassifierTask::builtin(w.model, default_model(w)); };
        // Warm-up: a few steps through the same path (allocator, BLAS buffers, kernels); none with
        // --warmup-steps 0.
        if (config.warmup_steps > 0) {
          TrainConfig warm = run;
          warm.epochs = 1;
          // Its steps may end inside the lr warm-up: the timed run's schedule, not refused.
          warm.warmup_steps_origin = "the untimed warm-up run";
          Datasets warm_data{data.train.head(config.warmup_steps * w.batch_size),
                             data.test.head(w.batch_size)};
          Trainer(warm).fit(*classifier(), warm_data);
        }
        TrainReport last;
        bool governed = false;  // a repeat ran on fewer threads: the machine was not idle
        const CpuTimes before = read_cpu_times();
        const bool beside_floor = report.floor && device.is_cpu();
        for (int r = 0; r < config.repeats; ++r) {
          if (beside_floor) {
            row.floor_sgemm_gflops.push_back(sample_floor_rate(*report.floor, 1));
            if (const auto ns = cross_core_transfer_ns()) row.cross_core_ns.push_back(*ns);
          }
          last = Trainer(run).fit(*classifier(), data);
          row.all_train_seconds.push_back(last.train_seconds);
          governed |= !last.thread_changes.empty();
        }
        row.others_cpus = other_processes_cpus(before, read_cpu_times()).value_or(-1.0);
        for (const auto& [k, v] : last.settings) {
          if (k == "step") row.step = v;
          if (k == "cuda graphs") row.cuda_graphs = v.rfind("off", 0) != 0;
          if (k == "precision") row.precision_used = v;
        }
        if (governed) row.step += " [fewer threads: other processes were busy]";
        // The default path captured its step: the row's label says so.
        if (row.cuda_graphs && setting.cuda_graphs == CudaGraphs::kAuto)
          row.data_path += " (cuda graphs)";
        row.ran = true;
        row.train_seconds = median(row.all_train_seconds);
        if (beside_floor) {
          std::vector<double> ratios;
          for (size_t r = 0; r < row.all_train_seconds.size(); ++r)
            ratios.push_back(row.all_train_seconds[r] * row.floor_sgemm_gflops[r] /
                             report.floor->gflop);
          row.floor_ratio = median(ratios);
          report.floor->samples.insert(report.floor->samples.end(), row.floor_sgemm_gflops.begin(),
                                       row.floor_sgemm_gflops.end());
          report.floor->cross_core_ns.insert(report.floor->cross_core_ns.end(),
                                             row.cross_core_ns.begin(), row.cross_core_ns.end());
          report.floor->cross_core_median_ns = lower_median(report.floor->cross_core_ns);
          report.floor->sgemm_gflops = median(report.floor->samples);
          report.floor->seconds = report.floor->gflop / report.floor->sgemm_gflops;
        }
        int64_t samples = 0;
        for (const auto& e : last.epochs) samples += e.samples;
        const int64_t steps = data::count_batches(data.train.size(), w.batch_size, w.drop_last) *
                              static_cast<int64_t>(last.epochs.size());
        row.ms_per_step = steps ? 1000.0 * row.train_seconds / static_cast<double>(steps) : 0;
        row.images_per_second =
            row.train_seconds > 0 ? static_cast<double>(samples) / row.train_seconds : 0;
        row.epoch_seconds =
            last.epochs.empty() ? 0 : row.train_seconds / static_cast<double>(last.epochs.size());
        row.accuracy = last.test.accuracy;
      } catch (const std::exception& e) {
        row.ran = false;
        row.floor_sgemm_gflops.clear();
        row.cross_core_ns.clear();
        row.skipped_reason = e.what();
      }
      report.rows.push_back(row);
      observer->on_row(report.rows.back());
    }
  }
  // vs cpu: against the first CPU row that ran, which may come after the others (--devices cuda
  // cpu).
  double cpu_seconds = 0;
  for (const auto& row : report.rows)
    if (row.ran && cpu_seconds == 0 && row.device == "cpu") cpu_seconds = row.train_seconds;
  for (auto& row : report.rows)
    row.speedup_over_cpu =
        cpu_seconds > 0 && row.ran && row.train_seconds > 0 ? cpu_seconds / row.train_seconds : 0;
  return report;
}

}  // namespace spritetorch::train
