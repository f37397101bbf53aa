// `spritetorch bench`'s output: the run_benchmark report as a text table, JSON and CSV. The
// library only measures (train/benchmark.h); how a report reads is the CLI's business.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "train/benchmark.h"

namespace spritetorch::cli {

std::string bench_table(const train::BenchReport& report);
nlohmann::json bench_json(const train::BenchReport& report);
std::string bench_csv(const train::BenchReport& report);

}  // namespace spritetorch::cli
