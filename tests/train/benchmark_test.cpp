// What run_benchmark measures; how `spritetorch bench` prints it is tests/cli/bench_table_test.cpp.
#include "train/benchmark.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "common/error.h"

namespace spritetorch::train {
namespace {

TEST(Benchmark, SeedNetworkFlopsMatchTheIssuesFloor) {
  // 784-128-64-10: about 136 GFLOP for 5 epochs of 60000 samples.
  const double per_sample = mlp_train_flops_per_sample({{784, 128}, {128, 64}, {64, 10}});
  EXPECT_DOUBLE_EQ(per_sample, 2.0 * (3 * (784 * 128 + 128 * 64 + 64 * 10) - 784 * 128));
  EXPECT_NEAR(per_sample * 60000 * 5 / 1e9, 136.3, 0.1);
}

// A bench of SimpleNN on the dummy data, on the CPU: seconds, not minutes.
BenchConfig small_cpu_bench(int64_t epochs, int64_t batch_size, int repeats, int warmup_steps) {
  BenchConfig config;
  config.workload.dataset = "dummy";
  config.workload.model = "simplenn";
  config.workload.epochs = epochs;
  config.workload.batch_size = batch_size;
  config.devices = {"cpu"};
  config.repeats = repeats;
  config.warmup_steps = warmup_steps;
  return config;
}

// The cross-core figure of the bench: a sample whose partner thread was preempted (milliseconds)
// must not average with a true one into a latency no sample had.
TEST(Benchmark, TheLowerMedianIsAlwaysOneOfTheSamples) {
  EXPECT_DOUBLE_EQ(lower_median({6124068, 6208347, 212.9, 219.8}), 219.8);
  EXPECT_DOUBLE_EQ(lower_median({300, 100, 200}), 200);
  EXPECT_DOUBLE_EQ(lower_median({5}), 5);
  EXPECT_DOUBLE_EQ(lower_median({}), 0);
}

TEST(Benchmark, EveryRowRunsTheSameWorkAndReportsItsShape) {
  BenchConfig config = small_cpu_bench(2, 128, 2, 2);
  config.workers = {0, 2};
  const auto report = run_benchmark(config);
  ASSERT_EQ(report.rows.size(), 3u);  // resident, streaming 0 and 2 workers
  for (const auto& row : report.rows) {
    EXPECT_TRUE(row.ran) << row.data_path << ": " << row.skipped_reason;
    EXPECT_EQ(row.all_train_seconds.size(), 2u);
    EXPECT_GT(row.ms_per_step, 0);
    EXPECT_GT(row.images_per_second, 0);
    // Same seed, same batches, same arithmetic: every data path ends at the same accuracy.
    EXPECT_DOUBLE_EQ(row.accuracy, report.rows[0].accuracy) << row.data_path;
  }
  EXPECT_DOUBLE_EQ(report.rows[0].speedup_over_cpu, 1.0);
  ASSERT_TRUE(report.floor.has_value());
  EXPECT_GT(report.floor->sgemm_gflops, 0);
  EXPECT_EQ(report.config.workload.epochs, 2);
  // The floor is measured once before the rows and again just before every CPU repeat; each row's
  // ratio is the median of its repeats against the floor measured beside them.
  EXPECT_EQ(report.floor->samples.size(), 1u + 3u * 2u);
  for (const auto& row : report.rows) {
    ASSERT_EQ(row.floor_sgemm_gflops.size(), 2u) << row.data_path;
    std::vector<double> ratios;
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_GT(row.floor_sgemm_gflops[r], 0);
      ratios.push_back(row.all_train_seconds[r] * row.floor_sgemm_gflops[r] / report.floor->gflop);
    }
    EXPECT_NEAR(row.floor_ratio, 0.5 * (ratios[0] + ratios[1]), 1e-12) << row.data_path;
  }
  auto samples = report.floor->samples;
  std::sort(samples.begin(), samples.end());
  EXPECT_DOUBLE_EQ(report.floor->sgemm_gflops, samples[samples.size() / 2]);
  EXPECT_DOUBLE_EQ(report.floor->seconds, report.floor->gflop / report.floor->sgemm_gflops);
}

// A row asked for --precision auto keeps "auto" as its setting and carries what the run resolved it
// to (the settings table's line), which the table and the JSON print.
TEST(Benchmark, AnAutoPrecisionRowSaysWhatItRanAt) {
  BenchConfig config = small_cpu_bench(1, 256, 1, 1);
  config.streaming = false;
  config.precisions = {"auto"};
  const auto report = run_benchmark(config);
  ASSERT_EQ(report.rows.size(), 1u);
  ASSERT_TRUE(report.rows[0].ran) << report.rows[0].skipped_reason;
  EXPECT_EQ(report.rows[0].precision, "auto");
  const std::string& used = report.rows[0].precision_used;
  EXPECT_TRUE(used.rfind("fp32", 0) == 0 || used.rfind("bf16", 0) == 0) << used;
  EXPECT_NE(used.find("auto"), std::string::npos) << used;  // "(auto: ...)": why
}

// Precision and CUDA-graph rows: every combination is a row on every device; one that cannot run
// here says why instead of vanishing.
TEST(Benchmark, PrecisionAndGraphRowsAreListedAndExplainedWhereTheyCannotRun) {
  BenchConfig config = small_cpu_bench(1, 256, 1, 1);
  config.streaming = false;
  config.precisions = {"fp32", "fp16"};
  config.cuda_graphs = true;
  const auto report = run_benchmark(config);
  std::vector<std::string> labels;
  for (const auto& row : report.rows) labels.push_back(row.data_path);
  EXPECT_EQ(labels,
            (std::vector<std::string>{"resident, fp32, eager", "resident, fp32, cuda graphs",
                                      "resident, fp16, eager", "resident, fp16, cuda graphs"}));
  ASSERT_EQ(report.rows.size(), 4u);
  EXPECT_TRUE(report.rows[0].ran) << report.rows[0].skipped_reason;
  EXPECT_EQ(report.rows[0].precision, "fp32");
  for (size_t i = 1; i < 4; ++i) {  // graphs need CUDA; fp16 is refused on the CPU
    EXPECT_FALSE(report.rows[i].ran) << report.rows[i].data_path;
    EXPECT_FALSE(report.rows[i].skipped_reason.empty());
  }
  EXPECT_NE(report.rows[1].skipped_reason.find("CUDA"), std::string::npos)
      << report.rows[1].skipped_reason;
  EXPECT_NE(report.rows[2].skipped_reason.find("fp16"), std::string::npos)
      << report.rows[2].skipped_reason;
  EXPECT_FALSE(report.rows[0].cuda_graphs);  // the CPU has no graphs: nothing was replayed
  EXPECT_FALSE(report.rows[1].cuda_graphs);
  EXPECT_EQ(report.rows[2].precision, "fp16");
}

// A workload that would fail on every device is an Error before any row runs, as train refuses it;
// only what one device cannot run (fp16, CUDA graphs on a CPU) is a row's reason.
TEST(Benchmark, AWorkloadTrainRefusesIsAnErrorNotRowsThatDidNotRun) {
  const std::vector<std::function<void(BenchConfig&)>> invalid = {
      [](BenchConfig& c) { c.workload.lr_schedule = "step:0"; },
      [](BenchConfig& c) { c.workload.lr_schedule = "bogus"; },
      [](BenchConfig& c) { c.workload.augment = "rotate"; },
      [](BenchConfig& c) { c.workload.augment = "flip"; },  // dummy holds feature vectors
      [](BenchConfig& c) { c.workload.test_time_augment = "flip"; },
      [](BenchConfig& c) { c.workload.lr = -1; },
      [](BenchConfig& c) {
        c.workers = {0, -1};
      },
      [](BenchConfig& c) {
        c.workload.step = StepKind::kAutograd;
        c.workload.step_threads = 3;
      },
  };
  for (size_t i = 0; i < invalid.size(); ++i) {
    BenchConfig config = small_cpu_bench(1, 256, 1, 1);
    invalid[i](config);
    EXPECT_THROW(run_benchmark(config), Error) << "case " << i;
  }
}

TEST(Benchmark, NegativeCountsAreRefusedAndNoWarmUpStepsMeansNone) {
  for (const auto& set : std::vector<std::function<void(BenchConfig&)>>{
           [](BenchConfig& c) { c.warmup_steps = -3; },
           [](BenchConfig& c) { c.workload.train_limit = -5; },
           [](BenchConfig& c) { c.workload.threads = -2; }}) {
    BenchConfig config = small_cpu_bench(1, 256, 1, 1);
    set(config);
    EXPECT_THROW(run_benchmark(config), Error);
  }
  BenchConfig config = small_cpu_bench(1, 256, 1, 0);
  config.streaming = false;
  const auto report = run_benchmark(config);
  ASSERT_EQ(report.rows.size(), 1u);
  EXPECT_TRUE(report.rows[0].ran) << report.rows[0].skipped_reason;
}

TEST(Benchmark, ADeviceThatIsNotThereIsAnErrorNotASilentSkip) {
  BenchConfig config;
  config.workload.dataset = "dummy";
  config.workload.model = "simplenn";
  config.devices = {"cuda:7"};
  if (torch::cuda::device_count() > 7) GTEST_SKIP();
  EXPECT_THROW(run_benchmark(config), std::exception);
}

}  // namespace
}  // namespace spritetorch::train
