// The rank environment: what torchrun sets, validated with clear errors.
#include "distributed/dist_env.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include "common/error.h"
#include "distributed/communicator.h"
#include "distributed/launcher.h"

namespace spritetorch::distributed {
namespace {

EnvLookup fake(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

std::map<std::string, std::string> good() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read_dist_env(fake(vars));
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "no error";
}

TEST(DistEnv, ReadsTorchrunVariables) {
  const DistEnv env = read_dist_env(fake(good()));
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(launched_as_rank(fake(good())));
  EXPECT_FALSE(launched_as_rank(fake({})));
}

TEST(DistEnv, TheMainRankIsRankZeroAsTheRunReadsIt) {
  // "00" trained as rank 0 while the run folder compared the text to "0": nobody kept the run.
  for (const std::string zero : {"0", "00", " 0", "+0"})
    EXPECT_TRUE(is_main_rank(fake({{"RANK", zero}}))) << "'" << zero << "'";
  EXPECT_TRUE(is_main_rank(fake({})));
  EXPECT_TRUE(is_main_rank(fake({{"RANK", "x"}})));  // refused by read_dist_env, with its name
  EXPECT_FALSE(is_main_rank(fake({{"RANK", "1"}})));
  EXPECT_FALSE(is_main_rank(fake({{"RANK", "01"}})));
}

TEST(DistEnv, LocalVariablesDefaultToOneMachine) {
  auto vars = good();
  vars.erase("LOCAL_RANK");
  vars.erase("LOCAL_WORLD_SIZE");
  const DistEnv env = read_dist_env(fake(vars));
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
}

TEST(DistEnv, TorchrunAgentStoreAndRestartCount) {
  EXPECT_FALSE(read_dist_env(fake(good())).agent_store);  // spritetorch launch, Slurm: rank 0 hosts
  EXPECT_EQ(read_dist_env(fake(good())).restart_count, 0);
  auto vars = good();
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // what torchrun exports (Python's str(True))
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  DistEnv env = read_dist_env(fake(vars));
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 2);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(read_dist_env(fake(vars)).agent_store);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  vars["TORCHELASTIC_RESTART_COUNT"] = "-1";
  const auto message = error_of(vars);
  EXPECT_NE(message.find("TORCHELASTIC_USE_AGENT_STORE='maybe' (expected True or False)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("TORCHELASTIC_RESTART_COUNT='-1'"), std::string::npos) << message;
}

TEST(DistEnv, MissingVariablesAreNamedWithALaunchHint) {
  auto vars = good();
  vars.erase("MASTER_ADDR");
  vars.erase("MASTER_PORT");
  const auto message = error_of(vars);
  EXPECT_NE(message.find("MASTER_ADDR, MASTER_PORT"), std::string::npos) << message;
  EXPECT_NE(message.find("spritetorch launch"), std::string::npos) << message;
}

TEST(DistEnv, RankMustBeBelowWorldSize) {
  auto vars = good();
  vars["RANK"] = "4";
  EXPECT_NE(error_of(vars).find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos);
}

// Under a second no rendezvous finishes (1e-9 became a 0 s timeout and c10d's raw "timed out after
// 0s"); past a year Gloo's milliseconds overflowed into "[enforce fail ...] Invalid timeout".
TEST(DistEnv, TheDistTimeoutIsASecondToAYear) {
  EXPECT_NO_THROW(check_dist_timeout(1));
  EXPECT_NO_THROW(check_dist_timeout(300));
  EXPECT_NO_THROW(check_dist_timeout(8760 * 3600.0));
  for (double bad : {1e-9, 0.5, 8760 * 3600.0 + 1, 1e300}) {
    try {
      check_dist_timeout(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--dist-timeout must be 1 to 31536000 seconds"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(DistEnv, MalformedNumbersAreRejected) {
  for (const auto& [name, value] : std::map<std::string, std::string>{{"RANK", "one"},
                                                                      {"WORLD_SIZE", "0"},
                                                                      {"MASTER_PORT", "70000"},
                                                                      {"RANK", "-1"},
                                                                      {"LOCAL_RANK", "1x"}}) {
    auto vars = good();
    vars[name] = value;
    const auto message = error_of(vars);
    EXPECT_NE(message.find(name + "='" + value + "'"), std::string::npos) << message;
  }
}

// The wait status of a real child that runs `body`.
template <typename Body>
int status_of_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// A killed rank's peer exits with an error a few milliseconds later; when launch finds both ended
// in one poll it must name the killed one, whatever order waitpid returned them in.
TEST(Launch, ARankKilledByASignalIsReportedBeforeAPeerThatExitedWithAnError) {
  const int killed = status_of_child([] { ::kill(::getpid(), SIGKILL); });
  const int failed = status_of_child([] { ::_exit(2); });
  ASSERT_TRUE(WIFSIGNALED(killed));
  ASSERT_EQ(WEXITSTATUS(failed), 2);
  EXPECT_TRUE(reported_before(killed, failed));
  EXPECT_FALSE(reported_before(failed, killed));
  EXPECT_FALSE(reported_before(failed, failed));  // equals keep their rank order
  EXPECT_FALSE(reported_before(killed, killed));
}

TEST(Launch, ShowsOnlyTheRanksErrorsThatDifferFromTheFirstRanksAndGroupsEqualOnes) {
  const std::string bad_flag = "error: --lr: '-1' is not a number > 0\n";
  const std::string no_gpu = "error: --device cuda:3: there is no such GPU\n";
  // Every rank made the first rank's mistake: it printed it once, nothing more to show.
  EXPECT_TRUE(errors_to_show(bad_flag, {{1, bad_flag}, {2, bad_flag}, {3, bad_flag}}).empty());
  // Ranks that failed otherwise, or said nothing (stopped by the launcher).
  const auto shown = errors_to_show(bad_flag, {{1, no_gpu}, {2, ""}, {3, no_gpu}, {4, "x\n"}});
  ASSERT_EQ(shown.size(), 2u);
  EXPECT_EQ(shown[0].first, (std::vector<int>{1, 3}));
  EXPECT_EQ(shown[0].second, no_gpu);
  EXPECT_EQ(shown[1].first, (std::vector<int>{4}));
  // The first rank printed nothing (stopped before it could): the others' message is shown once.
  const auto alone = errors_to_show("", {{1, bad_flag}, {2, bad_flag}});
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].first, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace spritetorch::distributed
