#include "train/evaluator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "models/classifier.h"

namespace spritetorch::train {
namespace {

// Evaluation on the fused step's threads: the same logits as one call, each row computed by one
// of the pool's threads, batches too small to split passed through whole, and on fewer threads
// the same shards.
TEST(RowsOverPool, SplitsABatchOverThePoolsThreadsAndGivesTheSameLogits) {
  torch::manual_seed(3);
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  model->eval();
  auto pool = std::make_shared<ShardPool>(2);
  std::atomic<int> calls{0}, largest{0};
  std::mutex seen_mutex;
  std::set<std::thread::id> threads;
  auto counted = [&](const torch::Tensor& x) {
    ++calls;
    largest = std::max<int>(largest, static_cast<int>(x.size(0)));
    {
      std::lock_guard<std::mutex> lock(seen_mutex);
      threads.insert(std::this_thread::get_id());
    }
    EXPECT_TRUE(c10::InferenceMode::is_enabled());  // no graph is recorded on the workers
    return model->forward(x);
  };
  const auto split = rows_over_pool(counted, pool);
  const auto x = torch::rand({1000, 1, 28, 28});
  torch::Tensor whole, parts;
  {
    c10::InferenceMode inference;
    whole = model->forward(x);
    parts = split(x);
  }
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(largest.load(), 500);
  EXPECT_EQ(threads.size(), 2u);
  ASSERT_EQ(parts.sizes(), whole.sizes());
  EXPECT_TRUE(torch::allclose(parts, whole, 1e-5, 1e-5));
  EXPECT_TRUE(parts.argmax(1).equal(whole.argmax(1)));

  calls = 0, largest = 0;
  {
    c10::InferenceMode inference;
    split(x.slice(0, 0, 100));  // fewer than 128 rows: one call
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(largest.load(), 100);

  // The thread governor took a core: the same two shards, on the caller's thread, and the same
  // logits to the bit (one call of all the rows differs from two in the last bits).
  pool->set_threads(1);
  calls = 0;
  threads.clear();
  torch::Tensor on_one;
  {
    c10::InferenceMode inference;
    on_one = split(x);
  }
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_TRUE(on_one.equal(parts));
}

// The whole evaluation through the split forward: the same accuracy and loss as without it.
TEST(RowsOverPool, AnEvaluationThroughItEqualsTheOneWithout) {
  torch::manual_seed(4);
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  data::Dataset test;
  test.inputs = torch::rand({700, 1, 28, 28});
  test.labels = torch::randint(0, 10, {700}, torch::kInt64);
  test.name = "random";
  auto forward = [&](const torch::Tensor& x) { return model->forward(x); };
  data::ResidentLoader plain(test, torch::kCPU, {350, false, false, 1});
  data::ResidentLoader split(test, torch::kCPU, {350, false, false, 1});
  const auto a = evaluate(forward, *model, plain, 10, true);
  const auto b =
      evaluate(rows_over_pool(forward, std::make_shared<ShardPool>(2)), *model, split, 10, true);
  EXPECT_EQ(a.samples, 700);
  EXPECT_DOUBLE_EQ(a.accuracy, b.accuracy);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * a.loss);
  EXPECT_TRUE(a.predictions.equal(b.predictions));
}

}  // namespace
}  // namespace spritetorch::train
