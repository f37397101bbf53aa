#include "common/shard_pool.h"

#include <ATen/Parallel.h>

#include "common/cpu_relax.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace spritetorch {

namespace {
constexpr auto kSpinFor = std::chrono::microseconds(200);
// The caller's wait for the workers: longer than a balanced phase's skew (a few us), far shorter
// than a scheduler time slice.
constexpr auto kYieldAfter = std::chrono::microseconds(20);
}  // namespace

ShardPool::ShardPool(int shards) : shards_(std::max(1, shards)), active_(shards_) {
  for (int s = 1; s < shards_; ++s) threads_.emplace_back([this, s] { worker(s); });
}

ShardPool::~ShardPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  unpark_.notify_all();
  for (auto& t : threads_) t.join();
}

void ShardPool::set_threads(int threads) {
  threads = std::clamp(threads, 1, shards_);
  std::unique_lock<std::mutex> lock(mutex_);
  if (threads == active_.load(std::memory_order_relaxed)) return;
  active_.store(threads, std::memory_order_release);
  wake_.notify_all();    // workers that now park
  unpark_.notify_all();  // workers that now run
  // Until then a worker could miss the next run's generation, or take part in it.
  parked_changed_.wait(lock, [&] { return parked_ == shards_ - threads; });
}

void ShardPool::run_shards(int thread, int threads, const std::function<void(int)>& fn,
                           std::exception_ptr& error) {
  for (int shard = thread; shard < shards_; shard += threads) {
    try {
      fn(shard);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
}

void ShardPool::worker(int thread) {
  at::set_num_threads(1);  // each shard is one core's worth of work
  auto parked = [&] { return thread >= active_.load(std::memory_order_acquire); };
  uint64_t seen = 0;
  while (true) {
    if (parked()) {
      std::unique_lock<std::mutex> lock(mutex_);
      ++parked_;
      parked_changed_.notify_all();
      unpark_.wait(lock, [&] { return stopping_.load() || !parked(); });
      --parked_;
      seen = generation_.load(std::memory_order_acquire);  // the runs while parked were not ours
      parked_changed_.notify_all();
      if (stopping_) return;
      continue;
    }
    // Spin for a while, then sleep until the next generation.
    // The clock is read every 64 pauses only: reading it on every turn cost more than the pause.
    const auto spin_until = std::chrono::steady_clock::now() + kSpinFor;
    for (unsigned turn = 1; generation_.load(std::memory_order_acquire) == seen && !parked();
         ++turn) {
      cpu_relax();
      if (turn % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
    }
    if (generation_.load(std::memory_order_acquire) == seen && !parked()) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen || parked() || stopping_; });
    }
    if (stopping_) return;
    if (parked()) continue;  // set_threads between runs: no run is waiting for this thread
    seen = generation_.load(std::memory_order_acquire);
    std::exception_ptr error;
    run_shards(thread, active_.load(std::memory_order_acquire), *task_, error);
    if (error) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = error;
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ShardPool::run(const std::function<void(int)>& fn) {
  const int threads = active_.load(std::memory_order_relaxed);
  std::exception_ptr mine;
  if (threads == 1) {
    run_shards(0, 1, fn, mine);
    if (mine) std::rethrow_exception(mine);
    return;
  }
  task_ = &fn;
  pending_.store(threads - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // pairs with the sleepers' wait
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_shards(0, threads, fn, mine);
  // Spin, then yield between checks: on a loaded machine a worker may wait for a core behind
  // this very thread, and pure spinning made whole runs 5-8x slower (docs/benchmarks.md).
  const auto yield_after = std::chrono::steady_clock::now() + kYieldAfter;
  bool yielding = false;
  for (unsigned turn = 1; pending_.load(std::memory_order_acquire) > 0; ++turn) {
    if (yielding) {
      std::this_thread::yield();
      continue;
    }
    cpu_relax();
    if (turn % 64 == 0) yielding = std::chrono::steady_clock::now() >= yield_after;
  }
  task_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace spritetorch
