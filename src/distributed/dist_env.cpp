#include "distributed/dist_env.h"

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "common/error.h"

namespace spritetorch::distributed {

namespace {

const char* kLaunchHint =
    "start the ranks with `spritetorch launch --nproc-per-node N -- train ...` or `torchrun "
    "--nproc-per-node N --no-python spritetorch train ...`, which set RANK, WORLD_SIZE, "
    "LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

// Parses a whole-string integer in [low, high]; records a problem otherwise.
bool parse_int(const EnvLookup& env, const char* name, long low, long high, int& out,
               std::vector<std::string>& problems) {
  const char* text = env(name);
  if (!text) return false;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 || value < low || value > high) {
    problems.push_back(std::string(name) + "='" + text + "' (expected an integer in [" +
                       std::to_string(low) + ", " + std::to_string(high) + "])");
    return false;
  }
  out = static_cast<int>(value);
  return true;
}

}  // namespace

EnvLookup process_env() {
  return [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
}

bool launched_as_rank(const EnvLookup& env) { return env("RANK") || env("WORLD_SIZE"); }

bool is_main_rank(const EnvLookup& env) {
  int rank = 0;
  std::vector<std::string> problems;
  parse_int(env, "RANK", 0, 1 << 20, rank, problems);
  return rank == 0;
}

DistEnv read_dist_env(const EnvLookup& env) {
  DistEnv out;
  std::vector<std::string> missing, problems;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    if (!env(name) || *env(name) == '\0') missing.push_back(name);
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw Error("distributed training needs the environment variables " + list + " (not set)",
                kLaunchHint);
  }
  constexpr long kMaxRanks = 1 << 20;
  parse_int(env, "WORLD_SIZE", 1, kMaxRanks, out.world_size, problems);
  parse_int(env, "RANK", 0, kMaxRanks, out.rank, problems);
  parse_int(env, "MASTER_PORT", 1, 65535, out.master_port, problems);
  out.local_rank = out.rank;
  out.local_world_size = out.world_size;
  parse_int(env, "LOCAL_RANK", 0, kMaxRanks, out.local_rank, problems);
  parse_int(env, "LOCAL_WORLD_SIZE", 1, kMaxRanks, out.local_world_size, problems);
  out.master_addr = env("MASTER_ADDR");
  if (const char* agent = env("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string text = agent;
    if (text == "True" || text == "true" || text == "1")
      out.agent_store = true;
    else if (!(text == "False" || text == "false" || text == "0" || text.empty()))
      problems.push_back("TORCHELASTIC_USE_AGENT_STORE='" + text + "' (expected True or False)");
  }
  parse_int(env, "TORCHELASTIC_RESTART_COUNT", 0, kMaxRanks, out.restart_count, problems);
  if (!problems.empty()) {
    std::string list;
    for (const auto& p : problems) list += (list.empty() ? "" : "; ") + p;
    throw Error("bad distributed environment: " + list, kLaunchHint);
  }
  if (out.rank >= out.world_size)
    throw Error("RANK=" + std::to_string(out.rank) + " is not below WORLD_SIZE=" +
                    std::to_string(out.world_size) + ": ranks are numbered 0 to WORLD_SIZE-1",
                kLaunchHint);
  if (out.local_rank >= out.local_world_size)
    throw Error("LOCAL_RANK=" + std::to_string(out.local_rank) +
                    " is not below LOCAL_WORLD_SIZE=" + std::to_string(out.local_world_size),
                kLaunchHint);
  return out;
}

}  // namespace spritetorch::distributed
