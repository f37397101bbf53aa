// `spritetorch launch`: starts the local ranks of a ddp run itself, like torchrun does, so one
// command trains on every GPU (or several CPU processes) of a machine.
//
// Each rank is this same executable (/proc/self/exe) re-run with the given arguments and the
// torchrun environment: RANK = node_rank * nproc_per_node + local rank, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's TORCHELASTIC_* agent variables unset).
// When a rank fails (non-zero exit or a signal) the others are stopped (SIGTERM, then SIGKILL
// after a grace period) and its exit code is returned; a rank's exit 130/143 is an interrupt the
// ranks agreed on, not a failure: the others are left to stop at the same step. The ranks also
// get SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG).
//
// A mistake in the command (a bad flag, a missing file) fails every rank the same way: only each
// machine's first rank prints its error; the others leave theirs in a folder the launcher reads
// once they have ended, and it prints those that differ, naming the ranks (launched_error_file).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace spritetorch::distributed {

// The most ranks launch starts on one machine (--nproc-per-node): a machine's GPUs, or ranks that
// share its cores, are far fewer.
constexpr int kMaxRanksPerNode = 256;

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: a free port of this machine (one node only)
  std::vector<std::string> args;  // the subcommand and its flags, e.g. {"train", "--epochs", "2"}
  double grace_s = 5;             // between SIGTERM and SIGKILL for the surviving ranks
};

struct LaunchResult {
  // 0 when every rank succeeded; else the first failure (128 + signal when killed), or 130/143
  // when the ranks stopped on SIGINT/SIGTERM with a checkpoint and none failed.
  int exit_code = 0;
  int failed_rank = -1;  // global rank of that exit
};

// Starts the ranks and waits for them. `log` receives one line per notable event (start, the
// first failure); the library itself prints nothing. Throws spritetorch::Error for bad options.
LaunchResult launch_local_ranks(const LaunchOptions& options,
                                const std::function<void(const std::string&)>& log);

// Of two ranks found ended in the same poll (waitpid statuses), whether the first is reported as
// the failure before the second: one killed by a signal is the cause, one that exited with an
// error is usually its peer, which lost the connection a few milliseconds later.
bool reported_before(int status_a, int status_b);

// The variable through which launch tells its ranks the folder for their error messages.
constexpr const char* kLaunchErrorsVariable = "SPRITETORCH_LAUNCH_ERRORS";

// For a rank that launch started: the file its error message goes to (under the folder
// kLaunchErrorsVariable names, one per global rank), else "".
std::string launched_error_file();

// What launch prints of the ranks' error messages once they have ended: `first` is what the
// machine's first rank printed itself ("" when it printed nothing); `others` are (global rank,
// message) of the other ranks, in rank order. Messages equal to `first`, or empty, are left out;
// ranks with the same message share one entry. Returns (ranks, message) pairs.
std::vector<std::pair<std::vector<int>, std::string>> errors_to_show(
    const std::string& first, const std::vector<std::pair<int, std::string>>& others);

// A TCP port on this machine that was free a moment ago (bind to port 0, read it, close).
int free_tcp_port();

}  // namespace spritetorch::distributed
