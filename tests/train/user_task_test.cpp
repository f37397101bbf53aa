// A task of the user's own, written against train/task.h alone, as README's "Use it as a library"
// invites: a denoising autoencoder (no classes, no accuracy) that draws its noise from the global
// RNG and keeps state of its own (an EMA of the weights) in checkpoints. The Trainer must train
// it, evaluate it, checkpoint it, and resume it mid-epoch to the same weights and the same EMA as
// a run that never stopped; what it cannot do for such a task is an error that says why.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/notes.h"
#include "device/device.h"
#include "diffusion/generator.h"
#include "interop/python_state.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/interrupt.h"
#include "train/model_state.h"
#include "train/task.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::error_of;

// (B, 1, 8, 8) float32 in [0, 1] -> the same shape.
struct AutoEncoderImpl : torch::nn::Module {
  AutoEncoderImpl() {
    encode = register_module("encode", torch::nn::Linear(64, 16));
    decode = register_module("decode", torch::nn::Linear(16, 64));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::sigmoid(decode(torch::relu(encode(x.flatten(1))))).view_as(x);
  }
  torch::nn::Linear encode{nullptr}, decode{nullptr};
};
TORCH_MODULE(AutoEncoder);

class DenoiseTask : public Task {
 public:
  std::string name() const override { return "denoise"; }
  TaskTraits traits() const override {
    TaskTraits t;
    t.has_accuracy = false;
    t.cuda_graphs = false;
    t.no_cuda_graphs = "its noise is drawn on the host's RNG each step";
    return t;
  }
  void build(const TaskSetup& /*setup*/) override {
    net_ = AutoEncoder();
    ema_.clear();
    for (const auto& p : net_->parameters()) ema_.push_back(p.detach().clone());
  }
  torch::nn::Module& module() override { return *net_; }
  void to_device(torch::Device device) override {
    for (auto& e : ema_) e = e.to(device);
  }
  StepLoss training_step(const data::Batch& batch) override {
    const auto noisy = batch.inputs + 0.3 * torch::randn_like(batch.inputs);
    return {torch::mse_loss(net_->forward(noisy).to(torch::kFloat32), batch.inputs), {}};
  }
  void after_optimizer_step() override {
    torch::NoGradGuard no_grad;
    const auto params = net_->parameters();
    for (size_t i = 0; i < params.size(); ++i) ema_[i].mul_(0.9).add_(params[i].detach(), 0.1);
  }
  EvalReport evaluate(data::Loader& test, bool /*keep_predictions*/) override {
    EvalReport report;
    report.has_accuracy = false;
    double sum = 0;
    test.start_epoch(0);
    data::Batch batch;
    while (test.next(batch)) {
      sum += torch::mse_loss(net_->forward(batch.inputs), batch.inputs, at::Reduction::Sum)
                 .item<double>() /
             64.0;
      report.samples += batch.inputs.size(0);
    }
    report.loss = report.samples > 0 ? sum / static_cast<double>(report.samples) : 0;
    return report;
  }
  void save(Checkpoint& checkpoint) const override {
    for (size_t i = 0; i < ema_.size(); ++i)
      checkpoint.task["ema." + std::to_string(i)] = ema_[i].detach().cpu();
  }
  void load(const Checkpoint& checkpoint, const std::string& source) override {
    Task::load(checkpoint, source);
    for (size_t i = 0; i < ema_.size(); ++i) {
      const auto it = checkpoint.task.find("ema." + std::to_string(i));
      if (it == checkpoint.task.end()) throw DataError(source, "the EMA weights", "none");
      ema_[i].copy_(it->second);
    }
  }
  Settings settings() const override { return {{"model", "autoencoder 64-16-64"}}; }
  const std::vector<torch::Tensor>& ema() const { return ema_; }

 private:
  AutoEncoder net_{nullptr};
  std::vector<torch::Tensor> ema_;  // one per parameter, on the module's device
};

// Blobs: 8x8 images of one bright square on a dark ground, labelled by nothing in particular.
data::Dataset blobs(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  data::Dataset d;
  d.inputs = torch::zeros({n, 1, 8, 8}, torch::kUInt8);
  const auto at = torch::randint(6, {n, 2}, torch::kInt64);
  auto a = at.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i)
    d.inputs[i].slice(1, a[i][0], a[i][0] + 3).slice(2, a[i][1], a[i][1] + 3).fill_(220);
  d.labels = torch::zeros({n}, torch::kInt64);
  d.class_names = {"blob"};
  d.name = "blobs";
  return d;
}

class UserTask : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("user_task_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  TrainConfig config(const std::string& save) const {
    TrainConfig c;
    c.device = "cpu";
    c.epochs = 2;
    c.batch_size = 32;
    c.lr = 0.01;
    c.save = (dir_ / save).string();
    return c;
  }
  // A run stopped mid-epoch and resumed on `device` must end where one that never stopped ends.
  void expect_resume_matches_a_straight_run(const std::string& device) {
    TrainConfig straight_config = config("straight.pt");
    straight_config.device = device;
    DenoiseTask straight;
    Trainer(straight_config).fit(straight, data_);

    struct StopAt : TrainObserver {
      void on_step(const StepTick& t) override {
        if (t.epoch == 1 && t.step == 5) request_interrupt(SIGTERM);
      }
    } stop;
    TrainConfig again = config("again.pt");
    again.device = device;
    std::string stopped_at;
    try {
      DenoiseTask stopped;
      Trainer(again).fit(stopped, data_, &stop);
    } catch (const Interrupted& e) {
      stopped_at = e.checkpoint();
    }
    ASSERT_FALSE(stopped_at.empty());
    again.resume = stopped_at;
    DenoiseTask resumed;
    const TrainReport report = Trainer(again).fit(resumed, data_);
    EXPECT_EQ(report.epochs.size(), 2u);

    const Checkpoint a = load_checkpoint(straight_config.save);
    const Checkpoint b = load_checkpoint(again.save);
    ASSERT_EQ(a.model.size(), b.model.size());
    for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;
    ASSERT_EQ(a.task.size(), 4u);
    ASSERT_EQ(a.task.size(), b.task.size());
    for (const auto& [name, t] : a.task) EXPECT_TRUE(torch::equal(t, b.task.at(name))) << name;
  }
  std::filesystem::path dir_;
  Datasets data_{blobs(256, 1), blobs(64, 2)};
};

TEST_F(UserTask, TrainsEvaluatesAndSaysWhatItIs) {
  DenoiseTask task;
  const TrainReport report = Trainer(config("denoise.pt")).fit(task, data_);
  EXPECT_EQ(report.task, "denoise");
  EXPECT_FALSE(report.has_accuracy);
  ASSERT_EQ(report.epochs.size(), 2u);
  EXPECT_LT(report.epochs[1].loss, report.epochs[0].loss);
  ASSERT_TRUE(report.has_test);
  EXPECT_EQ(report.test.samples, 64);
  EXPECT_FALSE(report.test.has_accuracy);
  EXPECT_LT(report.test.loss, 0.1);  // an untrained net's sigmoid(0) = 0.5 gives ~0.2
  const Checkpoint saved = load_checkpoint(config("denoise.pt").save);
  EXPECT_EQ(saved.meta.value("task", ""), "denoise");
  EXPECT_EQ(saved.task.size(), 4u);  // two weights, two biases
  // The EMA lags the weights it follows, so it is not a copy of them.
  EXPECT_FALSE(torch::equal(saved.task.at("ema.0"), saved.model.at("encode.weight")));
  EXPECT_TRUE(torch::equal(saved.task.at("ema.0"), task.ema()[0]));
}

// A program that embeds the library keeps what is its own: the thread count it set, its random
// stream (the run seeds the generators with --seed), and its stderr, where a note goes only while
// no handler is set (here a resumed run's new lr).
TEST_F(UserTask, FitLeavesTheCallersThreadsRandomStreamAndStderrAsTheyWere) {
  if (cpu_cores() < 2) GTEST_SKIP() << "needs 2 cores to run with another thread count";
  const spritetorch::testing::OneThreadUnless restore_threads(/*op_uses_every_thread=*/true);
  at::set_num_threads(1);
  torch::manual_seed(1);
  const auto untouched = torch::rand({4});
  torch::manual_seed(1);
  TrainConfig c = config("first.pt");
  c.threads = 2;
  DenoiseTask task;
  Trainer(c).fit(task, data_);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(torch::equal(torch::rand({4}), untouched));

  std::vector<std::string> notes;
  const NoteHandler before =
      set_note_handler([&](const std::string& line) { notes.push_back(line); });
  TrainConfig more = config("more.pt");
  more.resume = c.save;
  more.epochs = 3;
  more.lr = c.lr / 2;
  ::testing::internal::CaptureStderr();
  DenoiseTask again;
  Trainer(more).fit(again, data_);
  const std::string stderr_text = ::testing::internal::GetCapturedStderr();
  set_note_handler(before);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("was trained with --lr"), std::string::npos) << notes[0];
  EXPECT_EQ(stderr_text, "");
}

// Fits that overlap in two threads: the later one says that its seed does not make it
// reproducible, and the caller's random stream and threads are back only after the last one ends,
// as they were before the first (here the first ends while the second still runs).
TEST_F(UserTask, OverlappingFitsSayTheyShareTheGeneratorAndTheLastToEndPutsTheCallersBack) {
  const spritetorch::testing::OneThreadUnless restore_threads(/*op_uses_every_thread=*/true);
  at::set_num_threads(1);
  torch::manual_seed(1);
  const auto untouched = torch::rand({4});
  torch::manual_seed(1);
  std::vector<std::string> notes;
  const NoteHandler before =
      set_note_handler([&](const std::string& line) { notes.push_back(line); });
  std::promise<void> first_returned;
  std::shared_future<void> first_done = first_returned.get_future().share();
  std::promise<void> second_started;
  // The second fit says it has started, then waits at its first step for the first to return.
  struct WaitAtFirstStep : TrainObserver {
    std::promise<void>* started = nullptr;
    std::shared_future<void> until;
    void on_start(const std::string&, const Settings&) override { started->set_value(); }
    void on_step(const StepTick& t) override {
      if (t.epoch == 1 && t.step == 1) until.wait();
    }
  } wait;
  wait.started = &second_started;
  wait.until = first_done;
  std::thread second;
  // The first starts the second at its first step and goes on once the second has started.
  struct StartSecondAtFirstStep : TrainObserver {
    std::function<void()> start;
    void on_step(const StepTick& t) override {
      if (t.epoch == 1 && t.step == 1 && start) std::exchange(start, nullptr)();
    }
  } start;
  std::string second_error;
  start.start = [&] {
    second = std::thread([&] {
      try {
        DenoiseTask task;
        TrainConfig c = config("second.pt");
        c.seed = 9;
        Trainer(c).fit(task, data_, &wait);
      } catch (const std::exception& e) {
        second_error = e.what();
        try {
          second_started.set_value();  // refused before it started: the first must not wait
        } catch (const std::future_error&) {
        }
      }
    });
    second_started.get_future().wait();
  };
  TrainConfig c = config("first.pt");
  c.threads = 2;
  DenoiseTask task;
  Trainer(c).fit(task, data_, &start);
  first_returned.set_value();
  ASSERT_TRUE(second.joinable());
  second.join();
  set_note_handler(before);
  EXPECT_EQ(second_error, "");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("another fit is running in this process"), std::string::npos) << notes[0];
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(torch::equal(torch::rand({4}), untouched));
}

// Work build() does on the training data (ClassifierTask's whitened filters) is part of reaching
// an accuracy: the run's training time and every evaluation's count it.
TEST_F(UserTask, WhatBuildLearnsFromTheDataCountsAsTrainingTime) {
  struct SlowSetUp : DenoiseTask {
    double setup_train_seconds() const override { return 1000; }
  };
  DenoiseTask plain;
  SlowSetUp slow;
  TrainConfig c = config("plain.pt");
  c.eval_every_steps = 2;
  const TrainReport plain_report = Trainer(c).fit(plain, data_);
  c.save = (dir_ / "slow.pt").string();
  const TrainReport slow_report = Trainer(c).fit(slow, data_);
  EXPECT_LT(plain_report.train_seconds, 1000);
  EXPECT_GE(slow_report.train_seconds, 1000);
  EXPECT_LT(slow_report.train_seconds, 1000 + 600);
  ASSERT_FALSE(slow_report.evals.empty());
  EXPECT_GE(slow_report.evals.front().train_seconds, 1000);
}

// The noise comes from the global RNG and the EMA from every step: a run stopped mid-epoch and
// resumed ends exactly where one that never stopped ends.
TEST_F(UserTask, AResumedRunEndsWithTheSameWeightsAndTheSameState) {
  expect_resume_matches_a_straight_run("cpu");
}

// The same on a GPU: the EMA moved by to_device, the CUDA RNG's state in the checkpoint, and the
// eager step the Trainer falls back to for a task without CUDA graphs.
class UserTaskCuda : public UserTask {};
TEST_F(UserTaskCuda, AResumedRunEndsWithTheSameWeightsAndTheSameState) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  expect_resume_matches_a_straight_run("cuda");
}

TEST_F(UserTask, WhatTheTrainerCannotDoForItIsRefusedWithTheReason) {
  TrainConfig c = config("x.pt");
  c.cuda_graphs = CudaGraphs::kOn;
  DenoiseTask graphs;
  EXPECT_NE(error_of([&] {
              Trainer(c).fit(graphs, data_);
            }).find("its noise is drawn on the host's RNG each step"),
            std::string::npos);
  c = config("x.pt");
  c.target_accuracy = 0.9;
  DenoiseTask target;
  EXPECT_NE(error_of([&] {
              Trainer(c).fit(target, data_);
            }).find("--target-accuracy needs a task with an accuracy; task 'denoise' has none"),
            std::string::npos);
  // The built-in tasks' options are refused, not ignored, by a task that does not take them.
  const std::vector<std::pair<std::string, std::function<void(TrainConfig&)>>> others = {
      {"label_smoothing is", [](TrainConfig& o) { o.label_smoothing = 0.1; }},
      {"test_time_augment is", [](TrainConfig& o) { o.test_time_augment = "flip"; }},
      {"first_conv is", [](TrainConfig& o) { o.first_conv = "whitened"; }},
      {"activation_checkpointing is", [](TrainConfig& o) { o.activation_checkpointing = true; }},
      {"a generator option (sample_every, unet_*", [](TrainConfig& o) { o.unet_base = 64; }},
      {"a generator option (sample_every, unet_*", [](TrainConfig& o) { o.sample_every = 1; }},
      {"model 'cnn' is", [](TrainConfig& o) { o.model = "cnn"; }}};
  for (const auto& [option, set] : others) {
    c = config("x.pt");
    set(c);
    DenoiseTask task;
    const std::string error = error_of([&] { Trainer(c).fit(task, data_); });
    EXPECT_NE(error.find(option), std::string::npos) << option << ": " << error;
  }
}

// Its checkpoint resumes its own task only: a classifier of the same module would read the
// weights and lose the EMA.
TEST_F(UserTask, ItsCheckpointDoesNotResumeAnotherTask) {
  DenoiseTask task;
  Trainer(config("own.pt")).fit(task, data_);
  TrainConfig c = config("other.pt");
  c.resume = config("own.pt").save;
  ClassifierTask classifier(AutoEncoder(), "autoencoder");
  const std::string error = error_of([&] { Trainer(c).fit(classifier, data_); });
  EXPECT_NE(error.find("denoise"), std::string::npos) << error;
}

// What spritetorch's own commands do with it: export writes the weights under the module's own
// names (what PyTorch calls the same module's), the rest say what the file holds instead of
// failing on a model they do not know.
TEST_F(UserTask, ItsWeightsExportUnderItsOwnNamesAndTheCommandsSayWhatItIs) {
  DenoiseTask task;
  Trainer(config("own.pt")).fit(task, data_);
  const std::string path = config("own.pt").save;
  const Checkpoint saved = load_checkpoint(path);
  EXPECT_EQ(own_module_description(saved, path), "task 'denoise'");

  const interop::TensorFile state = interop::python_state_dict(saved, path);
  std::vector<std::string> names;
  for (const auto& [name, t] : state.tensors) {
    names.push_back(name);
    EXPECT_TRUE(torch::equal(t, saved.model.at(name))) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"decode.bias", "decode.weight", "encode.bias",
                                             "encode.weight"}));

  const std::string not_ours = "found task 'denoise', from a program of its own";
  EXPECT_NE(error_of([&] { model_from_checkpoint(saved, path, torch::kCPU); }).find(not_ours),
            std::string::npos);
  EXPECT_NE(error_of([&] { diffusion::check_generator_checkpoint(saved, path); }).find(not_ours),
            std::string::npos);

  // A ClassifierTask over a module of the user's: the task is ours, the model is not.
  Checkpoint classifier = saved;
  classifier.meta["task"] = "classify";
  classifier.meta["model"] = "autoencoder";
  EXPECT_EQ(own_module_description(classifier, path), "model 'autoencoder'");
  classifier.meta["model"] = "cnn";
  EXPECT_EQ(own_module_description(classifier, path), "");
}

// The other way: a state dict from Python (here the export above, through a safetensors file)
// into a fresh module of the user's, by name, with load_state_dict(strict=True)'s checks.
TEST_F(UserTask, AStateDictLoadsIntoTheUsersModuleByNameAndStrictly) {
  DenoiseTask task;
  Trainer(config("own.pt")).fit(task, data_);
  const std::string file = (dir_ / "own.safetensors").string();
  interop::write_safetensors(
      file, interop::python_state_dict(load_checkpoint(config("own.pt").save), "own.pt"));
  const interop::TensorFile state = interop::read_safetensors(file);

  AutoEncoder fresh;
  interop::load_state_dict(*fresh, state, file);
  const auto trained = task.module().named_parameters();
  for (const auto& p : fresh->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), trained[p.key()])) << p.key();

  interop::TensorFile missing = state;
  missing.tensors.erase(missing.tensors.begin());  // decode.bias
  EXPECT_EQ(error_of([&] { interop::load_state_dict(*fresh, missing, file); }),
            file + ": expected a tensor 'decode.bias', found none");
  interop::TensorFile extra = state;
  extra.tensors.emplace_back("head.weight", torch::zeros({2}));
  EXPECT_EQ(error_of([&] { interop::load_state_dict(*fresh, extra, file); }),
            file + ": expected 4 model tensors, found 5, among them 'head.weight', which this " +
                "model does not have");
  interop::TensorFile reshaped = state;
  reshaped.tensors[0].second = torch::zeros({65});
  EXPECT_EQ(error_of([&] { interop::load_state_dict(*fresh, reshaped, file); }),
            file + ": expected 'decode.bias' of shape [64], found shape [65]");
}

}  // namespace
}  // namespace spritetorch::train
