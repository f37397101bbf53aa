#include "data/streaming_loader.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "data/data_path.h"

namespace spritetorch::data {
namespace {

Dataset indexed_images(int64_t n) {
  Dataset d;
  // Each image's pixels encode its index, so inputs and labels can be checked against each other.
  d.inputs = (torch::arange(n, torch::kInt64) % 256)
                 .to(torch::kUInt8)
                 .view({n, 1, 1, 1})
                 .expand({n, 1, 2, 2})
                 .contiguous();
  d.labels = torch::arange(n, torch::kInt64);
  d.class_names = {"a", "b"};
  d.name = "indexed";
  return d;
}

struct Epoch {
  torch::Tensor inputs, labels;
  std::vector<int64_t> sizes;
};

Epoch run_epoch(Loader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<torch::Tensor> xs, ys;
  Epoch out;
  Batch b;
  while (loader.next(b)) {
    xs.push_back(b.inputs);
    ys.push_back(b.labels);
    out.sizes.push_back(b.labels.size(0));
  }
  out.inputs = torch::cat(xs);
  out.labels = torch::cat(ys);
  return out;
}

TEST(StreamingLoader, SameBatchesAsResidentForEveryWorkerCount) {
  const auto data = indexed_images(1003);
  for (bool drop_last : {false, true}) {
    const LoaderOptions options{64, true, drop_last, 17};
    ResidentLoader resident(data, torch::kCPU, options);
    const auto expected = run_epoch(resident, 3);
    for (int workers : {0, 1, 3}) {
      StreamingLoader streaming(data, torch::kCPU, options, {workers, 2, false});
      EXPECT_EQ(streaming.batches_per_epoch(), resident.batches_per_epoch());
      const auto got = run_epoch(streaming, 3);
      EXPECT_EQ(got.sizes, expected.sizes) << "workers " << workers << " drop_last " << drop_last;
      EXPECT_TRUE(torch::equal(got.labels, expected.labels)) << "workers " << workers;
      EXPECT_TRUE(torch::equal(got.inputs, expected.inputs)) << "workers " << workers;
      EXPECT_EQ(got.inputs.scalar_type(), torch::kFloat32);
    }
  }
}

TEST(StreamingLoader, BalancedSamplingSameBatchesAsResident) {
  auto data = indexed_images(301);
  data.labels = (torch::arange(301, torch::kInt64) % 7).clamp_max(3);  // classes 0-2 x 43, 3 x 172
  LoaderOptions options{32, true, false, 9};
  options.class_sampling = ClassSampling::kBalanced;
  ResidentLoader resident(data, torch::kCPU, options);
  const auto expected = run_epoch(resident, 1);
  for (int workers : {0, 2}) {
    StreamingLoader streaming(data, torch::kCPU, options, {workers, 2, false});
    const auto got = run_epoch(streaming, 1);
    EXPECT_TRUE(torch::equal(got.labels, expected.labels)) << "workers " << workers;
    EXPECT_TRUE(torch::equal(got.inputs, expected.inputs)) << "workers " << workers;
  }
  const auto fourth = expected.labels.eq(3).sum().item<int64_t>();
  EXPECT_TRUE(fourth == 75 || fourth == 76) << fourth << ": 301 / 4, the remainder to one class";
}

TEST(StreamingLoader, WorkersLoseAndDuplicateNothingAcrossEpochs) {
  const auto data = indexed_images(5000);
  StreamingLoader loader(data, torch::kCPU, {32, true, false, 5}, {4, 3, false});
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto got = run_epoch(loader, epoch);
    EXPECT_TRUE(torch::equal(std::get<0>(got.labels.sort()), torch::arange(5000, torch::kInt64)));
    // Inputs travel with their labels.
    EXPECT_TRUE(torch::equal(
        (got.inputs.select(1, 0).select(1, 0).select(1, 0) * 255).round().to(torch::kInt64),
        got.labels % 256));
  }
}

TEST(StreamingLoader, AbandonedEpochRestartsCleanly) {
  const auto data = indexed_images(640);
  StreamingLoader loader(data, torch::kCPU, {10, true, false, 1}, {2, 2, false});
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));  // walk away mid-epoch
  const auto full = run_epoch(loader, 1);
  EXPECT_EQ(full.labels.size(0), 640);
}

TEST(DataPath, AutoIsResidentOnCpuAndBothChoicesAreHonoured) {
  const auto data = indexed_images(100);
  const LoaderOptions options{10, true, false, 1};
  EXPECT_EQ(make_data_path(data, torch::kCPU, options, {}).description, "resident on cpu");
  DataPathOptions host;
  host.data_on = "host";
  host.workers = 3;
  EXPECT_EQ(make_data_path(data, torch::kCPU, options, host).description,
            "streaming: 3 workers, prefetch 2");
  DataPathOptions bad;
  bad.data_on = "gpu";
  EXPECT_THROW(make_data_path(data, torch::kCPU, options, bad), Error);
  // Streaming's options on resident data are named as unused where the settings are shown.
  DataPathOptions resident_with_workers;
  resident_with_workers.workers = 4;
  resident_with_workers.prefetch = 8;
  EXPECT_EQ(make_data_path(data, torch::kCPU, options, resident_with_workers).description,
            "resident on cpu (--workers, --prefetch unused: streaming's, which --data-on host "
            "chooses)");
  resident_with_workers.data_on = "device";
  resident_with_workers.prefetch = 2;
  resident_with_workers.pin_memory = 1;
  EXPECT_EQ(make_data_path(data, torch::kCPU, options, resident_with_workers).description,
            "resident on cpu (--workers, --pin-memory unused: streaming's, which --data-on host "
            "chooses)");
}

}  // namespace
}  // namespace spritetorch::data
