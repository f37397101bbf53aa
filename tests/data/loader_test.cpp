#include "data/loader.h"

#include <gtest/gtest.h>

#include "data/dummy.h"

namespace spritetorch::data {
namespace {

// A dataset whose label is its index, so batches reveal which samples they hold.
Dataset indexed_dataset(int64_t n) {
  Dataset d;
  d.inputs = torch::arange(n, torch::kInt64).to(torch::kUInt8).view({n, 1, 1, 1});
  d.labels = torch::arange(n, torch::kInt64);
  d.class_names = {"a", "b"};
  d.name = "indexed";
  return d;
}

std::vector<torch::Tensor> epoch_labels(Loader& loader, int64_t epoch) {
  std::vector<torch::Tensor> out;
  loader.start_epoch(epoch);
  Batch b;
  while (loader.next(b)) out.push_back(b.labels.clone());
  return out;
}

TEST(EpochOrder, IsAPermutationDeterministicPerSeedAndEpoch) {
  const auto a = epoch_order(1000, 7, 0, true);
  EXPECT_TRUE(torch::equal(std::get<0>(a.sort()), torch::arange(1000, torch::kInt64)));
  EXPECT_TRUE(torch::equal(a, epoch_order(1000, 7, 0, true)));
  EXPECT_FALSE(torch::equal(a, epoch_order(1000, 7, 1, true)));
  EXPECT_FALSE(torch::equal(a, epoch_order(1000, 8, 0, true)));
  EXPECT_TRUE(torch::equal(epoch_order(10, 7, 0, false), torch::arange(10, torch::kInt64)));
}

// Labels 0 x 90, 2 x 10, 5 x 20 (classes 1, 3, 4 absent): rows 0-89, 90-99, 100-119.
torch::Tensor imbalanced_labels() {
  return torch::cat({torch::full({90}, 0, torch::kInt64), torch::full({10}, 2, torch::kInt64),
                     torch::full({20}, 5, torch::kInt64)});
}

TEST(BalancedEpochOrder, EveryPresentClassEquallyOftenEachRowAsEvenlyAsItsClassAllows) {
  const auto labels = imbalanced_labels();
  const auto order = balanced_epoch_order(labels, 7, 0);
  ASSERT_EQ(order.numel(), 120);
  const auto drawn = labels.index_select(0, order);
  for (int64_t c : {0, 2, 5}) EXPECT_EQ(drawn.eq(c).sum().item<int64_t>(), 40) << "class " << c;
  const auto times = torch::bincount(order, {}, 120);  // (120): how often each row is drawn
  EXPECT_TRUE(times.narrow(0, 90, 10).eq(4).all().item<bool>()) << "10 rows, 40 draws";
  EXPECT_TRUE(times.narrow(0, 100, 20).eq(2).all().item<bool>()) << "20 rows, 40 draws";
  EXPECT_EQ(times.narrow(0, 0, 90).eq(1).sum().item<int64_t>(), 40) << "40 of 90, no repeats";
  EXPECT_EQ(times.narrow(0, 0, 90).gt(1).sum().item<int64_t>(), 0);
  // Classes interleaved, not in blocks: the first 30 draws hold more than one class.
  EXPECT_GT(std::get<0>(at::_unique(drawn.narrow(0, 0, 30))).numel(), 1);
  EXPECT_TRUE(torch::equal(order, balanced_epoch_order(labels, 7, 0)));
  EXPECT_FALSE(torch::equal(order, balanced_epoch_order(labels, 7, 1)));
  EXPECT_FALSE(torch::equal(order, balanced_epoch_order(labels, 8, 0)));
}

TEST(BalancedEpochOrder, TheRemainderGoesOneDrawEachToSomeClasses) {
  const auto labels = torch::cat({imbalanced_labels(), torch::full({2}, 0, torch::kInt64)});
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const auto drawn = labels.index_select(0, balanced_epoch_order(labels, 3, epoch));
    ASSERT_EQ(drawn.numel(), 122);
    for (int64_t c : {0, 2, 5}) {
      const auto k = drawn.eq(c).sum().item<int64_t>();
      EXPECT_TRUE(k == 40 || k == 41) << "class " << c << ": " << k;
    }
  }
  // One class only: a permutation, as with natural sampling.
  const auto one = balanced_epoch_order(torch::full({9}, 4, torch::kInt64), 1, 0);
  EXPECT_TRUE(torch::equal(std::get<0>(one.sort()), torch::arange(9, torch::kInt64)));
}

TEST(ResidentLoader, BalancedSamplingServesTheBalancedOrder) {
  Dataset d;
  d.inputs = torch::arange(120, torch::kInt64).to(torch::kUInt8).view({120, 1, 1, 1});
  d.labels = imbalanced_labels();
  d.class_names = {"a", "b", "c", "d", "e", "f"};
  d.name = "imbalanced";
  LoaderOptions options{16, true, false, 5};
  options.class_sampling = ClassSampling::kBalanced;
  ResidentLoader loader(d, torch::kCPU, options);
  EXPECT_EQ(loader.samples_per_epoch(), 120);
  loader.start_epoch(2);
  std::vector<torch::Tensor> rows, labels;
  Batch b;
  while (loader.next(b)) {
    rows.push_back((b.inputs.view({-1}) * 255).round().to(torch::kInt64));
    labels.push_back(b.labels);
  }
  const auto order = balanced_epoch_order(d.labels, 5, 2);
  EXPECT_TRUE(torch::equal(torch::cat(rows), order));
  EXPECT_TRUE(torch::equal(torch::cat(labels), d.labels.index_select(0, order)));
}

TEST(ResidentLoader, EverySampleExactlyOncePerEpochWithShortLastBatch) {
  ResidentLoader loader(indexed_dataset(103), torch::kCPU, {10, true, false, 3});
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  EXPECT_EQ(loader.samples_per_epoch(), 103);
  const auto batches = epoch_labels(loader, 0);
  ASSERT_EQ(batches.size(), 11u);
  EXPECT_EQ(batches.back().size(0), 3);
  const auto all = torch::cat(batches);
  EXPECT_TRUE(torch::equal(std::get<0>(all.sort()), torch::arange(103, torch::kInt64)));
  EXPECT_FALSE(torch::equal(all, torch::arange(103, torch::kInt64))) << "shuffled";
  EXPECT_TRUE(torch::equal(all, epoch_order(103, 3, 0, true))) << "the documented order";
}

TEST(ResidentLoader, DropLastServesOnlyFullBatches) {
  ResidentLoader loader(indexed_dataset(103), torch::kCPU, {10, true, true, 3});
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  EXPECT_EQ(loader.samples_per_epoch(), 100);
  const auto batches = epoch_labels(loader, 2);
  ASSERT_EQ(batches.size(), 10u);
  for (const auto& b : batches) EXPECT_EQ(b.size(0), 10);
  EXPECT_EQ(std::get<0>(at::_unique(torch::cat(batches))).numel(), 100) << "no duplicates";
}

TEST(ResidentLoader, SameSeedSameBatchesOtherEpochOtherOrder) {
  ResidentLoader a(indexed_dataset(50), torch::kCPU, {8, true, false, 11});
  ResidentLoader b(indexed_dataset(50), torch::kCPU, {8, true, false, 11});
  EXPECT_TRUE(torch::equal(torch::cat(epoch_labels(a, 4)), torch::cat(epoch_labels(b, 4))));
  EXPECT_FALSE(torch::equal(torch::cat(epoch_labels(a, 4)), torch::cat(epoch_labels(a, 5))));
}

TEST(ResidentLoader, ConvertsPixelsToUnitRangeAndKeepsFeatures) {
  Dataset d = indexed_dataset(4);
  d.inputs = torch::tensor({0, 51, 255, 102}, torch::kUInt8).view({4, 1, 1, 1});
  ResidentLoader loader(d, torch::kCPU, {4, false, false, 0});
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.inputs.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(b.inputs.flatten(), torch::tensor({0.0f, 0.2f, 1.0f, 0.4f})));
  EXPECT_FALSE(loader.next(b));

  const Dataset dummy = make_dummy_dataset(16, 5);
  ResidentLoader features(dummy, torch::kCPU, {16, false, false, 0});
  features.start_epoch(0);
  ASSERT_TRUE(features.next(b));
  EXPECT_TRUE(torch::equal(b.inputs, dummy.inputs));
}

// The CPU path gathers images itself: a batch the caller still holds must never be overwritten by
// the next, and the values equal the general conversion's (to_model_input).
TEST(ResidentLoader, HeldBatchesStayIntactAndEqualTheGeneralConversion) {
  const int64_t n = 50;
  Dataset d = indexed_dataset(n);
  d.inputs = torch::randint(0, 256, {n, 1, 4, 3}, torch::kUInt8);
  for (bool shuffle : {true, false}) {
    ResidentLoader loader(d, torch::kCPU, {8, shuffle, false, 3});
    loader.start_epoch(1);
    std::vector<Batch> held;
    std::vector<torch::Tensor> copies;
    Batch b;
    while (loader.next(b)) {
      EXPECT_TRUE(torch::equal(b.inputs, to_model_input(d.inputs.index_select(0, b.labels))));
      EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{b.labels.size(0), 1, 4, 3}));
      held.push_back(b);  // shares b's tensors: the loader must not write into them again
      copies.push_back(b.inputs.clone());
    }
    ASSERT_EQ(held.size(), 7u);  // 6 x 8 + 2
    for (size_t i = 0; i < held.size(); ++i)
      EXPECT_TRUE(torch::equal(held[i].inputs, copies[i])) << i;
  }
}

// A batch only the caller's Batch holds is written over by the next (no allocation a step); one
// that anything else still reaches, a view of it included, is left alone.
TEST(ResidentLoader, ReusesABatchNothingElseHoldsAndNoOtherOne) {
  const int64_t n = 40;
  Dataset d = indexed_dataset(n);
  d.inputs = torch::randint(0, 256, {n, 1, 4, 3}, torch::kUInt8);
  ResidentLoader loader(d, torch::kCPU, {8, true, false, 5});
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  const void* inputs = b.inputs.data_ptr();
  const void* labels = b.labels.data_ptr();
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.inputs.data_ptr(), inputs) << "the dropped batch's memory, written again";
  EXPECT_EQ(b.labels.data_ptr(), labels);
  EXPECT_TRUE(torch::equal(b.inputs, to_model_input(d.inputs.index_select(0, b.labels))));

  const torch::Tensor view = b.inputs.view({8, 12});  // another reference to the same memory
  const torch::Tensor kept = view.clone();
  const torch::Tensor kept_labels = b.labels;
  const torch::Tensor labels_copy = b.labels.clone();
  ASSERT_TRUE(loader.next(b));
  EXPECT_NE(b.inputs.data_ptr(), inputs);
  EXPECT_NE(b.labels.data_ptr(), labels);
  EXPECT_TRUE(torch::equal(view, kept)) << "a view of the last batch is not overwritten";
  EXPECT_TRUE(torch::equal(kept_labels, labels_copy));
  EXPECT_TRUE(torch::equal(b.inputs, to_model_input(d.inputs.index_select(0, b.labels))));
}

TEST(DummyData, DeterministicLearnableAndBothClasses) {
  const auto a = make_dummy_dataset(500, 9), b = make_dummy_dataset(500, 9);
  EXPECT_TRUE(torch::equal(a.inputs, b.inputs));
  EXPECT_EQ(a.inputs.sizes(), (std::vector<int64_t>{500, 3}));
  const double positive = a.labels.to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(positive, 0.2);
  EXPECT_LT(positive, 0.8);
}

}  // namespace
}  // namespace spritetorch::data

namespace spritetorch::data {
namespace {

// Every byte value, at lengths that leave every tail of 16- and 8-float vectors: the values
// to_model_input gives, to the bit.
TEST(Uint8ToUnitFloats, GivesToModelInputsValuesAtEveryLength) {
  const auto bytes = torch::arange(300, torch::kInt64).remainder(256).to(torch::kUInt8);
  const auto expected = to_model_input(bytes);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 255, 256, 300}) {
    auto out = torch::full({300}, -1.0f);
    uint8_to_unit_floats(bytes.data_ptr<uint8_t>(), out.data_ptr<float>(), n);
    EXPECT_TRUE(torch::equal(out.narrow(0, 0, n), expected.narrow(0, 0, n))) << n;
    EXPECT_TRUE(out.narrow(0, n, 300 - n).eq(-1.0f).all().item<bool>()) << n << ": wrote past n";
  }
}

// With the step's pool and copy_per_thread: every batch carries one copy per thread, the first
// being the inputs, all equal to what the loader serves without them; without copies, or with the
// pool down to one thread (the thread governor), none.
TEST(ResidentLoader, ThreadCopiesHoldTheBatchForEachThread) {
  torch::manual_seed(3);
  Dataset d = indexed_dataset(150);  // its labels, and images of 1 x 37 x 1 random bytes
  d.inputs = torch::randint(0, 256, {150, 1, 37, 1}, torch::kInt64).to(torch::kUInt8);
  auto pool = std::make_shared<ShardPool>(2);
  LoaderOptions options;
  options.batch_size = 64;
  ResidentLoader reference(d, torch::kCPU, options), copying(d, torch::kCPU, options),
      pooled(d, torch::kCPU, options);
  copying.use_thread_pool(pool, /*copy_per_thread=*/true);
  pooled.use_thread_pool(pool, /*copy_per_thread=*/false);
  reference.start_epoch(2);
  copying.start_epoch(2);
  pooled.start_epoch(2);
  Batch r, c, p;
  int batches = 0;
  const float* first_copy_1 = nullptr;
  while (reference.next(r)) {
    ASSERT_TRUE(copying.next(c));
    ASSERT_TRUE(pooled.next(p));
    ++batches;
    ASSERT_EQ(c.thread_inputs.size(), 2u);
    EXPECT_TRUE(c.thread_inputs[0].is_same(c.inputs));
    EXPECT_FALSE(c.thread_inputs[1].is_same(c.inputs));
    EXPECT_TRUE(torch::equal(c.inputs, r.inputs));
    EXPECT_TRUE(torch::equal(c.thread_inputs[1], r.inputs));
    EXPECT_TRUE(torch::equal(c.labels, r.labels));
    EXPECT_TRUE(p.thread_inputs.empty());
    EXPECT_TRUE(torch::equal(p.inputs, r.inputs));
    // Full batches reuse the copies' memory from one batch to the next.
    if (batches == 1) first_copy_1 = c.thread_inputs[1].data_ptr<float>();
    if (batches == 2) {
      EXPECT_EQ(c.thread_inputs[1].data_ptr<float>(), first_copy_1);
    }
  }
  EXPECT_EQ(batches, 3);
  EXPECT_FALSE(copying.next(c));
  pool->set_threads(1);
  copying.start_epoch(3);
  ASSERT_TRUE(copying.next(c));
  EXPECT_TRUE(c.thread_inputs.empty());
  pool->set_threads(2);
}

}  // namespace
}  // namespace spritetorch::data
