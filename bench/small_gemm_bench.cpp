// The products of one seed-MLP step (784-128-64-10, batch 64, two step threads), each timed
// with every kernel this machine can run (common/small_gemm.h): the hand-written AVX2 kernels
// against the BLAS library's sgemm, on the shapes and strides CpuMlpStep passes them; and the
// step's Adam update (train/adam_kernels.h) over one step thread's half of the 109,386 parameters.
//
//   build/bench/small_gemm_bench                      # all shapes, all kernels
//   build/bench/small_gemm_bench --benchmark_filter=layer1
//   build/bench/small_gemm_bench --benchmark_filter=adam
//
// Counters: GFLOP/s of the product (2 m n k per call); for Adam, parameters updated per second.
// One thread, BLAS's included (OpenBLAS would otherwise take every core and flatter its rows); the
// step runs one per core.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "common/cpu_threads.h"
#include "common/small_gemm.h"
#include "train/adam_kernels.h"

namespace {

using spritetorch::gemm::Kernel;

// A product in one of the two forms, with its operands' strides as the step lays them out.
struct Shape {
  const char* name;
  bool nt;  // nt: C = A B^T; else nn: C = op(A) B
  int m, n, k;
  int a_row, a_col;  // A's strides (nt: a_row is lda and a_col is 1)
  int ldb, ldc;
  bool bias_relu;  // nt only
};

// Per step thread: layer 1 is split by units (64 of 128 each), the rest by batch rows (32 each).
const std::vector<Shape> kShapes = {
    {"layer1_forward", true, 64, 64, 784, 784, 1, 784, 128, true},
    {"layer1_weight_grad", false, 64, 784, 64, 1, 128, 784, 784, false},
    {"layer2_forward", true, 32, 64, 128, 128, 1, 128, 64, true},
    {"layer2_weight_grad", false, 64, 128, 32, 1, 64, 128, 128, false},
    {"layer2_input_grad", false, 32, 128, 64, 64, 1, 128, 128, false},
    {"layer3_forward", true, 32, 10, 64, 64, 1, 64, 10, false},
};

void run_shape(benchmark::State& state, const Shape& s, Kernel kernel) {
  if (!spritetorch::gemm::available(kernel)) {
    state.SkipWithError(
        (std::string(spritetorch::gemm::kernel_name(kernel)) + " cannot run here").c_str());
    return;
  }
  // Operands sized generously for their strides; values do not affect the time.
  const size_t a_size = static_cast<size_t>(
      s.nt ? s.m * s.a_row : (s.m + 1) * (s.k + 1) * std::max(s.a_row, s.a_col));
  std::vector<float> a(a_size, 0.5f), b(static_cast<size_t>((s.nt ? s.n : s.k) * s.ldb), 0.25f);
  std::vector<float> c(static_cast<size_t>(s.m * s.ldc)), bias(static_cast<size_t>(s.n), 0.1f);
  for (auto _ : state) {
    if (s.nt)
      spritetorch::gemm::nt(s.m, s.n, s.k, a.data(), s.a_row, b.data(), s.ldb, c.data(), s.ldc,
                            s.bias_relu ? bias.data() : nullptr, s.bias_relu, kernel);
    else
      spritetorch::gemm::nn(s.m, s.n, s.k, a.data(), s.a_row, s.a_col, b.data(), s.ldb, c.data(),
                            s.ldc, kernel);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void run_adam(benchmark::State& state, Kernel kernel) {
  if (!spritetorch::gemm::available(kernel)) {
    state.SkipWithError(
        (std::string(spritetorch::gemm::kernel_name(kernel)) + " cannot run here").c_str());
    return;
  }
  const int64_t n = 109386 / 2;
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  spritetorch::train::AdamScalars k{0.9f, 0.999f, 0.1f, 0.001f, 1.0f, 1e-8f, -1e-3f, 0.0f, 1.0f};
  for (auto _ : state) {
    spritetorch::train::adam_update(p.data(), g.data(), m.data(), v.data(), 0, n, k, kernel);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

const bool kRegistered = [] {
  spritetorch::set_blas_threads(1);  // as in the step, whose threads each call BLAS
  for (Kernel kernel : {Kernel::avx2, Kernel::avx512, Kernel::loops})
    benchmark::RegisterBenchmark(
        (std::string("adam/") + spritetorch::gemm::kernel_name(kernel)).c_str(),
        [kernel](benchmark::State& state) { run_adam(state, kernel); });
  for (const Shape& s : kShapes)
    for (Kernel kernel : {Kernel::avx2, Kernel::avx512, Kernel::blas})
      benchmark::RegisterBenchmark(
          (std::string(s.name) + "/" + spritetorch::gemm::kernel_name(kernel)).c_str(),
          [s, kernel](benchmark::State& state) { run_shape(state, s, kernel); });
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
