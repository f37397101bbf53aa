// main() of the conv-net micro-benchmarks (fastcnn_step_bench, unet_step_bench): the process set
// up as `train` sets it up for a conv net, then Google Benchmark's usual run.
#pragma once

#include <benchmark/benchmark.h>

#include "common/cpu_threads.h"
#include "common/malloc_tuning.h"

namespace spritetorch::bench {

inline int run_conv_benchmarks(int argc, char** argv) {
  // Freed blocks kept (no page faults every step), LibTorch's threads on the cores and OpenBLAS on
  // one (both pools on every core would oversubscribe them).
  keep_freed_memory_for_reuse();
  apply_cpu_threads(0, 0, CpuWork::kConvolutions);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace spritetorch::bench
