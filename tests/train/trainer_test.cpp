#include "train/trainer.h"

#include <gtest/gtest.h>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "test_util.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

TrainConfig small_fashion_config() {
  TrainConfig c;
  c.device = "cpu";
  c.epochs = 1;
  c.train_limit = 6000;
  c.test_limit = 1000;
  return c;
}

TEST(Trainer, SeedNetworkOnARealSubsetBeatsChanceByFar) {
  SKIP_WITHOUT_FASHION_MNIST();
  const auto report = train(small_fashion_config());
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_EQ(report.epochs[0].samples, 6000);
  EXPECT_EQ(report.test.samples, 1000);
  EXPECT_GT(report.test.accuracy, 0.70) << "chance is 0.10";
  EXPECT_EQ(report.test.confusion.sum().item<int64_t>(), 1000);
  EXPECT_EQ(report.class_names.size(), 10u);
}

TEST(Trainer, CnnTrainsThroughAutograd) {
  SKIP_WITHOUT_FASHION_MNIST();
  auto c = small_fashion_config();
  c.model = "cnn";
  c.train_limit = 2000;
  c.test_limit = 500;
  const auto report = train(c);
  EXPECT_GT(report.test.accuracy, 0.60);
  bool autograd = false;
  std::string threads;
  for (const auto& [k, v] : report.settings) {
    autograd |= (k == "step" && v == "autograd");
    if (k == "threads") threads = v;
  }
  EXPECT_TRUE(autograd);
  // A conv net's default: LibTorch's pool gets the cores, BLAS one thread (cpu_threads.h).
  EXPECT_EQ(threads.rfind(std::to_string(cpu_cores()) + " intra-op, ", 0), 0u) << threads;
  if (current_cpu_threads().blas > 0) {
    EXPECT_NE(threads.find(", 1 BLAS"), std::string::npos) << threads;
  }
}

TEST(Trainer, SimpleNnLearnsTheDummyData) {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.optimizer = "sgd";
  c.lr = 0.1;
  c.epochs = 10;
  c.batch_size = 32;
  const auto report = train(c);
  EXPECT_GT(report.test.accuracy, 0.9);
  EXPECT_LT(report.epochs.back().loss, report.epochs.front().loss);
}

TEST(Trainer, ResumeContinuesExactlyWhereTheRunStopped) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 4;
  c.save = dir.file("straight.pt");
  train(c);

  c.epochs = 2;
  c.save = dir.file("half.pt");
  train(c);
  c.epochs = 4;
  c.model.clear();  // taken from the checkpoint
  c.resume = dir.file("half.pt");
  c.save = dir.file("resumed.pt");
  const auto report = train(c);
  EXPECT_EQ(report.start_epoch, 2);
  EXPECT_EQ(report.epochs.size(), 2u);

  const auto a = load_checkpoint(dir.file("straight.pt")),
             b = load_checkpoint(dir.file("resumed.pt"));
  for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;
  EXPECT_EQ(b.meta.at("epoch").get<int>(), 4);
}

TEST(Trainer, ResumingWithAnotherModelIsAnError) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 1;
  c.save = dir.file("s.pt");
  train(c);
  c.model = "ann";
  c.resume = dir.file("s.pt");
  EXPECT_THROW(train(c), Error);
}

TEST(Trainer, UnavailableDeviceFailsBeforeAnyWork) {
  TrainConfig c;
  c.device = "cuda:9";
  c.dataset = "dummy";
  c.model = "simplenn";
  EXPECT_THROW(train(c), Error);
}

}  // namespace
}  // namespace spritetorch::train
