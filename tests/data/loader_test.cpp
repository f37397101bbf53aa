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
