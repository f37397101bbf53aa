// Running a helper program (the Python peer) without a shell: argv in, exit code and stdout out.
#pragma once

#include <string>
#include <vector>

namespace spritetorch::cli {

struct ProcessResult {
  int exit_code = -1;  // -1: could not start; 128+N: killed by signal N
  std::string out;     // standard output (standard error passes through to ours)
};

// quiet: send the child's standard error to /dev/null.
ProcessResult run_process(const std::vector<std::string>& argv, bool quiet = false);

}  // namespace spritetorch::cli
