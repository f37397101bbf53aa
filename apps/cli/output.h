// Printing shared by the subcommands: the settings table, the per-epoch line, eval reports.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/evaluator.h"
#include "train/trainer.h"

namespace spritetorch::cli {

void print_settings(std::ostream& out, const train::Settings& settings);
void print_eval(std::ostream& out, const train::EvalReport& report,
                const std::vector<std::string>& class_names);
nlohmann::json eval_json(const train::EvalReport& report,
                         const std::vector<std::string>& class_names);

}  // namespace spritetorch::cli
