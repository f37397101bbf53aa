// A tiny fork-join pool for splitting one training step over the CPU cores.
//
// run(fn) calls fn(0) on the calling thread and fn(1..n-1) on the pool's threads, and returns when
// all are done. Between calls the threads spin briefly (a step is ~0.3 ms: waking a sleeping thread
// would cost a good part of it), then sleep, so an idle pool does not burn a core.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spritetorch {

class ShardPool {
 public:
  explicit ShardPool(int shards);
  ~ShardPool();
  ShardPool(const ShardPool&) = delete;
  ShardPool& operator=(const ShardPool&) = delete;

  int size() const { return shards_; }
  // Exceptions thrown by fn on any shard are rethrown here (the first one).
  void run(const std::function<void(int shard)>& fn);

 private:
  void worker(int shard);

  int shards_;
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
