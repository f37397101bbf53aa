#include "checks.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

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
bool beyond_64_bits(const std::string& text, double value) {
  const bool integer = text.find_first_of("0123456789") != std::string::npos &&
                       text.find_first_not_of("+-0123456789") == std::string::npos;
  return integer && std::fabs(value) >= 9223372036854775807.0;
}

CLI::Validator number_at_least(double min, bool strict, const std::string& name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::string wanted = strict ? "a number > " : "a number >= ";
        double value = 0;
        if (!read_finite_number(text, value))
          return "'" + text + "' is not a number (expected " + wanted + "0)";
        if (beyond_64_bits(text, value)) return "'" + text + "' is too large (more than 64 bits)";
        if (strict ? value <= min : value < min) return "'" + text + "' is not " + wanted + "0";
        return std::string();
      },
      name, name);
}

}  // namespace

CLI::Validator number_between(double min, double max) {
  const std::string range = "a number from " + c10::str(min) + " to " + c10::str(max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!read_finite_number(text, value))
          return "'" + text + "' is not a number (expected " + range + ")";
        if (beyond_64_bits(text, value)) return "'" + text + "' is too large (more than 64 bits)";
        if (value < min || value > max) return "'" + text + "' is not " + range;
        return std::string();
      },
      "[" + c10::str(min) + " - " + c10::str(max) + "]", range);
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

}  // namespace spritetorch::cli
