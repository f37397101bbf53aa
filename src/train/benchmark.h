// `spritetorch bench`: one workload, timed on every device and data-path setting, with warm-up,
// device synchronisation before each clock read, and the median of several repeats. Every row does
// the same work (same model, data, batch, epochs, seed); nothing is skipped silently: a setting
// that cannot run on a device becomes a row with its reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "train/config.h"

namespace spritetorch::train {

// The lower of the two middle values for an even count, so always one of the samples; 0 for none.
// A cross-core reading whose partner thread lost its CPU takes milliseconds, not ~200 ns: the mean
// of one such and one true reading named a latency no sample had (3 ms from 220 ns and 6 ms).
double lower_median(std::vector<double> values);

struct BenchConfig {
  TrainConfig workload;                  // model, dataset, batch, epochs, lr, seed...
  std::vector<std::string> devices;      // empty = every device this machine has
  std::vector<int> workers = {0, 2, 4};  // streaming rows
  bool streaming = true;                 // include streaming rows at all
  // Resident rows, one per precision (fp32 | bf16 | fp16 | auto); streaming rows use the first.
  std::vector<std::string> precisions = {"fp32"};
  // Resident rows twice, eager (--no-cuda-graphs) and captured (--cuda-graphs); otherwise each
  // row runs as `train` does by default (graphs wherever valid).
  bool cuda_graphs = false;
  int repeats = 3;
  int warmup_steps = 30;
};

struct BenchRow {
  std::string device, device_name, data_path, step;
  std::string precision = "fp32";
  // What the run's settings table said of its precision ("fp32 (auto: no native bf16 here)"):
  // what `auto` resolved to on this device. Empty when the row did not run.
  std::string precision_used;
  bool cuda_graphs = false;  // the run replayed its step as a CUDA graph
  bool ran = false;
  std::string skipped_reason;  // when !ran
  double train_seconds = 0;    // median over repeats, all epochs
  double ms_per_step = 0, images_per_second = 0, epoch_seconds = 0;
  double speedup_over_cpu = 0;  // vs the first cpu row; 0 when none ran ("-", JSON null, CSV empty)
  double accuracy = 0;          // test accuracy after the last repeat
  std::vector<double> all_train_seconds;
  // CPUs that other processes kept busy on this process's CPUs during the timed repeats, on
  // average (common/cpu_load.h); -1 where unknown. Above ~0.2 the times carry their load.
  double others_cpus = -1;
  // CPU rows of a workload with a compute floor: the sgemm rate measured just before each repeat,
  // and the median over repeats of (repeat's seconds / the floor at that rate). A VM's speed
  // changes by the minute, so a ratio taken against a floor measured minutes earlier can be off
  // by 1.5x either way; beside each repeat, both sides see the same spell. 0 / empty otherwise.
  std::vector<double> floor_sgemm_gflops;
  double floor_ratio = 0;
  // Beside each floor sample: how long a cache line took between two of the process's CPUs
  // (common/cpu_load.h); empty where it could not be measured (one CPU).
  std::vector<double> cross_core_ns;
};

struct ComputeFloor {
  double gflop = 0;         // forward + weight grads + hidden input grads, all epochs
  double sgemm_gflops = 0;  // measured rate of a 2048^3 sgemm on this CPU (median of all samples)
  double seconds = 0;       // gflop / rate
  std::vector<double> samples;  // every measurement: before the rows, then before each CPU repeat
  // openblas_core_warning() when OpenBLAS runs kernels below this CPU's (common/cpu_threads.h):
  // then the rate above is that of the wrong kernels and the floor is too high.
  std::string blas_warning;
  // This process's other threads (BLAS's workers) still ran 2 s after a floor sample: the rows
  // after it may have shared their cores with them.
  bool blas_workers_busy = false;
  // Every cross-core line transfer measured beside the floor's samples, ns (common/cpu_load.h): on
  // a VM the fused step's ratio to the floor moves with it, the sgemm hardly.
  std::vector<double> cross_core_ns{};
  double cross_core_median_ns = 0;  // the lower median (a sample's value); 0 when none was measured
};

struct BenchReport {
  std::string date;
  BenchConfig config;
  std::vector<BenchRow> rows;
  std::optional<ComputeFloor> floor;  // ReLU MLPs on the CPU only
};

class BenchObserver {
 public:
  virtual ~BenchObserver() = default;
  virtual void on_row(const BenchRow& /*row*/) {}
};

BenchReport run_benchmark(const BenchConfig& config, BenchObserver* observer = nullptr);

// FLOPs of one training sample for a ReLU MLP with these (in, out) layer sizes: forward and
// weight gradients of every layer, input gradients of all but the first.
double mlp_train_flops_per_sample(const std::vector<std::pair<int64_t, int64_t>>& layers);
// Median GFLOP/s of `samples` 2048^3 float32 matmuls (after one untimed) on every CPU core.
double measure_sgemm_gflops(int samples = 3);

}  // namespace spritetorch::train
