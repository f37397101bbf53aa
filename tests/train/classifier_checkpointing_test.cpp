// --activation-checkpointing for classifiers: the built-in CNNs recompute their convolution stages
// in backward and train to the weights and BatchNorm statistics of the plain run; models without
// such stages, and modules of one's own, refuse it with what to do instead.
#include <gtest/gtest.h>

#include "common/error.h"
#include "device/device.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::error_of;
using spritetorch::testing::ScratchDir;

// (n, 1, 16, 16) noise with a bright square in one of four corners: the corner is the class.
data::Dataset corners(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  data::Dataset d;
  d.inputs = torch::randint(0, 100, {n, 1, 16, 16}, torch::kUInt8);
  d.labels = torch::randint(4, {n}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = d.labels[i].item<int64_t>(), y = (label / 2) * 10, x = (label % 2) * 10;
    d.inputs[i][0].narrow(0, y, 6).narrow(1, x, 6).fill_(255);
  }
  d.class_names = {"nw", "ne", "sw", "se"};
  d.name = "corners";
  return d;
}

TrainConfig config(const ScratchDir& dir, const std::string& save, bool checkpointing) {
  TrainConfig c;
  c.device = "cpu";
  c.epochs = 2;
  c.batch_size = 32;
  c.lr = 0.003;
  c.activation_checkpointing = checkpointing;
  c.save = dir.file(save);
  return c;
}

TEST(ClassifierCheckpointing, CnnsTrainToThePlainRunsWeightsAndStatistics) {
  ScratchDir dir;
  const Datasets data{corners(256, 1), corners(64, 2)};
  for (const std::string model : {"cnn", "fastcnn"}) {
    SCOPED_TRACE(model);
    auto plain_task = ClassifierTask::builtin(model, "ann");
    const auto plain = Trainer(config(dir, model + "_plain.pt", false)).fit(*plain_task, data);
    auto task = ClassifierTask::builtin(model, "ann");
    const auto checkpointed = Trainer(config(dir, model + "_ckpt.pt", true)).fit(*task, data);
    ASSERT_EQ(plain.steps, checkpointed.steps);
    EXPECT_GT(checkpointed.test.accuracy, 0.9);  // chance is 0.25
    EXPECT_NEAR(plain.epochs.back().loss, checkpointed.epochs.back().loss, 1e-5);
    const auto settings = task->settings();
    EXPECT_NE(settings.at(0).second.find("activation checkpointing"), std::string::npos)
        << settings.at(0).second;
    // Weights and BatchNorm's running statistics (updated once a step, not again when a stage
    // runs a second time in backward).
    const auto a = load_checkpoint(dir.file(model + "_plain.pt")),
               b = load_checkpoint(dir.file(model + "_ckpt.pt"));
    spritetorch::testing::expect_close_tensors(a.model, b.model, 1e-4, 1e-6);
  }
}

TEST(ClassifierCheckpointing, RefusedWithoutConvolutionStages) {
  ScratchDir dir;
  const Datasets data{corners(64, 1), corners(16, 2)};
  auto ann = ClassifierTask::builtin("ann", "ann");
  EXPECT_NE(error_of([&] { Trainer(config(dir, "ann.pt", true)).fit(*ann, data); })
                .find("--activation-checkpointing recomputes a CNN's convolution stages in "
                      "backward; --model ann has none"),
            std::string::npos);
  torch::nn::Sequential own(torch::nn::Flatten(), torch::nn::Linear(256, 4));
  ClassifierTask mine(
      own.ptr(), [own](const torch::Tensor& x) mutable { return own->forward(x); }, "mine");
  EXPECT_NE(error_of([&] {
              Trainer(config(dir, "mine.pt", true)).fit(mine, data);
            }).find("it cannot split a module of your own into segments"),
            std::string::npos);
}

// On a GPU the recomputation runs inside the captured step (CUDA graphs, the default there): it
// must train as the eager checkpointed run and the plain one do.
TEST(ClassifierCheckpointingCuda, TrainsWithAndWithoutCudaGraphs) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  ScratchDir dir;
  const Datasets data{corners(256, 1), corners(64, 2)};
  std::vector<Checkpoint> saved;
  const std::vector<std::pair<bool, CudaGraphs>> runs = {
      {true, CudaGraphs::kOn}, {true, CudaGraphs::kOff}, {false, CudaGraphs::kOff}};
  for (const auto& [checkpointing, graphs] : runs) {
    const std::string name = std::string(checkpointing ? "ckpt" : "plain") +
                             (graphs == CudaGraphs::kOn ? "_graphs.pt" : "_eager.pt");
    TrainConfig c = config(dir, name, checkpointing);
    c.device = "cuda";
    c.cuda_graphs = graphs;
    c.drop_last = true;                         // one batch shape, as a graph replays
    c.precision = precision::Precision::kFp32;  // fewer roundings between the runs to tell apart
    // cuDNN's timed search picks each run's algorithms by the clock, so a loaded GPU can give the
    // three runs different ones (most likely why they drifted apart under 16 parallel tests on an
    // H200, where 8 passed). Its heuristics pick the same ones every run.
    c.cudnn_benchmark = false;
    auto task = ClassifierTask::builtin("fastcnn", "ann");
    const auto report = Trainer(c).fit(*task, data);
    EXPECT_GT(report.test.accuracy, 0.9) << name;
    saved.push_back(load_checkpoint(dir.file(name)));
  }
  for (size_t i = 1; i < saved.size(); ++i) {
    SCOPED_TRACE("run " + std::to_string(i));
    spritetorch::testing::expect_close_tensors(saved[0].model, saved[i].model, 1e-3, 1e-4);
  }
}

}  // namespace
}  // namespace spritetorch::train
