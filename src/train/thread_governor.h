// Fewer CPU threads while other processes take the cores; the threads the run started with again
// when they leave.
//
// A training step that forks over n threads joins them at its end, so it waits for the slowest;
// when another process holds one of the cores, that thread waits for the scheduler, every step. On
// 2 cores beside one busy process the generator's step took 3.4x its time alone on 2 threads and
// 1.5x on 1 (docs/benchmarks.md, "Beside other processes"). The governor measures what other
// processes take of this process's CPUs over windows of about kWindowSeconds
// (common/cpu_load.h) and, at the end of each, sets the threads threads_beside() gives. The
// trainer runs it on the CPU when no thread count is given (--threads, --blas-threads,
// --step-threads), by --thread-governor (train/config.h): by default only over the fused step's
// shard pool, whose results do not depend on its threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/cpu_load.h"

namespace spritetorch::train {

struct ThreadChange {
  int64_t step = 0;   // the run's optimizer steps when it changed
  int from = 0;       // threads before
  int threads = 0;    // from then on
  double others = 0;  // CPUs that other processes kept busy over the window before
};

// "2 -> 1 at step 120 (other processes: 1.0 CPUs busy), ..." (the first `shown`, then how
// many more); "" for none.
std::string describe_thread_changes(const std::vector<ThreadChange>& changes, size_t shown = 4);

class ThreadGovernor {
 public:
  // Long enough for /proc/stat's 10 ms ticks (2 CPUs x 0.3 s = 60 ticks), short enough to follow
  // a build that starts or ends.
  static constexpr double kWindowSeconds = 0.3;

  // `set_threads` applies a count (1..max_threads); `read` and `clock` are the sources (tests
  // give their own): `clock` must tell the time that `read` puts in wall_s (steady_seconds()).
  ThreadGovernor(int max_threads, std::function<void(int)> set_threads,
                 std::function<CpuTimes()> read = read_cpu_times,
                 std::function<double()> clock = nullptr);
  ~ThreadGovernor();  // restore()s
  ThreadGovernor(const ThreadGovernor&) = delete;
  ThreadGovernor& operator=(const ThreadGovernor&) = delete;

  // After every step (`step`: the run's optimizer steps so far). Reads the clock; at the end of a
  // window also the CPU times, and sets the threads when they should change.
  void after_step(int64_t step);

  // Back to max_threads (the end of a run: what follows it uses the threads as set).
  void restore();

  int threads() const { return threads_; }
  bool active() const { return active_; }  // false where the CPU times cannot be read
  const std::vector<ThreadChange>& changes() const { return changes_; }

 private:
  const int max_threads_;
  std::function<void(int)> set_threads_;
  std::function<CpuTimes()> read_;
  std::function<double()> clock_;
  int threads_;
  bool active_ = true;
  CpuTimes window_start_;
  double window_end_ = 0;  // clock_() when the window closes
  std::vector<ThreadChange> changes_;
};

}  // namespace spritetorch::train
