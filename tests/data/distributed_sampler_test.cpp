// The distributed sampler: disjoint shards that cover each epoch, the same on every rank.
#include "data/distributed_sampler.h"

#include <gtest/gtest.h>

#include <set>

#include "common/error.h"
#include "data/dummy.h"
#include "data/loader.h"

namespace spritetorch::data {
namespace {

std::vector<int64_t> as_vector(const torch::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(DistributedSampler, ShardsAreDisjointAndCoverTheEpoch) {
  const int64_t n = 120, ranks = 4;
  const auto order = epoch_order(n, 7, 0, true);
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < ranks; ++r) {
    const auto shard = as_vector(shard_order(order, r, ranks, false));
    EXPECT_EQ(static_cast<int64_t>(shard.size()), n / ranks);
    seen.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen.count(i), 1u) << "sample " << i;
}

TEST(DistributedSampler, PaddingRepeatsFewerThanRanksSamples) {
  const int64_t n = 10, ranks = 4;  // 3 per rank, 2 padded
  const auto order = epoch_order(n, 3, 1, true);
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < ranks; ++r) {
    const auto shard = as_vector(shard_order(order, r, ranks, false));
    ASSERT_EQ(shard.size(), 3u);
    seen.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 10u) << "every sample seen";
  // The padding is the epoch's first entries again.
  const auto o = as_vector(order);
  EXPECT_EQ(seen.count(o[0]), 2u);
  EXPECT_EQ(seen.count(o[1]), 2u);
}

TEST(DistributedSampler, DroppingKeepsShardsDisjoint) {
  const int64_t n = 10, ranks = 4;  // 2 per rank, 2 dropped
  const auto order = epoch_order(n, 3, 1, true);
  std::set<int64_t> seen;
  for (int64_t r = 0; r < ranks; ++r) {
    const auto shard = as_vector(shard_order(order, r, ranks, true));
    ASSERT_EQ(shard.size(), 2u);
    for (auto i : shard) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_THROW(shard_order(epoch_order(3, 1, 0, true), 0, 4, true), Error);
  EXPECT_THROW(shard_order(order, 4, 4, false), Error);
}

TEST(DistributedSampler, ReshufflesPerEpochTheSameOnEveryRank) {
  // Two "ranks" compute their shards independently, as separate processes would.
  const int64_t n = 64;
  auto shard_of = [&](int64_t rank, int64_t epoch) {
    return as_vector(shard_order(epoch_order(n, 42, epoch, true), rank, 2, false));
  };
  EXPECT_EQ(shard_of(0, 3), shard_of(0, 3));  // deterministic per (seed, epoch)
  EXPECT_NE(shard_of(0, 0), shard_of(0, 1));  // reshuffled
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> all;
    for (auto i : shard_of(0, epoch)) all.insert(i);
    for (auto i : shard_of(1, epoch)) EXPECT_TRUE(all.insert(i).second);
    EXPECT_EQ(all.size(), static_cast<size_t>(n));
  }
}

TEST(DistributedSampler, ResidentLoaderServesOnlyItsShard) {
  const Dataset d = make_dummy_dataset(100, 5);
  std::set<int64_t> seen_rows;
  int64_t total = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    LoaderOptions o{8, true, false, 9};
    o.shard_rank = rank;
    o.shard_count = 3;
    ResidentLoader loader(d, torch::kCPU, o);
    EXPECT_EQ(loader.samples_per_epoch(), 34);  // ceil(100 / 3)
    EXPECT_EQ(loader.batches_per_epoch(), 5);
    loader.start_epoch(2);
    Batch b;
    while (loader.next(b)) {
      total += b.labels.size(0);
      // Identify rows by their feature values (continuous random data: unique).
      for (int64_t i = 0; i < b.inputs.size(0); ++i) {
        const auto match = (d.inputs == b.inputs[i]).all(1).nonzero();
        ASSERT_EQ(match.size(0), 1);
        seen_rows.insert(match[0][0].item<int64_t>());
      }
    }
  }
  EXPECT_EQ(total, 102);
  EXPECT_EQ(seen_rows.size(), 100u);
}

// Local shards: fixed, disjoint, together the whole dataset (padding repeats at most R-1 rows),
// the same split on every call (every rank computes its own), and independent of the epoch.
TEST(DistributedSampler, LocalShardsAreFixedDisjointAndCoverTheData) {
  const Dataset d = make_dummy_dataset(100, 5);
  auto row_of = [&d](const torch::Tensor& sample) {
    const auto match = (d.inputs == sample).all(1).nonzero();
    EXPECT_EQ(match.size(0), 1);
    return match[0][0].item<int64_t>();
  };
  std::multiset<int64_t> rows;
  for (int64_t rank = 0; rank < 3; ++rank) {
    const Dataset shard = local_shard(d, rank, 3, /*seed=*/4, /*drop_tail=*/false);
    ASSERT_EQ(shard.size(), 34);
    EXPECT_NE(shard.name.find("shard " + std::to_string(rank) + "/3"), std::string::npos);
    EXPECT_TRUE(torch::equal(shard.inputs, local_shard(d, rank, 3, 4, false).inputs));
    for (int64_t i = 0; i < shard.size(); ++i) {
      const int64_t row = row_of(shard.inputs[i]);
      EXPECT_EQ(shard.labels[i].item<int64_t>(), d.labels[row].item<int64_t>());
      rows.insert(row);
    }
  }
  std::set<int64_t> distinct(rows.begin(), rows.end());
  EXPECT_EQ(distinct.size(), 100u);
  EXPECT_EQ(rows.size(), 102u);
  // Dropping the tail: 33 each, no row twice.
  std::set<int64_t> dropped;
  for (int64_t rank = 0; rank < 3; ++rank) {
    const Dataset shard = local_shard(d, rank, 3, 4, /*drop_tail=*/true);
    ASSERT_EQ(shard.size(), 33);
    for (int64_t i = 0; i < shard.size(); ++i)
      EXPECT_TRUE(dropped.insert(row_of(shard.inputs[i])).second);
  }
  // Another seed, another split.
  EXPECT_FALSE(
      torch::equal(local_shard(d, 0, 3, 5, false).inputs, local_shard(d, 0, 3, 4, false).inputs));
}

}  // namespace
}  // namespace spritetorch::data
