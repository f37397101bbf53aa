// The thread governor (train/thread_governor.h): fewer threads while other processes keep the
// cores busy, all of them again when they stop; in the trainer, over the fused step by default
// (the same weights either way), over a conv net's threads when asked.
#include "train/thread_governor.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/small_gemm.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

// A scripted machine: every step takes 0.125 s (exact in binary, so a window is 3 steps), during
// which other processes keep `others` CPUs busy and this one its own `threads`.
struct FakeMachine {
  double clock = 0, busy = 0, own = 0;
  void step(double others, int threads) {
    clock += 0.125;
    busy += 0.125 * (others + threads);
    own += 0.125 * threads;
  }
  CpuTimes read() const { return {busy, own, clock}; }
};

TEST(ThreadGovernor, FewerThreadsWhileOthersAreBusyAndAllAgainWhenTheyStop) {
  FakeMachine machine;
  std::vector<int> set;
  ThreadGovernor governor(
      2, [&](int threads) { set.push_back(threads); }, [&] { return machine.read(); },
      [&] { return machine.clock; });
  ASSERT_TRUE(governor.active());
  int64_t step = 0;
  auto run = [&](int steps, double others) {
    for (int i = 0; i < steps; ++i) {
      machine.step(others, governor.threads());
      governor.after_step(++step);
    }
  };
  run(6, 0.0);  // idle: two windows, nothing changes
  EXPECT_TRUE(set.empty());
  run(3, 1.0);  // a busy process: the window that ends at step 9 sees it
  EXPECT_EQ(set, std::vector<int>({1}));
  EXPECT_EQ(governor.threads(), 1);
  run(6, 1.0);  // still there: stays at 1
  EXPECT_EQ(set.size(), 1u);
  run(3, 0.0);  // gone
  EXPECT_EQ(set, std::vector<int>({1, 2}));
  ASSERT_EQ(governor.changes().size(), 2u);
  EXPECT_EQ(governor.changes()[0].step, 9);
  EXPECT_EQ(governor.changes()[0].from, 2);
  EXPECT_EQ(governor.changes()[0].threads, 1);
  EXPECT_NEAR(governor.changes()[0].others, 1.0, 1e-9);
  EXPECT_EQ(governor.changes()[1].step, 18);
  EXPECT_NEAR(governor.changes()[1].others, 0.0, 1e-9);
  EXPECT_EQ(describe_thread_changes(governor.changes()),
            "2 -> 1 at step 9 (other processes: 1.0 CPUs busy), "
            "1 -> 2 at step 18 (other processes: 0.0 CPUs busy)");
  EXPECT_EQ(describe_thread_changes(governor.changes(), 1),
            "2 -> 1 at step 9 (other processes: 1.0 CPUs busy), and 1 more changes");
}

TEST(ThreadGovernor, NothingBeforeAWindowEndsAndTheThreadsComeBackAtTheEnd) {
  FakeMachine machine;
  std::vector<int> set;
  int reads = 0;
  {
    ThreadGovernor governor(
        4, [&](int threads) { set.push_back(threads); },
        [&] {
          ++reads;
          return machine.read();
        },
        [&] { return machine.clock; });
    for (int64_t step = 1; step <= 2; ++step) {  // 0.25 s: shorter than a window
      machine.step(3.0, governor.threads());
      governor.after_step(step);
    }
    EXPECT_EQ(reads, 1);  // the constructor's only: /proc/stat is not read every step
    EXPECT_TRUE(set.empty());
    machine.step(3.0, governor.threads());
    governor.after_step(3);
    EXPECT_EQ(set, std::vector<int>({1}));  // 4 cores, 3 CPUs taken
  }
  EXPECT_EQ(set, std::vector<int>({1, 4}));  // the destructor restores the threads
}

TEST(ThreadGovernor, OffWhereTheCpuTimesCannotBeRead) {
  double clock = 0;
  std::vector<int> set;
  ThreadGovernor governor(
      2, [&](int threads) { set.push_back(threads); },
      [&] {
        return CpuTimes{-1, 0, clock};
      },
      [&] { return clock; });
  EXPECT_FALSE(governor.active());
  for (int64_t step = 1; step <= 10; ++step) {
    clock += 0.1;
    governor.after_step(step);
  }
  EXPECT_TRUE(set.empty());
}

// A real run of the fused MLP step beside busy processes: the governor moves the step's shards
// onto fewer threads, and the weights come out bit-identical to the run that keeps its threads.
TEST(ThreadGovernor, TheFusedStepBesideBusyProcessesTrainsTheSameWeightsOnFewerThreads) {
  if (gemm::best_kernel() == gemm::Kernel::loops)
    GTEST_SKIP()
        << "the loops matrix kernel: the fused step is LibTorch's, with no threads to govern";
  SKIP_WITHOUT_FASHION_MNIST();
  if (cpu_cores() < 2) GTEST_SKIP() << "one core: nothing to govern";
  TrainConfig config;
  config.device = "cpu";
  config.epochs = 3;  // long enough for a window (0.3 s) on a fast core
  // Under ASan a step is ~10x slower: a fifth of the data still spans many windows (3 epochs of
  // the whole set took 119 s there beside the busy processes).
  if (testing::kAddressSanitized) config.train_limit = 12000;
  config.eval_every = 0;
  config.test_limit = 1000;
  auto setting = [](const TrainReport& report, const std::string& key) {
    for (const auto& [k, v] : report.settings)
      if (k == key) return v;
    return std::string();
  };
  TrainReport governed, fixed;
  {
    testing::BusyProcesses busy(cpu_cores(), 60.0);
    governed = run_training(config);
    config.thread_governor = ThreadGovernorMode::kOff;
    fixed = run_training(config);
  }
  EXPECT_NE(setting(governed, "step").find("fused-mlp"), std::string::npos);
  EXPECT_EQ(setting(governed, "thread governor").rfind("the step's", 0), 0u);
  EXPECT_NE(setting(governed, "thread governor").find("same results"), std::string::npos);
  EXPECT_EQ(setting(fixed, "thread governor"), "");
  EXPECT_TRUE(fixed.thread_changes.empty());
  // As many busy processes as cores: the first window already sees them.
  ASSERT_FALSE(governed.thread_changes.empty());
  EXPECT_LT(governed.thread_changes.front().threads, governed.thread_changes.front().from);
  EXPECT_GE(governed.thread_changes.front().others, 0.6);
  EXPECT_EQ(governed.epochs.back().loss, fixed.epochs.back().loss);
  EXPECT_EQ(governed.test.loss, fixed.test.loss);
  EXPECT_EQ(governed.test.accuracy, fixed.test.accuracy);
}

// A conv net's intra-op threads split its sums: by default they are kept (and the settings say
// why), --thread-governor on governs them.
TEST(ThreadGovernor, AConvNetsThreadsOnlyWhenAskedFor) {
  if (cpu_cores() < 2) GTEST_SKIP() << "one core: nothing to govern";
  TrainConfig config;
  config.device = "cpu";
  config.dataset = "sprites";  // the CNN's default data: tiny 16x16 images
  config.sprites.count = 64;
  config.epochs = 1;
  const TrainReport automatic = run_training(config);
  config.thread_governor = ThreadGovernorMode::kOn;
  const TrainReport on = run_training(config);
  std::string auto_row, on_row;
  for (const auto& [k, v] : automatic.settings)
    if (k == "thread governor") auto_row = v;
  for (const auto& [k, v] : on.settings)
    if (k == "thread governor") on_row = v;
  const std::string threads = "the " + std::to_string(cpu_cores()) + " intra-op threads";
  EXPECT_EQ(auto_row, "off: " + threads +
                          " split this model's sums, so fewer would change its last bits "
                          "(--thread-governor on: fewer while other processes take the cores)");
  EXPECT_EQ(on_row, threads +
                        ": fewer while other processes take the cores, last bits then vary "
                        "(--thread-governor off keeps them)");
}

// Given counts are kept by default; --thread-governor on beside them, which could not act, is
// refused before any work rather than dropped.
TEST(ThreadGovernor, GivenThreadCountsAreKeptAndOnBesideThemIsRefused) {
  if (gemm::best_kernel() == gemm::Kernel::loops)
    GTEST_SKIP()
        << "the loops matrix kernel: the fused step is LibTorch's, with no threads to govern";
  if (cpu_cores() < 2) GTEST_SKIP() << "one core: nothing to govern";
  TrainConfig config;
  config.device = "cpu";
  config.model = "simplenn";
  config.dataset = "dummy";
  config.epochs = 1;
  for (int which = 0; which < 3; ++which) {
    TrainConfig c = config;
    (which == 0 ? c.threads : which == 1 ? c.blas_threads : c.step_threads) = 1;
    const TrainReport report = run_training(c);
    for (const auto& [k, v] : report.settings) EXPECT_NE(k, "thread governor") << which;
    EXPECT_TRUE(report.thread_changes.empty());
    c.thread_governor = ThreadGovernorMode::kOn;
    try {
      run_training(c);
      ADD_FAILURE() << "--thread-governor on with a given count ran (" << which << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot lower thread counts that were given"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace spritetorch::train
