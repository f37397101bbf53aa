// --micro-batches: each batch's forward and backward in chunks, one optimizer step. The gradient
// is the whole batch's (chunks weighted by their share, uneven ones included), so a run trains to
// the weights of the run without; the fused step, which takes batches whole, refuses it.
#include <gtest/gtest.h>

#include "common/error.h"
#include "device/device.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::error_of;
using spritetorch::testing::ScratchDir;

TrainConfig run(const ScratchDir& dir, const std::string& save, int64_t micro_batches) {
  TrainConfig c;
  c.dataset = "dummy";
  c.model = "ann";
  c.step = StepKind::kAutograd;
  c.epochs = 1;
  c.train_limit = 640;
  c.batch_size = 64;  // three chunks of 22, 22 and 20 samples
  c.device = "cpu";
  c.optimizer = "sgd";  // Adam would hide a gradient of the wrong scale
  c.lr = 0.05;
  c.micro_batches = micro_batches;
  c.save = dir.file(save);
  return c;
}

TEST(MicroBatches, TrainToTheWeightsOfTheWholeBatch) {
  ScratchDir dir;
  const auto whole = run_training(run(dir, "whole.pt", 1));
  const auto split = run_training(run(dir, "split.pt", 3));
  EXPECT_EQ(whole.steps, split.steps);
  EXPECT_NEAR(whole.epochs.at(0).loss, split.epochs.at(0).loss, 1e-5);
  std::string step;
  for (const auto& [key, value] : split.settings)
    if (key == "step") step = value;
  EXPECT_EQ(step, "autograd (3 micro-batches a batch)");
  const auto a = load_checkpoint(dir.file("whole.pt")), b = load_checkpoint(dir.file("split.pt"));
  spritetorch::testing::expect_close_tensors(a.model, b.model, 1e-4, 1e-6);
}

TEST(MicroBatches, RefusedByTheFusedStepAndOverTheBatchSize) {
  ScratchDir dir;
  auto fused = run(dir, "fused.pt", 2);
  fused.step = StepKind::kFused;
  EXPECT_NE(error_of([&] { run_training(fused); })
                .find("--micro-batches splits the autograd step's batches; this run's step is "
                      "fused-mlp"),
            std::string::npos);
  // auto picks the autograd step for it
  auto any = run(dir, "auto.pt", 2);
  any.step = StepKind::kAuto;
  any.train_limit = 128;
  EXPECT_EQ(run_training(any).steps, 2);
  EXPECT_NE(error_of([&] {
              run_training(run(dir, "over.pt", 65));
            }).find("--micro-batches 65: expected 1 to the batch size, 64"),
            std::string::npos);
}

// On a GPU the chunks run inside the captured step (CUDA graphs, the default there).
TEST(MicroBatchesCuda, CapturedAsOneGraphTrainLikeTheWholeBatch) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  ScratchDir dir;
  std::vector<Checkpoint> saved;
  for (const auto& [micro, graphs] : std::vector<std::pair<int64_t, CudaGraphs>>{
           {3, CudaGraphs::kOn}, {3, CudaGraphs::kOff}, {1, CudaGraphs::kOff}}) {
    const std::string name =
        "m" + std::to_string(micro) + (graphs == CudaGraphs::kOn ? "_graphs.pt" : "_eager.pt");
    TrainConfig c = run(dir, name, micro);
    c.device = "cuda";
    c.cuda_graphs = graphs;
    c.precision = precision::Precision::kFp32;
    run_training(c);
    saved.push_back(load_checkpoint(dir.file(name)));
  }
  for (size_t i = 1; i < saved.size(); ++i) {
    SCOPED_TRACE("run " + std::to_string(i));
    spritetorch::testing::expect_close_tensors(saved[0].model, saved[i].model, 1e-3, 1e-5);
  }
}

}  // namespace
}  // namespace spritetorch::train
