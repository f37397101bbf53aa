// --model script:FILE: a classifier saved as TorchScript trains, checkpoints, resumes and exports
// like one of ours. The modules are built here with LibTorch's own TorchScript API (the archive
// format Python's torch.jit.save writes); tests/interop/torchscript_model.py does it from Python.
#include "models/script_model.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "device/device.h"
#include "interop/python_state.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/interrupt.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::models {
namespace {

using spritetorch::testing::error_of;

// What torch.jit.script saves for
//   class Net(nn.Module):  # fc = nn.Linear(64, classes); a buffer `scale` of ones(1)
//     def forward(self, x): return self.fc(x.flatten(1) * self.scale)
// `mask`, when given, becomes a second buffer the forward does not read.
std::string net_archive(int64_t classes, uint64_t seed = 0, const torch::Tensor& mask = {}) {
  torch::manual_seed(seed);
  torch::jit::Module fc("__torch__.Fc");
  // Python saves parameters that require gradients; LibTorch's API registers them as given.
  fc.register_parameter("weight", (torch::randn({classes, 64}) * 0.1).requires_grad_(),
                        /*is_buffer=*/false);
  fc.register_parameter("bias", torch::zeros({classes}).requires_grad_(), /*is_buffer=*/false);
  fc.define("def forward(self, x):\n  return torch.linear(x, self.weight, self.bias)\n");
  torch::jit::Module net("__torch__.Net");
  net.register_module("fc", fc);
  net.register_buffer("scale", torch::ones({1}));
  if (mask.defined()) net.register_buffer("mask", mask);
  net.define("def forward(self, x):\n  return self.fc.forward(x.flatten(1) * self.scale)\n");
  std::ostringstream out;
  net.save(out);
  return out.str();
}

// A module of one linear layer (64 -> classes) on the module itself, its tensors of `dtype`,
// running `forward` (TorchScript source; `x` the input, `logits` the layer's output on it).
std::string linear_archive(int64_t classes, const std::string& forward,
                           torch::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(0);
  torch::jit::Module net("__torch__.Linear");
  const auto options = torch::TensorOptions().dtype(dtype);
  net.register_parameter("weight", (torch::randn({classes, 64}, options) * 0.1).requires_grad_(),
                         /*is_buffer=*/false);
  net.register_parameter("bias", torch::zeros({classes}, options).requires_grad_(),
                         /*is_buffer=*/false);
  net.register_buffer("scale", torch::ones({1}, options));
  net.register_attribute("training", c10::BoolType::get(), true);  // as Python's modules have
  net.define(
      "def forward(self, x):\n"
      "  logits = torch.linear(x.flatten(1).to(self.weight.dtype) * self.scale, self.weight, "
      "self.bias)\n" +
      forward);
  std::ostringstream out;
  net.save(out);
  return out.str();
}

// 8x8 images of one vertical bar: class 0 in the left half, class 1 in the right (a linear
// model separates them).
data::Dataset bars(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  data::Dataset d;
  d.inputs = torch::zeros({n, 1, 8, 8}, torch::kUInt8);
  d.labels = torch::randint(2, {n}, torch::kInt64);
  const auto at = torch::randint(4, {n}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i)
    d.inputs[i][0].select(1, at[i].item<int64_t>() + 4 * d.labels[i].item<int64_t>()).fill_(255);
  d.class_names = {"left", "right"};
  d.name = "bars";
  return d;
}

class ScriptModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("script_model_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    net_ = write("net.pt", net_archive(2));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  train::TrainConfig config(const std::string& save) const {
    train::TrainConfig c;
    c.device = "cpu";
    c.epochs = 2;
    c.batch_size = 32;
    c.lr = 0.01;
    c.save = (dir_ / save).string();
    return c;
  }
  std::unique_ptr<train::ClassifierTask> task(const std::string& model) const {
    return train::ClassifierTask::builtin(model, "ann");
  }
  std::filesystem::path dir_;
  std::string net_;
  train::Datasets data_{bars(512, 1), bars(128, 2)};
};

TEST_F(ScriptModel, RegistersPyTorchsNamesOverTheSameTensors) {
  ScriptClassifierImpl model(net_archive(3), "net.pt");
  std::vector<std::string> names;
  for (const auto& p : model.named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  ASSERT_EQ(model.named_buffers().size(), 1u);
  EXPECT_EQ(model.named_buffers().begin()->key(), "scale");
  // The interpreter reads the tensors the optimizer writes.
  const auto x = torch::rand({4, 1, 8, 8});
  const auto before = model.forward(x);
  {
    torch::NoGradGuard no_grad;
    model.named_parameters()["fc.bias"].add_(1.0);
  }
  EXPECT_TRUE(torch::allclose(model.forward(x), before + 1.0));
  model.eval();
  EXPECT_FALSE(model.is_training());
  // The archive written back holds the new weights.
  ScriptClassifierImpl again(model.archive(), "again");
  EXPECT_TRUE(torch::equal(again.forward(x), model.forward(x)));
}

// Trained from its file; the checkpoint carries the model, so eval, classify and export need
// nothing else once the file is gone.
TEST_F(ScriptModel, TrainsAndItsCheckpointCarriesTheModel) {
  auto t = task("script:" + net_);
  const train::TrainReport report = train::Trainer(config("net_run.pt")).fit(*t, data_);
  ASSERT_TRUE(report.has_test);
  EXPECT_GT(report.test.accuracy, 0.9);  // bars are linearly separable; chance is 0.5
  std::filesystem::remove(net_);

  const train::Checkpoint saved = train::load_checkpoint(config("net_run.pt").save);
  EXPECT_EQ(saved.meta.value("model", ""), "script");
  EXPECT_EQ(saved.meta.value("script_file", ""), net_);
  ASSERT_EQ(saved.task.count(train::kScriptArchive), 1u);
  EXPECT_TRUE(train::own_module_description(saved, "net_run.pt").empty());
  auto model = train::model_from_checkpoint(saved, "net_run.pt", torch::kCPU);
  model->eval();
  t->module().eval();
  const auto x = data_.test.inputs.slice(0, 0, 16).to(torch::kFloat32) / 255;
  auto& trained = dynamic_cast<ClassifierImpl&>(t->module());
  EXPECT_TRUE(torch::equal(model->forward(x), trained.forward(x)));
  // Export: PyTorch's names in its state_dict's order (a module's own tensors, then its
  // children's).
  const interop::TensorFile state = interop::python_state_dict(saved, "net_run.pt");
  std::vector<std::string> names;
  for (const auto& [name, tensor] : state.tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"scale", "fc.weight", "fc.bias"}));
}

// A buffer of -inf (an attention mask, say) is the model's own business: its checkpoint loads for
// eval, classify and export; a NaN in a parameter is still refused, naming it.
TEST_F(ScriptModel, AnInfiniteBufferLoadsAndANaNWeightIsRefused) {
  const auto masked =
      write("masked.pt",
            net_archive(2, 0, torch::tensor({0.0f, -std::numeric_limits<float>::infinity()})));
  auto t = task("script:" + masked);
  const train::TrainReport report = train::Trainer(config("masked_run.pt")).fit(*t, data_);
  EXPECT_GT(report.test.accuracy, 0.9);
  train::Checkpoint saved = train::load_checkpoint(config("masked_run.pt").save);
  EXPECT_NO_THROW(train::model_from_checkpoint(saved, "masked_run.pt", torch::kCPU));
  EXPECT_NO_THROW(interop::python_state_dict(saved, "masked_run.pt"));
  ASSERT_EQ(saved.model.count("fc.weight"), 1u);
  saved.model.at("fc.weight")[0][3] = std::nanf("");
  const std::string error =
      error_of([&] { train::model_from_checkpoint(saved, "masked_run.pt", torch::kCPU); });
  EXPECT_NE(error.find("NaN or infinity in 'fc.weight'"), std::string::npos) << error;
}

TEST_F(ScriptModel, AResumedRunEndsWithTheSameWeights) {
  auto straight = task("script:" + net_);
  train::Trainer(config("straight.pt")).fit(*straight, data_);

  struct StopAt : train::TrainObserver {
    void on_step(const train::StepTick& t) override {
      if (t.epoch == 1 && t.step == 5) train::request_interrupt(SIGTERM);
    }
  } stop;
  train::TrainConfig again = config("again.pt");
  std::string stopped_at;
  try {
    auto stopped = task("script:" + net_);
    train::Trainer(again).fit(*stopped, data_, &stop);
  } catch (const train::Interrupted& e) {
    stopped_at = e.checkpoint();
  }
  ASSERT_FALSE(stopped_at.empty());
  again.resume = stopped_at;
  auto resumed = task("");  // no --model: the checkpoint's
  train::Trainer(again).fit(*resumed, data_);

  const train::Checkpoint a = train::load_checkpoint(config("straight.pt").save);
  const train::Checkpoint b = train::load_checkpoint(again.save);
  ASSERT_EQ(a.model.size(), 3u);
  for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;

  // Another TorchScript model than the checkpoint's is refused.
  train::TrainConfig other = config("other.pt");
  other.resume = stopped_at;
  other.epochs = 3;
  const std::string different = write("different.pt", net_archive(2, /*seed=*/5));
  auto wrong = task("script:" + different);
  EXPECT_NE(error_of([&] {
              train::Trainer(other).fit(*wrong, data_);
            }).find("holds another TorchScript model than " + different),
            std::string::npos);
}

// On a GPU the interpreter's kernels are captured as a CUDA graph (the default there) after the
// warm-up steps, in which its profiling executor settles on a graph: the captured and the eager
// run must train alike, and the checkpoint must come back to the CPU.
class ScriptModelCuda : public ScriptModel {};
TEST_F(ScriptModelCuda, TrainsWithAndWithoutCudaGraphs) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<torch::Tensor> weights;
  for (const auto graphs : {train::CudaGraphs::kOn, train::CudaGraphs::kOff}) {
    train::TrainConfig c = config(graphs == train::CudaGraphs::kOn ? "graphs.pt" : "eager.pt");
    c.device = "cuda";
    c.cuda_graphs = graphs;
    c.drop_last = true;  // one batch shape, as a graph replays
    auto t = task("script:" + net_);
    const train::TrainReport report = train::Trainer(c).fit(*t, data_);
    EXPECT_GT(report.test.accuracy, 0.9);
    const train::Checkpoint saved = train::load_checkpoint(c.save);
    auto model = train::model_from_checkpoint(saved, c.save, torch::kCPU);
    weights.push_back(model->named_parameters()["fc.weight"].detach().clone());
  }
  EXPECT_TRUE(torch::allclose(weights[0], weights[1], 1e-4, 1e-5));
}

TEST_F(ScriptModel, DamagedOrUnfittingModelsAreDataErrorsThatSayWhy) {
  const std::string archive = net_archive(2);
  auto build = [&](const std::string& bytes, int64_t classes = 2) {
    return error_of([&] {
      make_model(
          {"script", {1, 8, 8}, classes, std::make_shared<const std::string>(bytes), "net.pt"});
    });
  };
  const std::string wanted = "net.pt: expected a TorchScript module";
  EXPECT_NE(build("").find(wanted), std::string::npos);
  EXPECT_NE(build(archive.substr(0, archive.size() / 2)).find(wanted), std::string::npos);
  EXPECT_NE(build(std::string(4096, 'x')).find(wanted), std::string::npos);
  // Archives that once crashed LibTorch's TorchScript reader when checkpoints were such archives.
  for (const char* crash : {"v1-archive-crash-43e04924-torchscript-parser-segv",
                            "v1-archive-crash-603f93c1-jit-errorreport"}) {
    std::ifstream in(
        std::string(SPRITETORCH_TEST_DIR) + "/data/fuzz/checkpoint_payload_fuzzer/" + crash,
        std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    ASSERT_FALSE(bytes.str().empty()) << crash;
    EXPECT_NE(build(bytes.str()).find(wanted), std::string::npos) << crash;
  }
  // Three classes' logits for a two-class dataset.
  EXPECT_NE(build(net_archive(3))
                .find("net.pt: expected a forward that maps this dataset's (B, "
                      "1, 8, 8) float32 inputs to (B, 2) logits, found one that "
                      "gives [2, 3] Float for a batch of 2"),
            std::string::npos);
  // A forward that cannot take the inputs: the error is LibTorch's one line, not its tracebacks.
  const std::string message = error_of([&] {
    make_model({"script", {3, 8, 8}, 2, std::make_shared<const std::string>(archive), "net.pt"});
  });
  EXPECT_NE(message.find("found one that fails on them: mat1 and mat2 shapes cannot be multiplied"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("Traceback"), std::string::npos) << message;
}

// The probe sees a batch of 2 in eval mode; every later forward is held to the same (B, classes),
// so a training-mode forward of another width, or a batch size fixed at 2 (as torch.jit.trace
// can leave it), is a DataError naming the file, not a loss function's complaint.
TEST_F(ScriptModel, EveryForwardIsHeldToTheProbesShape) {
  auto build = [](const std::string& archive) {
    return make_model(
        {"script", {1, 8, 8}, 2, std::make_shared<const std::string>(archive), "net.pt"});
  };
  auto error = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const DataError& e) {
      return e.what();
    }
    return "no DataError";
  };
  const std::string wanted =
      "net.pt: expected a forward that maps this dataset's (B, 1, 8, 8) float32 inputs to (B, 2) "
      "logits, found one that gives ";
  const auto x = torch::rand({16, 1, 8, 8});

  auto narrow =
      build(linear_archive(2, "  if self.training:\n    return logits[:, :1]\n  return logits\n"));
  narrow->eval();
  EXPECT_EQ(narrow->forward(x).sizes(), (std::vector<int64_t>{16, 2}));
  narrow->train();
  EXPECT_EQ(error([&] { narrow->forward(x); }),
            wanted + "[16, 1] Float for a batch of 16 in training mode");

  auto batch_of_two = build(linear_archive(2, "  return logits[:2]\n"));
  batch_of_two->eval();
  EXPECT_EQ(error([&] { batch_of_two->forward(x); }), wanted + "[2, 2] Float for a batch of 16");

  // Training stops at the first step with that error.
  const std::string file =
      write("narrow.pt",
            linear_archive(2, "  if self.training:\n    return logits[:, :1]\n  return logits\n"));
  auto t = task("script:" + file);
  EXPECT_NE(error([&] {
              train::Trainer(config("narrow_run.pt")).fit(*t, data_);
            }).find(file + ": expected a forward that maps"),
            std::string::npos);
}

// The optimizer keeps the trained parameters in one flat buffer of one dtype.
TEST_F(ScriptModel, ParametersOfTwoDtypesAreADataErrorNamingBoth) {
  torch::jit::Module net("__torch__.Mixed");
  net.register_parameter("weight", torch::zeros({2, 64}).requires_grad_(), /*is_buffer=*/false);
  net.register_parameter("temperature", torch::ones({1}, torch::kFloat64).requires_grad_(),
                         /*is_buffer=*/false);
  net.define(
      "def forward(self, x):\n"
      "  return torch.linear(x.flatten(1), self.weight) / self.temperature.float()\n");
  std::ostringstream archive;
  net.save(archive);
  try {
    make_model(
        {"script", {1, 8, 8}, 2, std::make_shared<const std::string>(archive.str()), "net.pt"});
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "net.pt: expected trainable parameters of one dtype, found 'weight' of Float and "
              "'temperature' of Double");
    EXPECT_NE(e.hint().find("call .float() (or .double()) on the module before saving"),
              std::string::npos);
  }
}

// Export writes a float64 model's parameters as float64, as its buffers and its torchscript
// export are.
TEST_F(ScriptModel, ExportKeepsTheParametersDtype) {
  const std::string file =
      write("double.pt", linear_archive(2, "  return logits\n", torch::kFloat64));
  auto t = task("script:" + file);
  train::TrainConfig c = config("double_run.pt");
  c.epochs = 0;
  train::Trainer(c).fit(*t, data_);
  const train::Checkpoint saved = train::load_checkpoint(c.save);
  const interop::TensorFile state = interop::python_state_dict(saved, "double_run.pt");
  ASSERT_EQ(state.tensors.size(), 3u);
  for (const auto& [name, tensor] : state.tensors)
    EXPECT_EQ(tensor.scalar_type(), torch::kFloat64) << name;
}

}  // namespace
}  // namespace spritetorch::models
