// `spritetorch bench`'s output: the run_benchmark report as a text table, JSON and CSV. The
// library only measures (train/benchmark.h); how a report reads is the CLI's business.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "train/benchmark.h"

namespace spritetorch::cli {

// CPUs that other processes may keep busy during a bench's timed runs before its table says the
// machine was not idle (an idle VM's daemons read 0.00). Load on a VM's host is not seen.
constexpr double kBusyOthers = 0.2;

std::string bench_table(const train::BenchReport& report);
nlohmann::json bench_json(const train::BenchReport& report);
std::string bench_csv(const train::BenchReport& report);

}  // namespace spritetorch::cli
