// --target-accuracy, --eval-every-steps, --label-smoothing, --test-time-augment and the fastcnn
// model: the pieces of `--recipe fast` (train/recipe.h) that are not a CLI matter.
#include <gtest/gtest.h>

#include "common/error.h"
#include "data/loader.h"
#include "models/classifier.h"
#include "tasks/make_task.h"
#include "tasks/time_to_accuracy.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/evaluator.h"
#include "train/model_state.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

// Seed 003's SimpleNN on the dummy data (64 steps of 64 per epoch), evaluated every 16 steps.
TrainConfig dummy_target_run(double target) {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.optimizer = "sgd";
  c.lr = 0.1;
  c.epochs = 6;
  c.eval_every_steps = 16;
  c.target_accuracy = target;
  return c;
}

TEST(TimeToAccuracy, StopsAtTheFirstEvaluationThatReachesTheTarget) {
  const auto report = run_training(dummy_target_run(0.8));
  ASSERT_TRUE(report.target_reached.has_value());
  EXPECT_TRUE(report.stopped_at_target);
  const EvalPoint& hit = *report.target_reached;
  EXPECT_GE(hit.accuracy, 0.8);
  EXPECT_LT(report.steps, 6 * 64) << "it should not train the whole schedule";
  EXPECT_EQ(hit.step, report.steps) << "no step after the evaluation that reached it";
  ASSERT_FALSE(report.evals.empty());
  EXPECT_EQ(report.evals.back().step, hit.step);
  for (size_t i = 0; i + 1 < report.evals.size(); ++i) {
    EXPECT_LT(report.evals[i].accuracy, 0.8) << "evaluation " << i << " already reached it";
    EXPECT_EQ(report.evals[i + 1].step - report.evals[i].step, 16);
    EXPECT_LE(report.evals[i].train_seconds, report.evals[i + 1].train_seconds);
  }
  EXPECT_DOUBLE_EQ(hit.epoch, static_cast<double>(hit.step) / 64.0);
  EXPECT_LE(hit.train_seconds, report.train_seconds + 1e-9);
  EXPECT_DOUBLE_EQ(report.test.accuracy, hit.accuracy) << "the final report is that evaluation";
}

TEST(TimeToAccuracy, WithoutStoppingTheScheduleRunsToItsEndAndRecordsTheSameStep) {
  const auto stopped = run_training(dummy_target_run(0.8));
  auto c = dummy_target_run(0.8);
  c.stop_at_target = false;
  const auto full = run_training(c);
  ASSERT_TRUE(stopped.target_reached && full.target_reached);
  EXPECT_FALSE(full.stopped_at_target);
  EXPECT_EQ(full.steps, 6 * 64);
  EXPECT_EQ(full.epochs.size(), 6u);
  // Evaluations draw no randomness: the same seed reaches the target at the same step.
  EXPECT_EQ(full.target_reached->step, stopped.target_reached->step);
  EXPECT_DOUBLE_EQ(full.target_reached->accuracy, stopped.target_reached->accuracy);
}

TEST(TimeToAccuracy, AnUnreachedTargetHasNoTime) {
  auto c = dummy_target_run(0.99);
  c.lr = 1e-7;  // learns nothing
  c.epochs = 1;
  const auto report = run_training(c);
  EXPECT_FALSE(report.target_reached.has_value());
  EXPECT_FALSE(report.stopped_at_target);
  EXPECT_EQ(report.steps, 64);
  EXPECT_EQ(report.evals.size(), 4u) << "steps 16, 32, 48 and the epoch's end";
}

TEST(TimeToAccuracy, AStopWithinAnEpochSavesACheckpointThatResumesExactly) {
  ScratchDir dir;
  // Straight: 3 epochs with the same evaluations (they change nothing).
  auto straight = dummy_target_run(0);
  straight.epochs = 3;
  straight.save = dir.file("straight.pt");
  run_training(straight);

  auto first = dummy_target_run(0.8);
  first.epochs = 3;
  first.save = dir.file("stopped.pt");
  const auto stopped = run_training(first);
  ASSERT_TRUE(stopped.stopped_at_target);
  ASSERT_NE(stopped.steps % 64, 0) << "this test needs a stop within an epoch";

  auto rest = dummy_target_run(0);
  rest.epochs = 3;
  rest.model.clear();
  rest.resume = dir.file("stopped.pt");
  rest.save = dir.file("resumed.pt");
  const auto resumed = run_training(rest);
  EXPECT_EQ(resumed.steps, 3 * 64);
  const auto a = load_checkpoint(dir.file("straight.pt")),
             b = load_checkpoint(dir.file("resumed.pt"));
  for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;
}

TEST(TimeToAccuracy, TheBenchFunctionReportsEachSeedAndTheMedians) {
  auto c = dummy_target_run(0.8);
  c.epochs = 2;
  const auto report = run_time_to_accuracy(c, 3);
  ASSERT_EQ(report.runs.size(), 3u);
  EXPECT_EQ(report.runs[0].seed, c.seed);
  EXPECT_EQ(report.runs[2].seed, c.seed + 2);
  std::vector<double> times;
  for (const auto& r : report.runs) {
    EXPECT_GT(r.train_s, 0);
    if (r.reached) times.push_back(r.time_to_target_s);
  }
  EXPECT_EQ(report.reached, static_cast<int>(times.size()));
  ASSERT_FALSE(times.empty());
  EXPECT_DOUBLE_EQ(report.median_time_s, median_of(times));
  EXPECT_LE(report.min_time_s, report.median_time_s);
  EXPECT_GE(report.max_time_s, report.median_time_s);
  EXPECT_THROW(run_time_to_accuracy(dummy_target_run(0), 1), Error);
}

TEST(TimeToAccuracy, MedianOf) {
  EXPECT_EQ(median_of({}), 0);
  EXPECT_EQ(median_of({3, 1, 2}), 2);
  EXPECT_EQ(median_of({4, 1, 3, 2}), 2.5);
}

TEST(TimeToAccuracy, AGeneratorHasNoAccuracyToReach) {
  TrainConfig c;
  c.device = "cpu";
  c.task = TaskKind::kGenerate;
  c.dataset = "sprites";
  c.sprites.count = 64;
  c.epochs = 1;
  c.target_accuracy = 0.5;
  EXPECT_THROW(run_training(c), Error);
}

TEST(LabelSmoothing, TheLossIsTheSmoothedCrossEntropy) {
  torch::manual_seed(3);
  const auto logits = torch::randn({8, 5});
  const auto labels = torch::randint(0, 5, {8}, torch::kInt64);
  const double s = 0.2;
  auto forward = [&logits](const torch::Tensor&) { return logits; };
  const auto loss = classifier_loss(forward, s)({torch::zeros({8, 1}), labels}).loss;
  const auto log_p = torch::log_softmax(logits, 1);
  const auto target = torch::full({8, 5}, s / 5).scatter_(1, labels.unsqueeze(1), 1 - s + s / 5);
  const auto expected = -(target * log_p).sum(1).mean();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6);
  const auto plain = classifier_loss(forward)({torch::zeros({8, 1}), labels}).loss;
  EXPECT_GT(std::abs(plain.item<double>() - loss.item<double>()), 1e-3);
}

TEST(LabelSmoothing, TakesTheAutogradStepAndRefusesTheFusedOne) {
  TrainConfig c;
  c.device = "cpu";
  c.train_limit = 256;
  c.test_limit = 64;
  c.epochs = 1;
  c.dataset = "dummy";
  c.model = "simplenn";
  c.label_smoothing = 0.1;
  const auto report = run_training(c);
  bool autograd = false;
  for (const auto& [k, v] : report.settings) autograd |= (k == "step" && v == "autograd");
  EXPECT_TRUE(autograd) << "the fused MLP step computes plain cross-entropy";
  c.step = StepKind::kFused;
  EXPECT_THROW(run_training(c), Error);
}

TEST(TestTimeFlip, IsTheLogOfTheMeanSoftmaxOfTheImageAndItsMirror) {
  torch::manual_seed(4);
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3));
  auto forward = [&conv](const torch::Tensor& x) { return conv(x).flatten(2).mean(2) * 5; };
  const auto x = torch::randn({4, 1, 6, 6});
  const auto got = flip_averaged(forward)(x);
  const auto expected =
      ((torch::softmax(forward(x), 1) + torch::softmax(forward(x.flip({3})), 1)) / 2).log();
  EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(got, torch::log_softmax(forward(x), 1), 1e-3, 1e-3))
      << "a mirror-sensitive model must be changed by the averaging";
  EXPECT_THROW(flip_averaged(forward)(torch::randn({4, 36})), Error);
}

TEST(TestTimeFlip, TheCheckpointRecordsItAndItsForwardMatchesTheRunsEvaluation) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.dataset = "sprites";
  c.sprites.count = 300;
  c.model = "fastcnn";
  c.epochs = 1;
  c.batch_size = 32;
  c.test_time_augment = "flip";
  c.save = dir.file("flip.pt");
  const auto report = run_training(c);
  const auto checkpoint = load_checkpoint(c.save);
  EXPECT_EQ(checkpoint.meta.at("test_time_augment"), "flip");
  const auto model = model_from_checkpoint(checkpoint, c.save, torch::kCPU);
  const auto test = load_datasets(c).test;
  data::ResidentLoader loader(test, torch::kCPU, {100, false, false, c.seed});
  const auto again =
      evaluate(checkpoint_forward(checkpoint.meta, model), *model, loader, test.num_classes());
  EXPECT_DOUBLE_EQ(again.accuracy, report.test.accuracy);
  EXPECT_NEAR(again.loss, report.test.loss, 1e-6);

  TrainConfig dummy;
  dummy.device = "cpu";
  dummy.dataset = "dummy";
  dummy.model = "simplenn";
  dummy.test_time_augment = "flip";
  EXPECT_THROW(run_training(dummy), Error) << "feature vectors have no mirror image";
}

TEST(FastCnn, TakesImagesOfAnySizeFromEightPixels) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{1, 28, 28}, {4, 16, 16}, {3, 8, 8}}) {
    auto model = models::make_model({"fastcnn", shape, 7});
    std::vector<int64_t> batch = {5};
    batch.insert(batch.end(), shape.begin(), shape.end());
    EXPECT_EQ(model->forward(torch::randn(batch)).sizes(), (std::vector<int64_t>{5, 7}));
  }
  EXPECT_THROW(models::make_model({"fastcnn", {1, 4, 4}, 10}), Error);
  EXPECT_THROW(models::make_model({"fastcnn", {784}, 10}), Error);
  // Names as bench/python_peer.py's FastCNN, so state dicts line up.
  auto model = models::make_model({"fastcnn", {1, 28, 28}, 10});
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names,
            (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight",
                                      "bn2.weight", "bn2.bias", "conv3.weight", "bn3.weight",
                                      "bn3.bias", "fc.weight", "fc.bias"}));
  // fastcnn-wide (--recipe wide): the same layers at 64/128/256 channels.
  auto wide = models::make_model({"fastcnn-wide", {1, 28, 28}, 10});
  const auto params = wide->named_parameters();
  EXPECT_EQ(params["conv1.weight"].sizes(), (std::vector<int64_t>{64, 1, 3, 3}));
  EXPECT_EQ(params["conv3.weight"].sizes(), (std::vector<int64_t>{256, 128, 3, 3}));
  EXPECT_EQ(params["fc.weight"].sizes(), (std::vector<int64_t>{10, 256 * 3 * 3}));
  EXPECT_EQ(wide->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  // fastcnn-2x (--recipe mid): 32/64/128.
  auto mid = models::make_model({"fastcnn-2x", {1, 28, 28}, 10});
  const auto mid_params = mid->named_parameters();
  EXPECT_EQ(mid_params["conv1.weight"].sizes(), (std::vector<int64_t>{32, 1, 3, 3}));
  EXPECT_EQ(mid_params["conv2.weight"].sizes(), (std::vector<int64_t>{64, 32, 3, 3}));
  EXPECT_EQ(mid_params["fc.weight"].sizes(), (std::vector<int64_t>{10, 128 * 3 * 3}));
}

}  // namespace
}  // namespace spritetorch::train
