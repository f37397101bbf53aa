// The products of one seed-MLP step (784-128-64-10, batch 64, two step threads), each timed
// with every kernel this machine can run (common/small_gemm.h): the hand-written AVX2 kernels
// against the BLAS library's sgemm, on the shapes and strides CpuMlpStep passes them; and the
// step's Adam update (train/adam_kernels.h) over one step thread's half of the 109,386 parameters.
//
//   build/bench/small_gemm_bench                      # all shapes, all kernels
//   build/bench/small_gemm_bench --benchmark_filter=layer1
//   build/bench/small_gemm_bench --benchmark_filter=adam   # adam_subnormal: with subnormal moments
//   build/bench/small_gemm_bench --benchmark_filter=adam_shared  # lines the other core has read
//   build/bench/small_gemm_bench --benchmark_filter=softmax_loss  # the loss of a thread's rows
//   build/bench/small_gemm_bench --benchmark_filter=step   # the whole step, Adam after it
//
// Counters: GFLOP/s of the product (2 m n k per call); for Adam, parameters updated per second.
// `step`: one whole step of the seed MLP as `train` runs it on this CPU (CpuMlpStep on the best
// kernel, two threads, batches of 64 from a resident set, then FlatOptimizer::step()), for
// comparing a change to the step with its old form in one process, interleaved.
// One thread, BLAS's included (OpenBLAS would otherwise take every core and flatter its rows); the
// step runs one per core.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/bf16_gemm.h"
#include "common/cpu_threads.h"
#include "common/shard_pool.h"
#include "common/small_gemm.h"
#include "models/classifier.h"
#include "train/adam_kernels.h"
#include "train/cpu_mlp_step.h"
#include "train/flat_optimizer.h"
#include "train/softmax_loss.h"

namespace {

using spritetorch::gemm::Kernel;

// A float buffer on a 64-byte boundary, as LibTorch's CPU allocator gives the step's tensors. With
// std::vector's 16-byte one, rows of 784 floats start mid cache line and every 64-byte load of the
// AVX-512 kernels is split across two lines: the layer-1 forward row read 94-96 GFLOP/s instead of
// 104-123 (Intel Xeon model 207, one thread), a rate the step never sees.
struct AlignedFloats {
  explicit AlignedFloats(size_t count, float value = 0.0f)
      : tensor(torch::full({static_cast<int64_t>(count)}, value)) {}
  float* data() { return tensor.data_ptr<float>(); }
  float& operator[](size_t i) { return data()[i]; }
  torch::Tensor tensor;  // LibTorch's CPU allocator aligns to 64 bytes
};

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

// False, with the row marked skipped, where this CPU lacks the kernel's instructions.
bool kernel_runs_here(benchmark::State& state, Kernel kernel) {
  if (spritetorch::gemm::available(kernel)) return true;
  state.SkipWithError(
      (std::string(spritetorch::gemm::kernel_name(kernel)) + " cannot run here").c_str());
  return false;
}

void run_shape(benchmark::State& state, const Shape& s, Kernel kernel) {
  if (!kernel_runs_here(state, kernel)) return;
  // Operands sized generously for their strides; values do not affect the time.
  const size_t a_size = static_cast<size_t>(
      s.nt ? s.m * s.a_row : (s.m + 1) * (s.k + 1) * std::max(s.a_row, s.a_col));
  AlignedFloats a(a_size, 0.5f), b(static_cast<size_t>((s.nt ? s.n : s.k) * s.ldb), 0.25f);
  AlignedFloats c(static_cast<size_t>(s.m * s.ldc)), bias(static_cast<size_t>(s.n), 0.1f);
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

// subnormal: an eighth of the gradients are subnormal (1e-39), as the update sees them once
// parameters whose gradients stay 0 have their moments decayed below FLT_MIN. The update flushes
// subnormals (common/flush_subnormals.h), so this row should run at the plain row's rate; without
// the flush the same loop took ~40x as long on an Intel Xeon (docs/benchmarks.md).
void run_adam(benchmark::State& state, Kernel kernel, bool subnormal) {
  if (!kernel_runs_here(state, kernel)) return;
  const int64_t n = 109386 / 2;
  AlignedFloats p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  if (subnormal)
    for (int64_t i = 0; i < n; i += 8) g[i] = 1e-39f;  // m converges to it, v to 0
  spritetorch::train::AdamScalars k{0.9f, 0.999f, 0.1f, 0.001f, 1.0f, 1e-8f, -1e-3f, 0.0f, 1.0f};
  for (auto _ : state) {
    spritetorch::train::adam_update(p.data(), g.data(), m.data(), v.data(), 0, n, k, kernel);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// The loss of one step thread's rows (train/softmax_loss.h): 32 rows of the seed's 10 classes.
void run_softmax_loss(benchmark::State& state, Kernel kernel) {
  // (The library runs the loop where AVX-512 is missing: that row would time it under this name.)
  if (!kernel_runs_here(state, kernel)) return;
  const int rows = 32, classes = 10;
  torch::manual_seed(1);
  const auto logits = torch::randn({rows, classes}) * 4.0;
  const auto labels = torch::randint(0, classes, {rows}, torch::kInt64);
  AlignedFloats dz(rows * classes);
  for (auto _ : state) {
    auto sums = spritetorch::train::softmax_cross_entropy(logits.data_ptr<float>(),
                                                          labels.data_ptr<int64_t>(), rows, classes,
                                                          1.0f / 64.0f, dz.data(), kernel);
    benchmark::DoNotOptimize(sums);
    benchmark::ClobberMemory();
  }
}

// The update of parameters that another core has just read, as the fused step's later layers are
// (both threads read all of W_2 in its rows phase): state.range(0) floats, by default a step
// thread's half of W_2 (4,096, 256 lines), on the calling thread right after a pool thread read
// each of their lines. Each store then needs the other core's copy invalidated; the kernels claim
// the lines ahead (prefetchw) so those wait together, not one at a time. Only the update is timed.
void run_adam_shared(benchmark::State& state, Kernel kernel) {
  if (!kernel_runs_here(state, kernel)) return;
  const int64_t n = state.range(0);
  AlignedFloats p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  spritetorch::train::AdamScalars k{0.9f, 0.999f, 0.1f, 0.001f, 1.0f, 1e-8f, -1e-3f, 0.0f, 1.0f};
  spritetorch::ShardPool pool(2);
  float sink = 0.0f;
  for (auto _ : state) {
    pool.run([&](int t) {
      if (t != 1) return;
      float sum = 0.0f;
      for (int64_t i = 0; i < n; i += 16) sum += p[i];  // one read of every line
      sink += sum;
    });
    const auto start = std::chrono::steady_clock::now();
    spritetorch::train::adam_update(p.data(), g.data(), m.data(), v.data(), 0, n, k, kernel);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  benchmark::DoNotOptimize(sink);
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// The whole seed step (batch 64, Adam after it) on state.range(0) step threads: against one thread,
// what the fork-join of two gains on this machine.
void run_step(benchmark::State& state, spritetorch::train::MlpCompute compute) {
  torch::manual_seed(1);
  auto model = spritetorch::models::make_model({"ann", {1, 28, 28}, 10});
  spritetorch::train::FlatOptimizer optimizer(model->parameters(), {});
  spritetorch::train::CpuMlpStep step(model->relu_mlp_layers(), 64,
                                      static_cast<int>(state.range(0)),
                                      spritetorch::gemm::best_kernel(), compute);
  optimizer.use_thread_pool(step.thread_pool());
  optimizer.use_thread_shares(step.update_shares());  // as the trainer does
  // 16 batches, as a resident loader hands them over: (64, 1, 28, 28) float32, labels int64.
  std::vector<spritetorch::data::Batch> batches;
  for (int i = 0; i < 16; ++i)
    batches.push_back({torch::rand({64, 1, 28, 28}), torch::randint(0, 10, {64}, torch::kInt64)});
  auto loss = torch::zeros({});
  auto correct = torch::zeros({}, torch::kInt64);
  size_t next = 0;
  for (auto _ : state) {
    step.run(batches[next++ % batches.size()], loss, correct);
    optimizer.step();
  }
}

const bool kRegistered = [] {
  spritetorch::set_blas_threads(1);  // as in the step, whose threads each call BLAS
  for (bool subnormal : {false, true})
    for (Kernel kernel : {Kernel::avx2, Kernel::avx512, Kernel::loops})
      benchmark::RegisterBenchmark(
          (std::string(subnormal ? "adam_subnormal/" : "adam/") +
           spritetorch::gemm::kernel_name(kernel))
              .c_str(),
          [kernel, subnormal](benchmark::State& state) { run_adam(state, kernel, subnormal); });
  for (Kernel kernel : {Kernel::loops, Kernel::avx512})
    benchmark::RegisterBenchmark(
        (std::string("softmax_loss/") + spritetorch::gemm::kernel_name(kernel)).c_str(),
        [kernel](benchmark::State& state) { run_softmax_loss(state, kernel); });
  for (Kernel kernel : {Kernel::avx2, Kernel::avx512})
    benchmark::RegisterBenchmark(
        (std::string("adam_shared/") + spritetorch::gemm::kernel_name(kernel)).c_str(),
        [kernel](benchmark::State& state) { run_adam_shared(state, kernel); })
        ->Arg(4096)
        ->UseManualTime();
  for (const Shape& s : kShapes)
    for (Kernel kernel : {Kernel::avx2, Kernel::avx512, Kernel::blas})
      benchmark::RegisterBenchmark(
          (std::string(s.name) + "/" + spritetorch::gemm::kernel_name(kernel)).c_str(),
          [s, kernel](benchmark::State& state) { run_shape(state, s, kernel); });
  using spritetorch::train::MlpCompute;
  benchmark::RegisterBenchmark("step",
                               [](benchmark::State& state) { run_step(state, MlpCompute::fp32); })
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime();
  if (spritetorch::bf16::available())  // layer 1 in bf16, as --precision bf16 runs it
    benchmark::RegisterBenchmark("step_bf16",
                                 [](benchmark::State& state) { run_step(state, MlpCompute::bf16); })
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime();
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
