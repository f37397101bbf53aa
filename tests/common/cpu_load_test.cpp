// What other processes take of this process's CPUs (common/cpu_load.h), and the threads that
// leaves a fork-join step.
#include "common/cpu_load.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "test_util.h"

namespace spritetorch {
namespace {

const char* kProcStat =
    "cpu  400 10 100 9000 50 5 5 20 0 0\n"
    "cpu0 100 0 50 4500 20 1 2 7 0 0\n"
    "cpu1 200 10 30 4000 10 2 1 3 0 0\n"
    "cpu12 100 0 20 500 20 2 2 10 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n"
    "cpu3 1 2\n";  // too short to be a CPU's line: ignored

TEST(CpuLoad, BusyTicksOfTheAllowedCpusFromProcStat) {
  // user + nice + system + irq + softirq + steal, at 100 ticks a second; idle and iowait are not.
  EXPECT_DOUBLE_EQ(busy_seconds_in_proc_stat(kProcStat, {0}, 100),
                   (100 + 0 + 50 + 1 + 2 + 7) / 100.);
  EXPECT_DOUBLE_EQ(busy_seconds_in_proc_stat(kProcStat, {1, 12}, 100),
                   ((200 + 10 + 30 + 2 + 1 + 3) + (100 + 0 + 20 + 2 + 2 + 10)) / 100.);
  // Every CPU's own line, never the "cpu " total on top of them.
  EXPECT_DOUBLE_EQ(busy_seconds_in_proc_stat(kProcStat, {}, 100), (160 + 246 + 134) / 100.);
  EXPECT_DOUBLE_EQ(busy_seconds_in_proc_stat(kProcStat, {0}, 250), 160 / 250.);
  EXPECT_EQ(busy_seconds_in_proc_stat(kProcStat, {5}, 100), -1);  // not listed
  EXPECT_EQ(busy_seconds_in_proc_stat("", {}, 100), -1);
}

TEST(CpuLoad, OtherProcessesAreTheBusyTimeLessThisProcesssOwn) {
  const CpuTimes from{10.0, 4.0, 100.0};
  EXPECT_NEAR(*other_processes_cpus(from, {10.9, 4.6, 100.5}), (0.9 - 0.6) / 0.5, 1e-9);
  // Tick rounding can make own exceed busy: never below 0.
  EXPECT_EQ(*other_processes_cpus(from, {10.5, 4.6, 100.5}), 0.0);
  EXPECT_FALSE(other_processes_cpus({-1, 0, 0}, {1, 0, 1}));  // unknown
  EXPECT_FALSE(other_processes_cpus(from, from));             // no time passed
  // Under 0.1 s a few 10 ms ticks would read as many CPUs: unknown instead.
  EXPECT_FALSE(other_processes_cpus(from, {10.03, 4, 100.005}));
  // Never more CPUs than were read.
  EXPECT_EQ(*other_processes_cpus({10, 4, 100, 2}, {13, 4, 101, 2}), 2.0);
}

TEST(CpuLoad, ThreadsBesideGiveACoreForEachBusyCpuFromSixTenthsOn) {
  EXPECT_EQ(threads_beside(2, 0.0), 2);
  EXPECT_EQ(threads_beside(2, 0.5), 2);  // a process busy half the time: 2 threads still pay
  EXPECT_EQ(threads_beside(2, 0.6), 1);
  EXPECT_EQ(threads_beside(2, 0.67), 1);  // one busy process beside our two threads
  EXPECT_EQ(threads_beside(2, 1.33), 1);
  EXPECT_EQ(threads_beside(2, 7.0), 1);  // never below 1
  EXPECT_EQ(threads_beside(16, 3.2), 13);
  EXPECT_EQ(threads_beside(16, 2.7), 13);
  EXPECT_EQ(threads_beside(1, 0.0), 1);
  EXPECT_EQ(threads_beside(4, -1.0), 4);
}

TEST(CpuLoad, ReadingsSeeABusyProcessOnThisProcesssCpus) {
  const CpuTimes before = read_cpu_times();
  if (before.busy_s < 0) GTEST_SKIP() << "no /proc/stat here";
  CpuTimes after;
  {
    testing::BusyProcesses busy(1, 5.0);
    ASSERT_EQ(busy.size(), 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const CpuTimes start = read_cpu_times();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    after = read_cpu_times();
    // This process sleeps, the child spins on one of its CPUs: about 1 CPU (more when other
    // processes run too; 0.7 leaves room for /proc/stat's 10 ms ticks and the child's start).
    const auto others = other_processes_cpus(start, after);
    ASSERT_TRUE(others);
    EXPECT_GE(*others, 0.7);
    EXPECT_LT(after.own_s - start.own_s, 0.1);  // a sleeping process uses next to nothing
  }
  EXPECT_GT(after.wall_s, before.wall_s);
}

TEST(CpuLoad, WaitsForThisProcesssSpinningThreadsToStop) {
  // A thread that spins for 0.3 s, as a BLAS worker does after a parallel call: the wait returns
  // only once it has stopped.
  std::atomic<bool> stopped{false};
  std::thread spinner([&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    volatile uint64_t spins = 0;
    while (std::chrono::steady_clock::now() < end) spins = spins + 1;
    stopped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the spinner has started
  const double waited = wait_for_own_threads_to_idle(10.0);
  EXPECT_TRUE(stopped.load());
  EXPECT_GE(waited, 0.2);
  spinner.join();
  // Nothing spins now: two quiet slices and it returns, far inside its limit.
  EXPECT_LT(wait_for_own_threads_to_idle(10.0), 5.0);
  // And never past its limit, whatever spins.
  std::atomic<bool> done{false};
  std::thread endless([&] {
    volatile uint64_t spins = 0;
    while (!done) spins = spins + 1;
  });
  const double limited = wait_for_own_threads_to_idle(0.1);
  done = true;
  endless.join();
  EXPECT_GE(limited, 0.1);
  EXPECT_LT(limited, 5.0);
}

TEST(CpuLoad, CrossCoreTransferTimesALineBetweenTwoCpus) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  // Confined to one CPU there is no second core to pass a line to.
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const auto alone = cross_core_transfer_ns(0.002);
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_FALSE(alone.has_value());
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one CPU";
  const auto start = std::chrono::steady_clock::now();
  const auto ns = cross_core_transfer_ns(0.002);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ns.has_value());
  // No line crosses between cores in under a nanosecond; on a busy machine the partner may wait
  // for a CPU, but never past the probe's one-second limit.
  EXPECT_GT(*ns, 1.0);
  EXPECT_LT(*ns, 1e9);
  EXPECT_LT(took, 2.0);
}

}  // namespace
}  // namespace spritetorch
