// A tiny fork-join pool for splitting one training step over the CPU cores.
//
// run(fn) calls fn(0) on the calling thread and fn(1..n-1) on the pool's threads, and returns when
// all are done. Between calls the threads spin briefly (a step is ~0.3 ms: waking a sleeping thread
// would cost a good part of it), then sleep, so an idle pool does not burn a core.
//
// set_threads(k) runs the same n shards on k threads (the caller and k-1 workers; thread j takes
// shards j, j+k, ...), the others asleep. The shards, and so every result, stay the same: only who
// computes them changes. The trainer lowers k while other processes take the cores
// (train/thread_governor.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spritetorch {

// [begin, end) of shard `shard`'s nearly equal part of `n` floats, cut on 16-float (64-byte)
// boundaries so that no two shards write one cache line; the last shard takes the rest.
struct FloatRange {
  int64_t begin, end;
};
inline FloatRange shard_floats_by_lines(int64_t n, int shard, int shards) {
  return {n * shard / shards / 16 * 16,
          shard + 1 == shards ? n : n * (shard + 1) / shards / 16 * 16};
}

class ShardPool {
 public:
  explicit ShardPool(int shards);
  ~ShardPool();
  ShardPool(const ShardPool&) = delete;
  ShardPool& operator=(const ShardPool&) = delete;

  int size() const { return shards_; }
  // Threads that run the shards now, the caller included: 1..size().
  int threads() const { return active_.load(std::memory_order_relaxed); }
  // Clamped to 1..size(). Called between runs, from the thread that calls run(); returns once the
  // workers it parks or wakes have done so.
  void set_threads(int threads);
  // Exceptions thrown by fn on any shard are rethrown here (the first one).
  void run(const std::function<void(int shard)>& fn);

 private:
  void worker(int shard);
  // Runs the shards of thread `thread` (of `threads`): thread, thread + threads, ...
  void run_shards(int thread, int threads, const std::function<void(int)>& fn,
                  std::exception_ptr& error);

  int shards_;
  std::atomic<int> active_;
  int parked_ = 0;  // workers asleep because their index >= active_ (guarded by mutex_)
  std::condition_variable unpark_;          // parked workers wait here, not on wake_
  std::condition_variable parked_changed_;  // set_threads waits here for them
  std::vector<std::thread> threads_;
  const std::function<void(int)>* task_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::exception_ptr error_;
};

}  // namespace spritetorch
