// ShardPool (common/shard_pool.h): every shard runs once per run, on at most the threads set, and
// set_threads moves the shards between threads without losing or repeating one.
#include "common/shard_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace spritetorch {
namespace {

// One run: how often each shard ran, and on how many distinct threads.
struct RunRecord {
  std::vector<int> runs;
  size_t threads = 0;
};

RunRecord record_run(ShardPool& pool) {
  std::vector<std::atomic<int>> runs(pool.size());
  std::mutex mutex;
  std::set<std::thread::id> ids;
  pool.run([&](int shard) {
    runs[shard].fetch_add(1);
    std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  RunRecord out;
  for (auto& r : runs) out.runs.push_back(r.load());
  out.threads = ids.size();
  return out;
}

TEST(ShardPool, EveryShardRunsOnceOnAtMostTheThreadsSet) {
  ShardPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  // Down, up and down again, many runs each: a worker that missed a generation would hang the
  // run, one that took part while parked would run a shard twice.
  for (int threads : {4, 1, 2, 3, 4, 1, 3, 2, 4}) {
    pool.set_threads(threads);
    ASSERT_EQ(pool.threads(), threads);
    for (int run = 0; run < 200; ++run) {
      const RunRecord record = record_run(pool);
      ASSERT_EQ(record.runs, std::vector<int>(4, 1)) << threads << " threads, run " << run;
      ASSERT_LE(record.threads, static_cast<size_t>(threads)) << run;
    }
  }
}

TEST(ShardPool, OneThreadRunsEveryShardOnTheCaller) {
  ShardPool pool(3);
  pool.set_threads(1);
  std::vector<std::thread::id> ids;  // no lock needed: one thread
  pool.run([&](int) { ids.push_back(std::this_thread::get_id()); });
  EXPECT_EQ(ids, std::vector<std::thread::id>(3, std::this_thread::get_id()));
  // The pool goes with two parked workers: its destructor must wake and join them, not hang.
}

TEST(ShardPool, SetThreadsClampsToOneAndTheShards) {
  ShardPool pool(3);
  pool.set_threads(0);
  EXPECT_EQ(pool.threads(), 1);
  pool.set_threads(9);
  EXPECT_EQ(pool.threads(), 3);
  ShardPool single(1);
  single.set_threads(4);
  EXPECT_EQ(single.threads(), 1);
  EXPECT_EQ(record_run(single).runs, std::vector<int>(1, 1));
}

TEST(ShardPool, AnExceptionOnAnyShardReachesTheCallerAndTheOtherShardsStillRun) {
  ShardPool pool(4);
  for (int threads : {4, 2, 1}) {
    pool.set_threads(threads);
    std::vector<std::atomic<int>> ran(4);
    try {
      pool.run([&](int shard) {
        ran[shard].fetch_add(1);
        if (shard == 3) throw std::runtime_error("shard 3");
      });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "shard 3");
    }
    for (int shard = 0; shard < 4; ++shard) EXPECT_EQ(ran[shard].load(), 1) << shard;
    EXPECT_EQ(record_run(pool).runs, std::vector<int>(4, 1));  // the pool still works
  }
}

}  // namespace
}  // namespace spritetorch
