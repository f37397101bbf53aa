// The command line that resumes an interrupted run: the original one with --resume CHECKPOINT.
#pragma once

#include <string>

namespace spritetorch::cli {

// argv as given, shell-quoted, with any --resume (and its value) replaced by --resume `checkpoint`.
std::string resume_command(int argc, char** argv, const std::string& checkpoint);

}  // namespace spritetorch::cli
