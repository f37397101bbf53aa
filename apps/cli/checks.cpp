#include "checks.h"

#include <c10/util/StringUtil.h>

#include <cmath>
#include <cstdlib>

namespace spritetorch::cli {

namespace {

CLI::Validator number_at_least(double min, bool strict, const std::string& name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const std::string wanted = strict ? "a number > " : "a number >= ";
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value))
          return "'" + text + "' is not a number (expected " + wanted + "0)";
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
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || value != value)
          return "'" + text + "' is not a number (expected " + range + ")";
        if (value < min || value > max) return "'" + text + "' is not " + range;
        return std::string();
      },
      "[" + c10::str(min) + " - " + c10::str(max) + "]", range);
}

const CLI::Validator kNonNegative = number_at_least(0, false, "NONNEGATIVE");
const CLI::Validator kPositive = number_at_least(0, true, "POSITIVE");

}  // namespace spritetorch::cli
