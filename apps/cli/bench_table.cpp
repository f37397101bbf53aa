#include "bench_table.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "train/flat_optimizer.h"

namespace spritetorch::cli {

std::string bench_table(const train::BenchReport& report) {
  std::ostringstream out;
  out << std::left << std::setw(8) << "device" << std::setw(37) << "data path" << std::setw(23)
      << "step" << std::right << std::setw(9) << "ms/step" << std::setw(11) << "img/s"
      << std::setw(10) << "epoch s" << std::setw(10) << "train s" << std::setw(9) << "vs cpu"
      << std::setw(10) << "accuracy"
      << "\n";
  out << std::fixed;
  for (const auto& r : report.rows) {
    out << std::left << std::setw(8) << r.device << std::setw(37) << r.data_path << std::setw(23)
        << r.step;
    if (!r.ran) {
      out << "not run: " << r.skipped_reason << "\n";
      continue;
    }
    out << std::right << std::setprecision(3) << std::setw(9) << r.ms_per_step
        << std::setprecision(0) << std::setw(11) << r.images_per_second << std::setprecision(2)
        << std::setw(10) << r.epoch_seconds << std::setw(10) << r.train_seconds;
    if (r.speedup_over_cpu > 0)
      out << std::setw(8) << r.speedup_over_cpu << "x";
    else
      out << std::setw(9) << "-";  // no CPU row in this run to compare with
    out << std::setprecision(4) << std::setw(10) << r.accuracy << "\n";
  }
  // A row that asked for --precision auto says what it ran at.
  for (const auto& r : report.rows)
    if (r.ran && r.precision == "auto")
      out << r.device << " " << r.data_path << ": precision " << r.precision_used << "\n";
  if (report.floor) {
    const train::BenchRow* best = nullptr;
    for (const auto& r : report.rows)
      if (r.ran && r.device == "cpu" && (!best || r.train_seconds < best->train_seconds)) best = &r;
    const auto& samples = report.floor->samples;
    out << std::setprecision(1) << "\nCompute floor (cpu): " << report.floor->gflop << " GFLOP at "
        << std::setprecision(0) << report.floor->sgemm_gflops
        << " GFLOP/s (2048^3 sgemm, all cores";
    if (samples.size() > 1)
      out << "; median of " << samples.size() << ", "
          << *std::min_element(samples.begin(), samples.end()) << "-"
          << *std::max_element(samples.begin(), samples.end()) << ", one before each repeat";
    out << ") = " << std::setprecision(2) << report.floor->seconds << " s";
    if (best && best->floor_ratio > 0)
      out << "; best cpu row " << best->train_seconds << " s = " << best->floor_ratio
          << "x the floor (median of its repeats, each against the sgemm measured just before it)";
    else if (best)
      out << "; best cpu row " << best->train_seconds
          << " s = " << best->train_seconds / report.floor->seconds << "x the floor";
    out << "\n";
    if (const auto& ns = report.floor->cross_core_ns; !ns.empty()) {
      out << std::setprecision(0)
          << "Cross-core line transfer: " << report.floor->cross_core_median_ns << " ns";
      if (ns.size() > 1)
        out << " (median of " << ns.size() << ", " << *std::min_element(ns.begin(), ns.end()) << "-"
            << *std::max_element(ns.begin(), ns.end()) << ")";
      out << ": the fused cpu step's threads pass about a thousand lines a step, so its ratio to "
             "the floor can move with this (docs/benchmarks.md)\n";
    }
    if (!report.floor->blas_warning.empty())
      out << "warning: " << report.floor->blas_warning
          << "; the floor above was measured with those kernels, so it is too high and the ratio "
             "flatters the rows\n";
    if (report.floor->blas_workers_busy)
      out << "warning: BLAS's threads were still busy 2 s after measuring the floor; the cpu rows "
             "may have shared their cores with them and read slow\n";
  }
  // Whether the machine was idle: every figure above is only as good as that.
  double most = -1;
  for (const auto& r : report.rows)
    if (r.ran) most = std::max(most, r.others_cpus);
  if (most >= 0)
    out << std::setprecision(2)
        << "Other processes on this process's CPUs during the timed runs: " << most
        << " CPUs busy at most"
        << (most >= kBusyOthers ? " (not idle: the times carry their load)"
                                : " (no other load seen)")
        << "\n";
  return out.str();
}

nlohmann::json bench_json(const train::BenchReport& report) {
  const train::TrainConfig& w = report.config.workload;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.rows) {
    nlohmann::json row = {
        {"device", r.device},
        {"device_name", r.device_name},
        {"data_path", r.data_path},
        {"precision", r.precision},
        {"cuda_graphs", r.cuda_graphs},
        {"precision_used", r.ran ? nlohmann::json(r.precision_used) : nlohmann::json(nullptr)},
        {"step", r.step},
        {"ran", r.ran}};
    if (r.ran) {
      row.update(
          {{"train_s", r.train_seconds},
           {"train_s_all", r.all_train_seconds},
           {"ms_per_step", r.ms_per_step},
           {"images_per_second", r.images_per_second},
           {"epoch_s", r.epoch_seconds},
           {"speedup_over_cpu", r.speedup_over_cpu > 0 ? nlohmann::json(r.speedup_over_cpu)
                                                       : nlohmann::json(nullptr)},  // no CPU row
           {"accuracy", r.accuracy},
           {"others_cpus", r.others_cpus >= 0 ? nlohmann::json(r.others_cpus)
                                              : nlohmann::json(nullptr)}});  // unknown
      if (r.floor_ratio > 0) {  // a CPU row of a workload with a compute floor
        row["floor_ratio"] = r.floor_ratio;
        row["floor_sgemm_gflops"] = r.floor_sgemm_gflops;
        row["cross_core_ns"] = r.cross_core_ns;
      }
    } else {
      row["skipped_reason"] = r.skipped_reason;
    }
    rows.push_back(row);
  }
  nlohmann::json out = {
      {"date", report.date},
      {"workload",
       {{"model", w.model.empty() ? train::default_model(w) : w.model},
        {"dataset", w.dataset},
        {"batch_size", w.batch_size},
        {"epochs", w.epochs},
        {"optimizer", w.optimizer},
        {"lr", w.lr},
        {"seed", w.seed},
        {"train_limit", w.train_limit},
        // What else the table's accuracy column depends on.
        {"test_limit", w.test_limit},
        {"weight_decay",
         w.weight_decay < 0 ? train::default_weight_decay(w.optimizer) : w.weight_decay},
        {"lr_schedule", w.lr_schedule},
        {"lr_warmup_steps", w.warmup_steps},
        {"label_smoothing", w.label_smoothing},
        {"augment", w.augment},
        {"test_time_augment", w.test_time_augment},
        {"first_conv", w.first_conv},
        {"recipe", w.recipe}}},
      {"repeats", report.config.repeats},
      {"warmup_steps", report.config.warmup_steps},
      {"rows", rows}};
  if (report.floor)
    out["compute_floor"] = {
        {"gflop", report.floor->gflop},
        {"sgemm_gflops", report.floor->sgemm_gflops},
        {"seconds", report.floor->seconds},
        {"sgemm_gflops_samples", report.floor->samples},
        {"blas_warning", report.floor->blas_warning},
        {"blas_workers_busy", report.floor->blas_workers_busy},
        {"cross_core_ns", report.floor->cross_core_ns.empty()
                              ? nlohmann::json(nullptr)
                              : nlohmann::json(report.floor->cross_core_median_ns)},
        {"cross_core_ns_samples", report.floor->cross_core_ns}};
  return out;
}

std::string bench_csv(const train::BenchReport& report) {
  std::ostringstream out;
  out << "device,device_name,data_path,precision,cuda_graphs,step,ran,ms_per_step,images_per_"
         "second,epoch_s,train_s,speedup_over_cpu,accuracy,skipped_reason\n";
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += (c == '"' ? std::string("\"\"") : std::string(1, c));
    return q + "\"";
  };
  for (const auto& r : report.rows) {
    out << r.device << "," << quoted(r.device_name) << "," << quoted(r.data_path) << ","
        << r.precision << "," << (r.cuda_graphs ? 1 : 0) << "," << quoted(r.step) << ","
        << (r.ran ? 1 : 0) << ",";
    // A row that did not run has no figures: empty cells, as in the JSON, not zeros a sort would
    // take for the fastest row.
    if (r.ran)
      out << r.ms_per_step << "," << r.images_per_second << "," << r.epoch_seconds << ","
          << r.train_seconds << ",";
    else
      out << ",,,,";
    if (r.ran && r.speedup_over_cpu > 0) out << r.speedup_over_cpu;  // empty: no CPU row
    out << ",";
    if (r.ran) out << r.accuracy;
    out << "," << (r.ran ? std::string() : quoted(r.skipped_reason)) << "\n";
  }
  return out.str();
}

}  // namespace spritetorch::cli
