// Option checks shared by the subcommands, with messages a person can read: CLI11's own number
// ranges say "Value abc not in range 0.000000 to 1797693134862315708145...".
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace spritetorch::cli {

extern const CLI::Validator kNonNegative;  // a number >= 0 (help: NONNEGATIVE)
extern const CLI::Validator kPositive;     // a number > 0 (help: POSITIVE)

// For a parse error about an option whose value came from its environment mirror (the variable is
// set, the error quotes its value, and the command line does not give that value): the message
// naming the variable. Empty otherwise.
std::string environment_error(const CLI::ParseError& error, int argc, const char* const* argv);

}  // namespace spritetorch::cli
