// Who this process is in a multi-process run: rank, world size, local rank and the rendezvous
// address, read from the environment variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). `spritetorch launch`, torchrun --no-python and Slurm
// wrappers that export these all work the same way.
#pragma once

#include <functional>
#include <string>

namespace spritetorch::distributed {

struct DistEnv {
  int rank = 0;  // global rank, in [0, world_size)
  int world_size = 1;
  int local_rank = 0;        // rank on this machine: picks cuda:LOCAL_RANK
  int local_world_size = 1;  // ranks on this machine: splits the CPU cores between them
  std::string master_addr;   // where rank 0's TCPStore listens
  int master_port = 0;
  // torchrun's agent already hosts a TCPStore at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  // every rank then connects as a client, under the key prefix /worker/attempt_<restart count>
  // (TORCHELASTIC_RESTART_COUNT), as torch.distributed does, so a restarted attempt never reads
  // the keys of the one before.
  bool agent_store = false;
  int restart_count = 0;
};

// Looks up one variable; nullptr when unset. Injectable for tests.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

// True when RANK or WORLD_SIZE is set: the process was started as one rank of several.
bool launched_as_rank(const EnvLookup& env);

// Whether this process speaks for the run (its run folder, --print-config): rank 0 or no rank at
// all. RANK as read_dist_env reads it ("00" and " 0" are rank 0); a RANK it refuses counts as 0
// here, and the run then refuses it with the other variables.
bool is_main_rank(const EnvLookup& env);

// Reads and validates the variables. Throws spritetorch::Error naming every missing or malformed
// variable (and rank >= world size) with a hint on how to launch. LOCAL_RANK defaults to RANK and
// LOCAL_WORLD_SIZE to WORLD_SIZE (one machine) when unset.
DistEnv read_dist_env(const EnvLookup& env);

}  // namespace spritetorch::distributed
