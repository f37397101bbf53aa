#include "resume_command.h"

namespace spritetorch::cli {

namespace {

// POSIX shell quoting: bare when safe, else '...' with ' written as '\''.
std::string quote(const std::string& arg) {
  const bool safe = !arg.empty() && arg.find_first_not_of(
                                        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./:=+,@%") == std::string::npos;
  if (safe) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string resume_command(int argc, char** argv, const std::string& checkpoint,
                           int local_world_size, int nnodes) {
  std::string out;
  if (local_world_size > 0 && argc > 0) {
    out = quote(argv[0]) + " launch" + (nnodes > 1 ? " --nnodes " + std::to_string(nnodes) : "") +
          " --nproc-per-node " + std::to_string(local_world_size) + " --";
  }
  for (int i = 0; i < argc; ++i) {
    if (i == 0 && !out.empty()) continue;  // argv[0] leads the launch prefix
    const std::string arg = argv[i];
    // --resume is replaced; --run-dir dropped: that folder holds the interrupted run, and a run
    // folder takes one run (the resumed one gets its own).
    if (arg == "--resume" || arg == "--run-dir") {
      ++i;  // and its value
      continue;
    }
    if (arg.rfind("--resume=", 0) == 0 || arg.rfind("--run-dir=", 0) == 0) continue;
    out += (out.empty() ? "" : " ") + quote(arg);
  }
  return out + " --resume " + quote(checkpoint);
}

}  // namespace spritetorch::cli
