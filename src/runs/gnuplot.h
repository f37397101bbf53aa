// Calling gnuplot, safely: found on PATH, started with fork/exec (no shell), the script a file,
// the working directory the run folder, output to a log file, killed after a timeout. Strings that
// go into a script are quoted with gnuplot_quote.
#pragma once

#include <optional>
#include <string>

namespace spritetorch::runs {

// The gnuplot executable on `path_env` (a PATH value; nullptr: this process's PATH), or nothing.
std::optional<std::string> find_gnuplot(const char* path_env = nullptr);

// A gnuplot single-quoted string literal: ' doubled (gnuplot's only escape inside '...'), control
// characters (a newline would end the command) replaced by spaces.
std::string gnuplot_quote(const std::string& text);

struct GnuplotResult {
  bool ok = false;
  std::string message;  // why not: exit status, signal, timeout, the log's last line
};

// Runs `gnuplot script` in `workdir` (relative names in the script resolve there); gnuplot's
// stdout and stderr go to `log_file` (relative to workdir). Killed after timeout_s.
GnuplotResult run_gnuplot(const std::string& gnuplot, const std::string& script, const std::string& workdir,
                          const std::string& log_file, double timeout_s = 60);

}  // namespace spritetorch::runs
