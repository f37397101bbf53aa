// How `spritetorch bench` prints a report (apps/cli/bench_table.h), on reports built by hand: the
// measuring is tests/train/benchmark_test.cpp's.
#include "cli/bench_table.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace spritetorch::cli {
namespace {

train::BenchRow ran_row(const std::string& device, const std::string& data_path, double seconds) {
  train::BenchRow row;
  row.device = device;
  row.data_path = data_path;
  row.step = "fused";
  row.ran = true;
  row.train_seconds = seconds;
  row.all_train_seconds = {seconds, seconds};
  row.ms_per_step = 1.5;
  row.images_per_second = 1000;
  row.epoch_seconds = seconds / 2;
  row.accuracy = 0.5;
  return row;
}

TEST(BenchTable, EveryRowAndTheComputeFloorReachTheTableJsonAndCsv) {
  train::BenchReport report;
  report.config.workload.epochs = 2;
  report.rows = {ran_row("cpu", "resident", 2.0), ran_row("cpu", "streaming, 0 workers", 2.5),
                 ran_row("cpu", "streaming, 2 workers", 3.0)};
  report.rows[0].speedup_over_cpu = 1.0;
  report.floor = train::ComputeFloor{1.0, 100.0, 0.01, {100.0}, ""};

  const auto json = bench_json(report);
  EXPECT_EQ(json.at("rows").size(), 3u);
  for (const char* key : {"device", "data_path", "ms_per_step", "images_per_second", "epoch_s",
                          "speedup_over_cpu", "accuracy"})
    EXPECT_TRUE(json.at("rows")[0].contains(key)) << key;
  EXPECT_EQ(json.at("workload").at("epochs"), 2);
  EXPECT_TRUE(json.contains("compute_floor"));
  // Every setting the accuracy column depends on, as the run applies it.
  EXPECT_EQ(json.at("workload").at("test_limit"), 0);
  EXPECT_EQ(json.at("workload").at("weight_decay"), 0.0);  // adam's default
  EXPECT_EQ(json.at("workload").at("lr_schedule"), "constant");
  for (const char* key : {"lr_warmup_steps", "label_smoothing", "augment", "test_time_augment",
                          "first_conv", "recipe"})
    EXPECT_TRUE(json.at("workload").contains(key)) << key;

  const auto csv = bench_csv(report);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4);
  EXPECT_EQ(csv.rfind("device,device_name,data_path", 0), 0u);
  const auto table = bench_table(report);
  EXPECT_NE(table.find("streaming, 2 workers"), std::string::npos);
  EXPECT_NE(table.find("Compute floor"), std::string::npos);
  // Without ratios measured beside the repeats, the best row is taken against the one floor.
  EXPECT_NE(table.find("best cpu row 2.00 s = 200.00x the floor\n"), std::string::npos) << table;
  EXPECT_FALSE(json.at("rows")[0].contains("floor_ratio"));
}

// With the floor measured before each repeat, the table quotes the best row's own ratio (the
// median of its repeats against their floors) and the range of the samples; the JSON has both.
TEST(BenchTable, TheBestRowIsTakenAgainstTheFloorMeasuredBesideItsRepeats) {
  train::BenchReport report;
  report.rows = {ran_row("cpu", "resident", 2.0), ran_row("cpu", "streaming, 0 workers", 2.5)};
  report.rows[0].floor_sgemm_gflops = {90.0, 110.0};
  report.rows[0].floor_ratio = 1.25;
  report.rows[1].floor_sgemm_gflops = {100.0, 120.0};
  report.rows[1].floor_ratio = 1.4;
  report.floor = train::ComputeFloor{
      1.6, 100.0, 0.016, {100.0, 90.0, 110.0, 100.0, 120.0}, "OpenBLAS runs its Prescott kernels"};
  const auto table = bench_table(report);
  EXPECT_NE(table.find("at 100 GFLOP/s (2048^3 sgemm, all cores; median of 5, 90-120, one before "
                       "each repeat) = 0.02 s; best cpu row 2.00 s = 1.25x the floor (median of "
                       "its repeats, each against the sgemm measured just before it)"),
            std::string::npos)
      << table;
  const auto json = bench_json(report);
  EXPECT_DOUBLE_EQ(json.at("rows")[1].at("floor_ratio").get<double>(), 1.4);
  EXPECT_EQ(json.at("rows")[1].at("floor_sgemm_gflops").size(), 2u);
  EXPECT_EQ(json.at("compute_floor").at("sgemm_gflops_samples").size(), 5u);
  // A floor measured with OpenBLAS's wrong kernels says so under itself and in the JSON.
  EXPECT_NE(table.find("\nwarning: OpenBLAS runs its Prescott kernels; the floor above was "
                       "measured with those kernels"),
            std::string::npos)
      << table;
  EXPECT_EQ(json.at("compute_floor").at("blas_warning"), "OpenBLAS runs its Prescott kernels");
  // BLAS threads that did not go quiet after a floor sample: said under the floor and in the JSON.
  EXPECT_EQ(table.find("still busy"), std::string::npos) << table;
  EXPECT_FALSE(json.at("compute_floor").at("blas_workers_busy").get<bool>());
  report.floor->blas_workers_busy = true;
  EXPECT_NE(bench_table(report).find("\nwarning: BLAS's threads were still busy 2 s after "
                                     "measuring the floor; the cpu rows may have shared their "
                                     "cores with them"),
            std::string::npos);
  EXPECT_TRUE(bench_json(report).at("compute_floor").at("blas_workers_busy").get<bool>());
  // The cross-core line transfer beside the floor: none measured, no line and a null median.
  EXPECT_EQ(table.find("Cross-core"), std::string::npos) << table;
  EXPECT_TRUE(json.at("compute_floor").at("cross_core_ns").is_null());
  report.rows[0].cross_core_ns = {180.0, 220.0};
  report.floor->cross_core_ns = {40.0, 180.0, 220.0};
  report.floor->cross_core_median_ns = 180.0;
  EXPECT_NE(bench_table(report).find("\nCross-core line transfer: 180 ns (median of 3, 40-220): "
                                     "the fused cpu step's threads pass"),
            std::string::npos)
      << bench_table(report);
  const auto with_ns = bench_json(report);
  EXPECT_DOUBLE_EQ(with_ns.at("compute_floor").at("cross_core_ns").get<double>(), 180.0);
  EXPECT_EQ(with_ns.at("compute_floor").at("cross_core_ns_samples").size(), 3u);
  EXPECT_EQ(with_ns.at("rows")[0].at("cross_core_ns").size(), 2u);
}

// The load other processes put on the CPUs during the timed runs: per row in the JSON (null where
// unknown), the most of it under the table, with a word on whether the figures are an idle
// machine's.
TEST(BenchTable, TheLoadOfOtherProcessesIsReportedAndJudged) {
  train::BenchReport report;
  report.rows = {ran_row("cpu", "resident", 2.0), ran_row("cpu", "streaming, 0 workers", 2.5)};
  report.rows[0].others_cpus = 0.03;
  report.rows[1].others_cpus = 0.01;
  EXPECT_NE(bench_table(report).find(
                "Other processes on this process's CPUs during the timed runs: 0.03 CPUs busy at "
                "most (no other load seen)"),
            std::string::npos)
      << bench_table(report);
  EXPECT_DOUBLE_EQ(bench_json(report).at("rows")[0].at("others_cpus").get<double>(), 0.03);
  report.rows[1].others_cpus = 1.2;
  EXPECT_NE(
      bench_table(report).find("1.20 CPUs busy at most (not idle: the times carry their load)"),
      std::string::npos)
      << bench_table(report);
  for (auto& row : report.rows) row.others_cpus = -1;  // no /proc/stat: no line, JSON null
  EXPECT_EQ(bench_table(report).find("Other processes"), std::string::npos);
  EXPECT_TRUE(bench_json(report).at("rows")[1].at("others_cpus").is_null());
}

// A run without a CPU row (bench --devices cuda) has nothing to compare with: the column says so
// instead of "0.00x".
TEST(BenchTable, WithoutACpuRowTheCpuRatioIsLeftEmpty) {
  train::BenchReport report;
  train::BenchRow row;
  row.device = "cuda:0";
  row.data_path = "resident";
  row.ran = true;
  row.train_seconds = 0.76;
  row.accuracy = 0.83;
  report.rows.push_back(row);
  const std::string table = bench_table(report);
  EXPECT_EQ(table.find("0.00x"), std::string::npos) << table;
  EXPECT_NE(table.find("0.76        -    0.8300"), std::string::npos) << table;
  EXPECT_TRUE(bench_json(report).at("rows")[0].at("speedup_over_cpu").is_null());
  const std::string csv = bench_csv(report);
  EXPECT_NE(csv.find(",0.76,,0.83,\n"), std::string::npos) << csv;
}

// An auto row's line under the table and its JSON say what it ran at; other rows add no line.
TEST(BenchTable, AnAutoRowSaysWhatItResolvedTo) {
  train::BenchReport report;
  report.rows = {ran_row("cpu", "resident, fp32", 2.0), ran_row("cpu", "resident, auto", 1.5)};
  report.rows[0].precision_used = "fp32";
  report.rows[1].precision = "auto";
  report.rows[1].precision_used = "fp32 (auto: no native bf16 here)";
  const auto table = bench_table(report);
  EXPECT_NE(table.find("cpu resident, auto: precision fp32 (auto: no native bf16 here)\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("resident, fp32: precision"), std::string::npos) << table;
  const auto json = bench_json(report);
  EXPECT_EQ(json.at("rows")[1].at("precision"), "auto");
  EXPECT_EQ(json.at("rows")[1].at("precision_used"), "fp32 (auto: no native bf16 here)");
}

// Rows that could not run keep their precision and graph setting and say why.
TEST(BenchTable, RowsThatDidNotRunAreListedWithTheirSettingsAndReason) {
  train::BenchReport report;
  report.rows.push_back(ran_row("cpu", "resident, fp32", 1.0));
  train::BenchRow graphs;
  graphs.device = "cpu";
  graphs.data_path = "resident, fp32, cuda graphs";
  graphs.cuda_graphs = true;
  graphs.skipped_reason = "CUDA graphs need a CUDA device";
  train::BenchRow half;
  half.device = "cpu";
  half.data_path = "resident, fp16";
  half.precision = "fp16";
  half.skipped_reason = "fp16 is not supported on the CPU";
  report.rows.push_back(graphs);
  report.rows.push_back(half);
  const auto json = bench_json(report);
  EXPECT_EQ(json.at("rows")[1].at("cuda_graphs"), true);
  EXPECT_EQ(json.at("rows")[2].at("precision"), "fp16");
  EXPECT_EQ(json.at("rows")[2].at("skipped_reason"), half.skipped_reason);
  EXPECT_NE(bench_table(report).find("not run: " + graphs.skipped_reason), std::string::npos);
  // The CSV: no zeros for figures a row that did not run has not got, and its reason.
  const std::string csv = bench_csv(report);
  EXPECT_NE(csv.find(",fp16,0,\"\",0,,,,,,,\"fp16 is not supported on the CPU\"\n"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find(",accuracy,skipped_reason\n"), std::string::npos) << csv;
}

}  // namespace
}  // namespace spritetorch::cli
