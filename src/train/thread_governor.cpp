#include "train/thread_governor.h"

#include "common/timer.h"

#include <algorithm>
#include <cstdio>

namespace spritetorch::train {

ThreadGovernor::ThreadGovernor(int max_threads, std::function<void(int)> set_threads,
                               std::function<CpuTimes()> read, std::function<double()> clock)
    : max_threads_(std::max(1, max_threads)),
      set_threads_(std::move(set_threads)),
      read_(std::move(read)),
      clock_(clock ? std::move(clock) : std::function<double()>(steady_seconds)),
      threads_(max_threads_) {
  window_start_ = read_();
  active_ = window_start_.busy_s >= 0 && max_threads_ > 1;
  window_end_ = window_start_.wall_s + kWindowSeconds;
}

ThreadGovernor::~ThreadGovernor() {
  try {
    restore();  // a run that ended by an exception leaves the threads as they were set, too
  } catch (...) {
  }
}

void ThreadGovernor::after_step(int64_t step) {
  if (!active_ || clock_() < window_end_) return;
  const CpuTimes now = read_();
  const auto others = other_processes_cpus(window_start_, now);
  window_start_ = now;
  window_end_ = now.wall_s + kWindowSeconds;
  if (!others) return;
  const int want = threads_beside(max_threads_, *others);
  if (want == threads_) return;
  set_threads_(want);
  changes_.push_back({step, threads_, want, *others});
  threads_ = want;
}

void ThreadGovernor::restore() {
  if (threads_ == max_threads_) return;
  set_threads_(max_threads_);
  threads_ = max_threads_;
}

std::string describe_thread_changes(const std::vector<ThreadChange>& changes, size_t shown) {
  std::string out;
  for (size_t i = 0; i < changes.size() && i < shown; ++i) {
    const ThreadChange& c = changes[i];
    char others[32];
    std::snprintf(others, sizeof(others), "%.1f", c.others);
    out += (i ? ", " : "") + std::to_string(c.from) + " -> " + std::to_string(c.threads) +
           " at step " + std::to_string(c.step) + " (other processes: " + others + " CPUs busy)";
  }
  if (changes.size() > shown)
    out += ", and " + std::to_string(changes.size() - shown) + " more changes";
  return out;
}

}  // namespace spritetorch::train
