// Option checks shared by the subcommands, with messages a person can read: CLI11's own number
// ranges say "Value abc not in range 0.000000 to 1797693134862315708145...".
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace spritetorch::cli {

extern const CLI::Validator kNonNegative;  // a number >= 0 (help: NONNEGATIVE)
extern const CLI::Validator kPositive;     // a number > 0 (help: POSITIVE)

}  // namespace spritetorch::cli
