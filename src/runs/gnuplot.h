// Calling gnuplot, safely: found on PATH, started with fork/exec (no shell), the script a file,
// the working directory the run folder, output to a log file, killed after a timeout. Strings that
// go into a script are quoted with gnuplot_quote.
#pragma once

#include <optional>
#include <string>
#include <vector>

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

struct GnuplotJob {
  std::string script;    // relative to workdir, e.g. plots/curves.gp
  std::string log_file;  // gnuplot's stdout and stderr, relative to workdir
  // Where the picture goes, relative to workdir (`-e "picture='...'"`, which the scripts of
  // plots.h read); empty: where the script says.
  std::string picture;
};

// Runs `gnuplot job.script` for every job at once, each in `workdir` with its own log file, and
// waits for all (a picture takes ~0.1-0.4 s of one core). Each is killed after timeout_s. One
// result per job, in order.
std::vector<GnuplotResult> run_gnuplots(const std::string& gnuplot,
                                        const std::vector<GnuplotJob>& jobs,
                                        const std::string& workdir, double timeout_s = 60);

}  // namespace spritetorch::runs
