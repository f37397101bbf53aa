// The library's promise to a user who brings a module and data of their own: a mistake in either
// is an Error naming what was expected and what was found, before any training, and options,
// frozen layers and gradient guards behave as they do in PyTorch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "common/error.h"
#include "device/device.h"
#include "precision/precision.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::error_of;
using spritetorch::testing::ScratchDir;

// (B, 1, 8, 8) uint8 -> (B, classes) logits.
struct TinyNetImpl : torch::nn::Module {
  explicit TinyNetImpl(int64_t classes) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(4 * 4 * 4, classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc(torch::max_pool2d(torch::relu(conv(x)), 2).flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TinyNet);

// Bright and dark 8x8 images, labelled 1 and 0.
data::Dataset bars(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  data::Dataset d;
  d.labels = torch::randint(2, {n}, torch::kInt64);
  d.inputs =
      (d.labels.view({n, 1, 1, 1}) * 150 + torch::randint(100, {n, 1, 8, 8})).to(torch::kUInt8);
  d.class_names = {"dark", "bright"};
  d.name = "bars";
  return d;
}

TrainConfig tiny_config() {
  TrainConfig c;
  c.device = "cpu";
  c.epochs = 1;
  c.batch_size = 32;
  c.lr = 0.01;
  return c;
}

std::string fit_error(Datasets data, int64_t classes = 2, TrainConfig c = tiny_config()) {
  ClassifierTask task(TinyNet(classes), "tiny");
  return error_of([&] { Trainer(c).fit(task, data); });
}

// A module kept in float64: autocast leaves its operations as they are, so --precision bf16 would
// change nothing (it trained bit for bit as fp32 while the row said "bf16 autocast, fp32
// weights"). Refused; auto and fp32 train it in float64 and the row says so.
struct DoubleNetImpl : torch::nn::Module {
  DoubleNetImpl() { fc = register_module("fc", torch::nn::Linear(64, 2)); }
  torch::Tensor forward(torch::Tensor x) {
    return fc(x.flatten(1).to(torch::kFloat64)).to(torch::kFloat32);
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(DoubleNet);

TEST(UserModule, AFloat64ModelTrainsInItsOwnDtypeAndRefusesBf16) {
  const Datasets data{bars(128, 1), bars(32, 2)};
  TrainConfig c = tiny_config();
  c.precision = precision::Precision::kBf16;
  {
    DoubleNet net;
    net->to(torch::kFloat64);
    ClassifierTask task(net, "double");
    EXPECT_EQ(error_of([&] { Trainer(c).fit(task, data); }),
              "--precision bf16 changes nothing for this model: its weights are float64, and "
              "autocast leaves float64 operations as they are");
  }
  for (auto asked : {precision::Precision::kAuto, precision::Precision::kFp32}) {
    DoubleNet net;
    net->to(torch::kFloat64);
    ClassifierTask task(net, "double");
    c.precision = asked;
    const TrainReport report = Trainer(c).fit(task, data);
    std::string row;
    for (const auto& [key, value] : report.settings)
      if (key == "precision") row = value;
    EXPECT_EQ(row.rfind("float64 weights and operations, the model's own", 0), 0u) << row;
    EXPECT_EQ(net->fc->weight.scalar_type(), torch::kFloat64);
  }
}

TEST(UserModule, LabelsThatDoNotMatchTheSamplesAreRefusedBeforeAnyWork) {
  Datasets data{bars(128, 1), bars(32, 2)};
  data.train.labels = data.train.labels.narrow(0, 0, 100).clone();  // read past its end before
  EXPECT_EQ(fit_error(data),
            "the training set 'bars': expected one label per sample: labels of shape (128), found "
            "labels of shape [100] for inputs of shape [128, 1, 8, 8]");
  data = {bars(128, 1), bars(32, 2)};
  data.test.labels[3] = 7;
  EXPECT_EQ(fit_error(data),
            "the test set 'bars': expected labels in 0..1 (its 2 class names), found label 7");
  data = {bars(128, 1), bars(32, 2)};
  data.train.labels = data.train.labels.to(torch::kFloat32);
  EXPECT_EQ(fit_error(data),
            "the training set 'bars': expected integer class indices as labels, found Float "
            "labels");
  data = {bars(128, 1), bars(32, 2)};
  data.test.inputs = torch::zeros({32, 1, 16, 16}, torch::kUInt8);  // failed after the training
  EXPECT_EQ(fit_error(data),
            "the test set 'bars': expected samples of the training set's shape [1, 8, 8], found "
            "samples of shape [1, 16, 16]");
  data = {bars(128, 1), bars(32, 2)};
  data.test.class_names = {"a", "b"};
  EXPECT_NE(fit_error(data).find("expected the training set's 2 classes"), std::string::npos);
}

// Logits for 5 classes on 2 counted predictions of class 4 as another class's; for 3 classes the
// run failed in the final evaluation.
TEST(UserModule, LogitsOfAnotherWidthThanTheClassesAreRefusedBeforeAnyWork) {
  const Datasets data{bars(64, 1), bars(32, 2)};
  EXPECT_EQ(fit_error(data, 5),
            "the model's forward maps a batch of bars of shape [2, 1, 8, 8] (Float) to a tensor of "
            "shape [2, 5] (Float); a classifier gives float logits of shape (2, 2) here, one per "
            "class of bars");
  EXPECT_EQ(fit_error(data, 2), "");
}

// A frozen layer is not the optimizer's: weight decay leaves it as it is, as PyTorch's optimizers
// do for parameters they were not given.
TEST(UserModule, FrozenParametersStayAsTheyAreUnderWeightDecay) {
  TinyNet net(2);
  for (auto& p : net->conv->parameters()) p.set_requires_grad(false);
  const auto conv_before = net->conv->weight.clone(), fc_before = net->fc->weight.clone();
  TrainConfig c = tiny_config();
  c.optimizer = "adamw";
  c.weight_decay = 0.5;
  ClassifierTask task(net, "tiny");
  Trainer(c).fit(task, {bars(128, 1), bars(32, 2)});
  EXPECT_TRUE(torch::equal(net->conv->weight, conv_before));
  EXPECT_FALSE(torch::equal(net->fc->weight, fc_before));
  for (auto& p : net->fc->parameters()) p.set_requires_grad(false);
  ClassifierTask frozen(net, "tiny");
  EXPECT_EQ(error_of([&] {
              Trainer(c).fit(frozen, {bars(128, 1), bars(32, 2)});
            }),
            "every parameter of the model has requires_grad false: there is nothing to train");
}

// A caller's NoGradGuard does not stop the training, and afterwards the module's gradients are its
// own: another optimizer may zero them (they were views of the run's flat buffer).
TEST(UserModule, FitUnderNoGradTrainsAndLeavesGradientsAnotherOptimizerCanUse) {
  TinyNet net(2);
  ClassifierTask task(net, "tiny");
  TrainConfig c = tiny_config();
  c.epochs = 3;
  TrainReport report;
  {
    torch::NoGradGuard no_grad;
    report = Trainer(c).fit(task, {bars(256, 1), bars(64, 2)});
  }
  EXPECT_GT(report.test.accuracy, 0.9);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  EXPECT_NO_THROW(sgd.zero_grad());
}

// TrainConfig's label smoothing and test-time flips reach a task fit() is given, as the CLI's flags
// do; a value the task cannot honour is refused.
TEST(UserModule, TheConfigsClassifierOptionsReachTheTask) {
  ClassifierTask task(TinyNet(2), "tiny");
  TrainConfig c = tiny_config();
  c.label_smoothing = 0.2;
  c.test_time_augment = "flip";
  const auto report = Trainer(c).fit(task, {bars(64, 1), bars(32, 2)});
  EXPECT_DOUBLE_EQ(task.options().label_smoothing, 0.2);
  EXPECT_TRUE(task.options().flip_at_test);
  bool said = false;
  for (const auto& [key, value] : report.settings) said |= key == "test-time augment";
  EXPECT_TRUE(said);
  c.test_time_augment = "bogus";
  ClassifierTask other(TinyNet(2), "tiny");
  EXPECT_EQ(error_of([&] {
              Trainer(c).fit(other, {bars(64, 1), bars(32, 2)});
            }),
            "--test-time-augment bogus: expected none or flip");
}

// A task of the user's own whose step returns something the Trainer cannot use.
enum class BadStep { kVectorLoss, kDetachedLoss, kNoCount };
class BadStepTask : public ClassifierTask {
 public:
  explicit BadStepTask(BadStep bad, bool has_accuracy = true)
      : ClassifierTask(TinyNet(2), "tiny"), bad_(bad), has_accuracy_(has_accuracy) {}
  TaskTraits traits() const override {
    TaskTraits t = ClassifierTask::traits();
    t.has_accuracy = has_accuracy_;
    return t;
  }
  StepLoss training_step(const data::Batch& batch) override {
    StepLoss out = ClassifierTask::training_step(batch);
    switch (bad_) {
      case BadStep::kVectorLoss:
        out.loss = out.loss.expand({batch.inputs.size(0)});
        break;
      case BadStep::kDetachedLoss:
        out.loss = out.loss.detach();
        break;
      case BadStep::kNoCount:
        out.correct = torch::Tensor();
        break;
    }
    return out;
  }

 private:
  BadStep bad_;
  bool has_accuracy_;
};

TEST(UserModule, AStepWhoseLossTheTrainerCannotDifferentiateIsNamed) {
  BadStepTask vector(BadStep::kVectorLoss);
  EXPECT_EQ(error_of([&] {
              Trainer(tiny_config()).fit(vector, {bars(64, 1), bars(32, 2)});
            }),
            "the task's training_step returned a loss of shape [32] (Float); the Trainer needs one "
            "floating-point number that depends on the parameters");
  BadStepTask detached(BadStep::kDetachedLoss);
  EXPECT_EQ(
      error_of([&] {
        Trainer(tiny_config()).fit(detached, {bars(64, 1), bars(32, 2)});
      }),
      "the task's training_step returned a loss of shape [] (Float, not connected to the "
      "parameters); the Trainer needs one floating-point number that depends on the parameters");
}

// A training accuracy of 0 would read as measured: a step without a count needs the traits to say
// the task has no accuracy, and then trains.
TEST(UserModule, AStepThatCountsNothingNeedsATaskWithoutAccuracy) {
  BadStepTask uncounted(BadStep::kNoCount);
  EXPECT_EQ(error_of([&] {
              Trainer(tiny_config()).fit(uncounted, {bars(64, 1), bars(32, 2)});
            }),
            "the task's training_step returned no `correct`, but its traits() say it has an "
            "accuracy (TaskTraits::has_accuracy, true by default)");
  BadStepTask loss_only(BadStep::kNoCount, /*has_accuracy=*/false);
  const TrainReport report = Trainer(tiny_config()).fit(loss_only, {bars(64, 1), bars(32, 2)});
  EXPECT_FALSE(report.has_accuracy);
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(report.epochs[0].loss));
}

TEST(UserModule, NamesOfTheBuiltInModelsAreRefused) {
  // A checkpoint's model name tells a user's module from ours: "script" made save() read a
  // TorchScript archive the module does not have (a crash after training), "cnn" made the
  // checkpoint read back as the built-in CNN.
  for (const std::string name : {"script", "script:net.pt", "cnn", "ann", "simplenn", ""})
    EXPECT_NE(error_of([&] {
                ClassifierTask task(TinyNet(2), name);
              }).find("names one of spritetorch's own models"),
              std::string::npos)
        << name;
}

// (B, 1, 8, 8) -> (B, 2), flattening a convolution's output with .view(): fine in NCHW, an error
// on channels_last tensors (the second convolution's input has channels to be last).
struct ViewNetImpl : torch::nn::Module {
  ViewNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    conv2 =
        register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(4 * 4 * 4, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv2(torch::relu(conv(x)))), 2);
    return fc(x.view({x.size(0), -1}));
  }
  torch::nn::Conv2d conv{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ViewNet);

TEST(UserModule, AModuleThatCannotRunChannelsLastTrainsInNchwAndLeavesAsItCame) {
  ViewNet net;
  ClassifierTask task(net, "viewnet");
  const auto report = Trainer(tiny_config()).fit(task, {bars(128, 1), bars(32, 2)});
  EXPECT_TRUE(std::isfinite(report.epochs.at(0).loss));
  std::string format;
  for (const auto& [key, value] : report.settings)
    if (key == "memory format") format = value;
  if (device::channels_last_pays(torch::kCPU)) {
    EXPECT_NE(format.find("NCHW: the model's step fails on channels_last tensors"),
              std::string::npos)
        << format;
  }
  // The caller's own forward works after fit, as before it.
  EXPECT_TRUE(net->conv2->weight.is_contiguous());
  EXPECT_EQ(net->forward(torch::rand({3, 1, 8, 8})).sizes(), (std::vector<int64_t>{3, 2}));
  // A module that runs channels_last trains so, and is given back NCHW too.
  TinyNet tiny(2);
  ClassifierTask plain(tiny, "tiny");
  Trainer(tiny_config()).fit(plain, {bars(128, 1), bars(32, 2)});
  EXPECT_TRUE(tiny->conv->weight.is_contiguous());
}

// (B, 1, 8, 8) -> (B, 2) through BatchNorm: a batch of one sample cannot train.
struct NormNetImpl : torch::nn::Module {
  NormNetImpl() {
    fc = register_module("fc", torch::nn::Linear(64, 8));
    norm = register_module("norm", torch::nn::BatchNorm1d(8));
    out = register_module("out", torch::nn::Linear(8, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return out(torch::relu(norm(fc(x.flatten(1))))); }
  torch::nn::Linear fc{nullptr}, out{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(NormNet);

TEST(UserModule, AnErrorInTheStepNamesTheEpochStepAndBatch) {
  ClassifierTask task(NormNet(), "norm");
  std::string error;
  try {
    Trainer(tiny_config()).fit(task, {bars(33, 1), bars(32, 2)});
  } catch (const Error& e) {
    error = std::string(e.what()) + "\nhint: " + e.hint();
  }
  EXPECT_NE(
      error.find("epoch 1, step 2: the training step failed on a batch of shape [1, 1, 8, 8]"),
      std::string::npos)
      << error;
  EXPECT_NE(error.find("drop_last (--drop-last) leaves a partial batch out"), std::string::npos)
      << error;
  auto c = tiny_config();
  c.drop_last = true;
  ClassifierTask dropped(NormNet(), "norm");
  EXPECT_EQ(Trainer(c).fit(dropped, {bars(33, 1), bars(32, 2)}).steps, 1);
}

// (B, 1, 8, 8) -> (B, 2), throwing its own std::runtime_error (not TORCH_CHECK's c10::Error) on a
// batch of `fails_on` samples.
struct ThrowingNetImpl : torch::nn::Module {
  explicit ThrowingNetImpl(int64_t fails_on) : fails_on(fails_on) {
    fc = register_module("fc", torch::nn::Linear(64, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (x.size(0) == fails_on) throw std::runtime_error("my model's own check failed");
    return fc(x.flatten(1));
  }
  int64_t fails_on;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ThrowingNet);

TEST(UserModule, AnErrorOfItsOwnTypeInTheStepOrFirstForwardSaysWhereAndLeavesTheModeAsItWas) {
  ThrowingNet late(1);  // the partial last batch of 33 samples at batch 32: step 2
  ClassifierTask task(late, "throwing");
  const std::string error = error_of([&] {
    Trainer(tiny_config()).fit(task, {bars(33, 1), bars(32, 2)});
  });
  EXPECT_NE(error.find("epoch 1, step 2: the training step failed on a batch of shape "
                       "[1, 1, 8, 8]: my model's own check failed"),
            std::string::npos)
      << error;
  ThrowingNet early(2);  // fit's first forward, on 2 training samples, in eval mode
  ASSERT_TRUE(early->is_training());
  ClassifierTask first(early, "throwing");
  const std::string refused = error_of([&] {
    Trainer(tiny_config()).fit(first, {bars(33, 1), bars(32, 2)});
  });
  EXPECT_NE(refused.find("the model's forward fails on a batch of"), std::string::npos) << refused;
  EXPECT_NE(refused.find("my model's own check failed"), std::string::npos) << refused;
  EXPECT_TRUE(early->is_training());
}

TEST(UserModule, ATestSetWithInputsOrLabelsAloneIsRefused) {
  auto test = bars(32, 2);
  test.labels = torch::Tensor();
  EXPECT_NE(fit_error({bars(128, 1), test}).find("inputs but no labels"), std::string::npos);
  test = bars(32, 2);
  test.inputs = torch::Tensor();
  EXPECT_NE(fit_error({bars(128, 1), test}).find("labels but no inputs"), std::string::npos);
}

TEST(UserModule, ConfigValuesTheFlagsRefuseAreRefusedByFit) {
  const Datasets data{bars(64, 1), bars(32, 2)};
  auto with = [&](auto change) {
    TrainConfig c = tiny_config();
    change(c);
    return fit_error(data, 2, c);
  };
  EXPECT_NE(with([](TrainConfig& c) {
              c.clip_grad_norm = -1;
            }).find("--clip-grad-norm (clip_grad_norm) must be a number >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(with([](TrainConfig& c) { c.clip_grad_norm = std::nan(""); }).find("clip_grad_norm"),
            std::string::npos);
  EXPECT_NE(with([](TrainConfig& c) { c.target_accuracy = 1.5; }).find("target_accuracy"),
            std::string::npos);
  EXPECT_NE(with([](TrainConfig& c) { c.log_every = -1; }).find("log_every"), std::string::npos);
  EXPECT_NE(with([](TrainConfig& c) { c.threads = -2; }).find("threads"), std::string::npos);
  EXPECT_NE(with([](TrainConfig& c) {
              c.model = "cnn";
            }).find("names a built-in model; this task trains the module it was given"),
            std::string::npos);
  EXPECT_NE(with([](TrainConfig& c) { c.task = TaskKind::kGenerate; }).find("ClassifierTask"),
            std::string::npos);
}

TEST(UserModule, DataGivenInMemoryIsRecordedAsSuchNotAsTheConfigsDefault) {
  // The config's dataset defaults to fashion-mnist; a checkpoint of data built in memory recorded
  // it, so that eval loaded Fashion-MNIST for it and a resume on Fashion-MNIST passed the check.
  ScratchDir dir;
  TrainConfig c = tiny_config();
  c.save = dir.file("bars.pt");
  ClassifierTask task(TinyNet(2), "tiny");
  Trainer(c).fit(task, {bars(64, 1), bars(32, 2)});
  EXPECT_EQ(load_checkpoint(c.save).meta.at("dataset"), kInMemoryDataset);

  TrainConfig resume = tiny_config();
  resume.resume = c.save;
  resume.epochs = 2;
  ClassifierTask again(TinyNet(2), "tiny");
  const std::string wrong = error_of([&] {
    Trainer(resume).fit(again, {bars(64, 1), bars(32, 2), "fashion-mnist"});
  });
  EXPECT_NE(wrong.find("was trained on in-memory; this run has --dataset fashion-mnist"),
            std::string::npos)
      << wrong;
  EXPECT_EQ(Trainer(resume).fit(again, {bars(64, 1), bars(32, 2)}).steps, 4);  // 2 a epoch

  // A source of the caller's is recorded as given.
  TrainConfig named = tiny_config();
  named.save = dir.file("named.pt");
  ClassifierTask other(TinyNet(2), "tiny");
  Trainer(named).fit(other, {bars(64, 1), bars(32, 2), "bars"});
  EXPECT_EQ(load_checkpoint(named.save).meta.at("dataset"), "bars");

  TrainConfig by_name;
  by_name.dataset = kInMemoryDataset;
  EXPECT_NE(error_of([&] { load_datasets(by_name); }).find("cannot be loaded by name"),
            std::string::npos);
}

}  // namespace
}  // namespace spritetorch::train
