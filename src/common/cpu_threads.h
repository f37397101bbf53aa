// CPU thread settings. LibTorch's intra-op pool and the BLAS library each run their own threads;
// letting both use every core oversubscribes it (measured: 4x slower on 2 cores), so spritetorch
// sets both explicitly and says what it chose.
#pragma once

#include <string>

namespace spritetorch {

struct CpuThreads {
  int intra_op = 1;       // at::get_num_threads() after the change
  int blas = -1;          // OpenBLAS threads after the change; -1 = not OpenBLAS / unknown
  std::string blas_name;  // "OpenBLAS 0.3.21 ...", or "unknown BLAS"
};

// Sets LibTorch's intra-op threads and OpenBLAS's threads; 0 = spritetorch's default for each:
// 1 intra-op thread and one BLAS thread per core. Measured on the seed workload, 2 cores
// (docs/benchmarks.md): intra 1 / BLAS 2 fastest; intra 2 / BLAS 2 4-5x slower (the two pools
// spin against each other); intra 1 / BLAS 1 1.3x slower.
CpuThreads apply_cpu_threads(int intra_op, int blas);
// The current settings, changing nothing.
CpuThreads current_cpu_threads();

}  // namespace spritetorch
