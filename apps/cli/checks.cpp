#include "checks.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "common/input_file.h"
#include "common/output_file.h"
#include "data/sprite_sources.h"
#include "models/script_model.h"

namespace spritetorch::cli {

namespace {

// The whole of `text` as a finite number; false for anything else ("", "1x", "nan", "inf").
bool read_finite_number(const std::string& text, double& value) {
  // Decimal only: strtod would also read hexadecimal ("0x10" as 16).
  if (text.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && std::isfinite(value);
}

// An integer written out past 64 bits ("99999999999999999999"): CLI11 would store an integer
// option as INT64_MAX without a word, and a config file written from it could not be read back.
bool beyond_64_bits(const std::string& text) {
  const bool integer = text.find_first_of("0123456789") != std::string::npos &&
                       text.find_first_not_of("+-0123456789") == std::string::npos;
  if (!integer) return false;
  // Read as an integer: as a double, 2^63 - 18 already rounds to 2^63.
  errno = 0;
  std::strtoll(text.c_str(), nullptr, 10);
  return errno == ERANGE;
}

CLI::Validator number_at_least(double min, bool strict, const std::string& name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::string wanted = strict ? "a number > " : "a number >= ";
        double value = 0;
        if (!read_finite_number(text, value))
          return "'" + text + "' is not a number (expected " + wanted + "0)";
        if (beyond_64_bits(text)) return "'" + text + "' is too large (more than 64 bits)";
        if (strict ? value <= min : value < min) return "'" + text + "' is not " + wanted + "0";
        return std::string();
      },
      name, name);
}

}  // namespace

namespace {
// 1000000 as "1000000", not c10::str's "1e+06"; fractions as c10::str writes them.
std::string number_text(double value) {
  if (std::fabs(value) < 1e15 && value == std::floor(value))
    return std::to_string(static_cast<int64_t>(value));
  return c10::str(value);
}
}  // namespace

CLI::Validator number_between(double min, double max) {
  const std::string range = "a number from " + number_text(min) + " to " + number_text(max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!read_finite_number(text, value))
          return "'" + text + "' is not a number (expected " + range + ")";
        if (beyond_64_bits(text)) return "'" + text + "' is too large (more than 64 bits)";
        if (value < min || value > max) return "'" + text + "' is not " + range;
        return std::string();
      },
      "[" + number_text(min) + " - " + number_text(max) + "]", range);
}

CLI::Validator multiple_of_8_up_to(int64_t max) {
  const std::string wanted = "a multiple of 8 from 8 to " + std::to_string(max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!read_finite_number(text, value) || value != std::floor(value) || value < 8 ||
            value > static_cast<double>(max) || static_cast<int64_t>(value) % 8 != 0)
          return "'" + text + "' is not " + wanted;
        return std::string();
      },
      "[8 - " + std::to_string(max) + ", multiple of 8]", wanted);
}

const CLI::Validator kExistingFile(
    [](std::string& text) -> std::string {
      try {
        check_input_file(text, "a file");
        return std::string();
      } catch (const DataError& e) {
        return e.what();
      }
    },
    "FILE");

CLI::Validator model_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto& names = models::model_names();
        if (std::find(names.begin(), names.end(), text) != names.end()) return std::string();
        if (text.rfind("script:", 0) == 0) {
          try {
            check_input_file(models::script_model_file(text), "a TorchScript file");
            return std::string();
          } catch (const DataError& e) {
            return e.what();
          }
        }
        std::string list;
        for (const auto& n : names) list += n + ", ";
        return "'" + text + "': expected one of " + list + "or script:FILE (a TorchScript module)";
      },
      "MODEL");
}

const CLI::Validator kNonNegative = number_at_least(0, false, "NONNEGATIVE");
const CLI::Validator kPath(
    [](std::string& text) -> std::string {
      return text.empty() ? "an empty path (expected a file or folder name)" : std::string();
    },
    "PATH", "PATH");
const CLI::Validator kSeed(
    [](std::string& text) -> std::string {
      // Digits only: an unsigned parse would take "-1" as 2^64-1, and a config.toml (signed
      // 64-bit integers) could not replay a seed above INT64_MAX.
      const bool digits = !text.empty() && text.size() <= 19 &&
                          text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::strtoull(text.c_str(), nullptr, 10) > 9223372036854775807ULL)
        return "'" + text + "' is not a seed (expected a whole number from 0 to 2^63-1)";
      return std::string();
    },
    "SEED", "SEED");
const CLI::Validator kPositive = number_at_least(0, true, "POSITIVE");

int max_thread_count() {
  return std::max(64, 8 * static_cast<int>(std::thread::hardware_concurrency()));
}

const CLI::Validator kThreadCount(
    [](std::string& text) -> std::string {
      const std::string wanted = "a thread count from 0 to " + std::to_string(max_thread_count()) +
                                 " (8 per CPU of this machine, at least 64; 0: the default)";
      const bool digits = !text.empty() && text.size() <= 9 &&
                          text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stol(text) > max_thread_count()) return "'" + text + "' is not " + wanted;
      return std::string();
    },
    "THREADS", "THREADS");

std::string value_wanted(const CLI::Option& option) {
  const std::string type = option.get_type_name();
  std::string wanted;
  if (type.rfind("UINT", 0) == 0)
    wanted = "a whole number >= 0";
  else if (type.rfind("INT", 0) == 0)
    wanted = "a whole number";
  else if (type.rfind("FLOAT", 0) == 0)
    wanted = "a number";
  else
    return "";
  return wanted + (option.get_expected_max() > 1 ? " for each value" : "");
}

void read_integers_as_decimal(CLI::App* command) {
  const CLI::Validator decimal(
      [](std::string& text) {
        // Only a sign and digits: "0x10" and "1e3" are left to the checks, which refuse them.
        const size_t start = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
        if (text.size() > start + 1 && text[start] == '0' &&
            text.find_first_not_of("0123456789", start) == std::string::npos) {
          const size_t first = text.find_first_not_of('0', start);
          text.erase(start, (first == std::string::npos ? text.size() - 1 : first) - start);
        }
        return std::string();
      },
      "");
  for (CLI::Option* option : command->get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) option->transform(decimal);
  }
  for (CLI::App* sub : command->get_subcommands({})) read_integers_as_decimal(sub);
}

namespace {

// How an option is named in messages: its flag, or a positional's name in capitals (OUT, IN).
std::string option_label(const CLI::Option& option) {
  if (!option.get_lnames().empty()) return "--" + option.get_lnames().front();
  std::string name = option.get_name();
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// (label, path) of every file `command`'s options read (`inputs`) or write (`outputs`).
void collect_files(const CLI::App& command,
                   std::vector<std::pair<std::string, std::string>>& inputs,
                   std::vector<std::pair<std::string, std::string>>& outputs) {
  static const std::vector<std::string> kReads = {"--config",      "--checkpoint", "--classifier",
                                                  "--resume",      "--labels",     "--palette",
                                                  "--python-peer", "IN",           "FILES"};
  static const std::vector<std::string> kWrites = {"--out", "--save", "--reference", "OUT"};
  const bool bench = command.get_name() == "bench";  // bench --out OUT writes OUT.json, OUT.csv
  for (const CLI::Option* option : command.get_options()) {
    if (option->count() == 0) continue;
    const std::string label = option_label(*option);
    for (const std::string& value : option->results()) {
      if (value.empty()) continue;
      if (label == "--dataset") {
        for (const auto& file : data::sprite_dataset_files(value)) inputs.emplace_back(label, file);
      } else if (label == "--model") {
        // script:FILE reads FILE (a built-in model's name reads nothing).
        const std::string file = models::script_model_file(value);
        if (!file.empty()) inputs.emplace_back(label, file);
      } else if (std::find(kReads.begin(), kReads.end(), label) != kReads.end()) {
        if (!(label == "--palette" && value == "auto")) inputs.emplace_back(label, value);
      } else if (std::find(kWrites.begin(), kWrites.end(), label) != kWrites.end()) {
        if (bench && label == "--out") {
          outputs.emplace_back(label, value + ".json");
          outputs.emplace_back(label, value + ".csv");
        } else {
          outputs.emplace_back(label, value);
        }
      }
    }
  }
  for (const CLI::App* sub : command.get_subcommands()) collect_files(*sub, inputs, outputs);
}

}  // namespace

void check_outputs_are_not_inputs(const CLI::App& command) {
  std::vector<std::pair<std::string, std::string>> inputs, outputs;
  collect_files(command, inputs, outputs);
  for (const auto& [out_label, out] : outputs)
    for (const auto& [in_label, in] : inputs) {
      // train --save of the checkpoint it resumes from: the run continues in place.
      if (out_label == "--save" && in_label == "--resume") continue;
      if (!same_file(out, in)) continue;
      // A sheet:/npy: dataset names several files: say which role the output would overwrite.
      const std::string what =
          in_label == "--dataset" ? "a file the --dataset reads" : "the " + in_label + " itself";
      throw Error(out_label + " " + out + " is " + what + ": writing it would " +
                      "replace an input, --overwrite or not",
                  "write into another file; " + in + " is kept as it is");
    }
}

}  // namespace spritetorch::cli
