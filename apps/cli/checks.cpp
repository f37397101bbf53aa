#include "checks.h"

#include <cstdlib>

#include "config_file.h"

namespace spritetorch::cli {

namespace {

CLI::Validator number_at_least(double min, bool strict, const std::string& name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const std::string wanted = strict ? "a number > " : "a number >= ";
        if (text.empty() || end != text.c_str() + text.size() || value != value)
          return "'" + text + "' is not a number (expected " + wanted + "0)";
        if (strict ? value <= min : value < min) return "'" + text + "' is not " + wanted + "0";
        return std::string();
      },
      name, name);
}

}  // namespace

const CLI::Validator kNonNegative = number_at_least(0, false, "NONNEGATIVE");
const CLI::Validator kPositive = number_at_least(0, true, "POSITIVE");

std::string environment_error(const CLI::ParseError& error, int argc, const char* const* argv) {
  // CLI11 words these "--threads: ..." (validators) or "Could not convert: --threads = abc".
  const std::string message = error.what();
  for (const auto& [name, variable] : environment_mirrors()) {
    const std::string flag = "--" + name;
    const char* value = std::getenv(variable.c_str());
    if (!value || *value == 0) continue;
    if (message.find(flag + ":") == std::string::npos &&
        message.find(flag + " =") == std::string::npos)
      continue;
    if (message.find(value) == std::string::npos) continue;  // about another value
    for (int i = 1; i < argc;
         ++i) {  // the same value given on the command line: not the variable's
      const std::string arg = argv[i];
      if (arg == value || arg == flag + "=" + value) return std::string();
    }
    std::string detail = message;
    if (detail.rfind(flag + ": ", 0) == 0) detail = detail.substr(flag.size() + 2);
    return "environment variable " + variable + "=" + value + " (it sets " + flag + "): " + detail;
  }
  return std::string();
}

}  // namespace spritetorch::cli
