// The command line that resumes an interrupted run: the original one with --resume CHECKPOINT.
#pragma once

#include <string>

namespace spritetorch::cli {

// argv as given, shell-quoted, with any --resume (and its value) replaced by --resume `checkpoint`
// and any --run-dir left out (that folder holds the interrupted run; a folder takes one run).
// A rank of a ddp run (`local_world_size` > 0: LOCAL_WORLD_SIZE of its launcher) gets
// `spritetorch launch --nproc-per-node N --` in front, and `nnodes` > 1 adds --nnodes: a rank's own
// command line alone would start one process, which refuses the process group's options.
std::string resume_command(int argc, char** argv, const std::string& checkpoint,
                           int local_world_size = 0, int nnodes = 1);

}  // namespace spritetorch::cli
