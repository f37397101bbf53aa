// End-to-end mixed precision through train(): bf16 on the CPU against fp32.
#include <gtest/gtest.h>

#include "common/error.h"
#include "test_util.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

std::string setting(const TrainReport& report, const std::string& key) {
  for (const auto& [k, v] : report.settings)
    if (k == key) return v;
  return {};
}

TEST(PrecisionTrainer, Bf16OnCpuReachesFp32AccuracyWithinOnePoint) {
  SKIP_WITHOUT_FASHION_MNIST();
  TrainConfig c;
  c.device = "cpu";
  c.epochs = 2;
  c.train_limit = 10000;
  c.test_limit = 2000;
  const auto fp32 = train(c);
  c.precision = "bf16";
  const auto bf16 = train(c);
  EXPECT_EQ(setting(fp32, "precision"), "fp32");
  EXPECT_NE(setting(bf16, "precision").find("bf16 autocast"), std::string::npos);
  EXPECT_EQ(setting(bf16, "step"), "autograd");
  EXPECT_GT(bf16.test.accuracy, 0.75);
  EXPECT_NEAR(bf16.test.accuracy, fp32.test.accuracy, 0.01);
}

TEST(PrecisionTrainer, Bf16CnnTrainsAndClipsOnTheCpu) {
  SKIP_WITHOUT_FASHION_MNIST();
  TrainConfig c;
  c.device = "cpu";
  c.model = "cnn";
  c.epochs = 1;
  c.train_limit = 2000;
  c.test_limit = 500;
  c.precision = "bf16";
  c.clip_grad_norm = 1.0;
  const auto report = train(c);
  EXPECT_GT(report.test.accuracy, 0.6);
  EXPECT_NE(setting(report, "precision").find("clip grad norm 1"), std::string::npos);
}

TEST(PrecisionTrainer, Fp16OnCpuIsRefusedBeforeAnyWork) {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.precision = "fp16";
  EXPECT_THROW(train(c), Error);
}

TEST(PrecisionTrainer, CheckpointRecordsThePrecisionAndResumesInAnother) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.optimizer = "sgd";
  c.lr = 0.1;
  c.epochs = 2;
  c.precision = "bf16";
  c.save = dir.file("bf16.ckpt");
  train(c);
  const auto checkpoint = load_checkpoint(c.save);
  EXPECT_EQ(checkpoint.meta.at("precision"), "bf16");
  EXPECT_FALSE(checkpoint.meta.contains("grad_scaler")) << "bf16 needs no loss scaling";
  c.resume = c.save;
  c.save.clear();
  c.precision = "fp32";
  c.epochs = 3;
  const auto resumed = train(c);
  EXPECT_EQ(resumed.start_epoch, 2);
  EXPECT_GT(resumed.test.accuracy, 0.8);
}

}  // namespace
}  // namespace spritetorch::train
