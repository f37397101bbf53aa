// How many ATen ops (each one kernel launch on CUDA) one seed-MLP training step issues through the
// device-generic path. On a GPU this workload is launch-bound (docs/benchmarks.md, GPU): the count
// is its cost model, and a change that adds launches to every step should be seen here, not found
// later in a GPU benchmark. float64 on the CPU takes the same code as CUDA (FusedMlpStep, the flat
// Adam's whole-buffer ops) since the raw-buffer CPU paths are float32 only.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/classifier.h"
#include "train/flat_optimizer.h"
#include "train/train_step.h"

namespace spritetorch::train {
namespace {

// Ops that only make views or allocate: they launch nothing.
bool is_metadata_op(const std::string& name) {
  static const std::set<std::string> names = {
      "aten::as_strided", "aten::resolve_conj",   "aten::resolve_neg",
      "aten::view",       "aten::_reshape_alias", "aten::reshape",
      "aten::empty",      "aten::empty_strided",  "aten::empty_like",
      "aten::resize_",    "aten::scalar_tensor",  "aten::t",
      "aten::transpose",  "aten::narrow",         "aten::slice",
      "aten::select",     "aten::expand",         "aten::unsqueeze",
      "aten::squeeze",    "aten::detach",         "aten::alias",
      "aten::lift_fresh", "aten::item",           "aten::_local_scalar_dense",
      "aten::result_type"};
  return names.count(name) > 0;
}

// Counts the innermost non-metadata ops while alive: an op that calls others is counted through
// them, so the count is a lower bound of the kernels a CUDA step launches.
class OpCounter {
 public:
  OpCounter() {
    frames().clear();
    counts().clear();
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&enter, &leave));
  }
  ~OpCounter() { at::removeCallback(handle_); }
  std::map<std::string, int> take() {
    auto out = counts();
    counts().clear();
    return out;
  }
  static int total(const std::map<std::string, int>& c) {
    int n = 0;
    for (const auto& kv : c) n += kv.second;
    return n;
  }

 private:
  struct Frame {
    std::string name;
    bool counts_as_leaf;  // false once a non-metadata op ran inside it (or for metadata ops)
  };
  static std::vector<Frame>& frames() {
    static thread_local std::vector<Frame> f;
    return f;
  }
  static std::map<std::string, int>& counts() {
    static std::map<std::string, int> c;
    return c;
  }
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    const bool metadata = is_metadata_op(name);
    if (!frames().empty() && !metadata) frames().back().counts_as_leaf = false;
    frames().push_back({name, !metadata});
    return nullptr;
  }
  static void leave(const at::RecordFunction&, at::ObserverContext*) {
    if (frames().back().counts_as_leaf) counts()[frames().back().name]++;
    frames().pop_back();
  }
  at::CallbackHandle handle_;
};

std::string listing(const std::map<std::string, int>& c) {
  std::string out;
  for (const auto& [name, n] : c) out += " " + name + " x" + std::to_string(n);
  return out;
}

TEST(StepOpCount, SeedMlpStepAndAdamStayWithinTheirLaunchBudget) {
  torch::manual_seed(0);
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  model->to(torch::kFloat64);
  FlatOptimizer optimizer(model->parameters(), {});
  FusedMlpStep step(model->relu_mlp_layers(), 64);
  const data::Batch batch{torch::rand({64, 1, 28, 28}, torch::kFloat64),
                          torch::randint(0, 10, {64}, torch::kInt64)};
  auto loss = torch::zeros({}, torch::kFloat64);
  auto correct = torch::zeros({}, torch::kInt64);
  step.run(batch, loss, correct);  // first step: buffers and optimizer state are made here
  optimizer.step();

  OpCounter counter;
  step.run(batch, loss, correct);
  const auto step_ops = counter.take();
  optimizer.step();
  const auto adam_ops = counter.take();
  std::cout << "step: " << OpCounter::total(step_ops) << " ops:" << listing(step_ops) << "\n"
            << "adam: " << OpCounter::total(adam_ops) << " ops:" << listing(adam_ops) << "\n";
  // 3 layers: 3 forward products, 3 weight-gradient and 2 input-gradient products, the loss and
  // its gradient, ReLU masks, bias sums, the step's loss/correct sums: 27 at the time of writing.
  EXPECT_GE(step_ops.count("aten::mm") + step_ops.count("aten::addmm"), 1u) << listing(step_ops);
  EXPECT_LE(OpCounter::total(step_ops), 30) << listing(step_ops);
  // Flat Adam: a handful of whole-buffer ops, independent of the number of parameter tensors (6).
  EXPECT_LE(OpCounter::total(adam_ops), 10) << listing(adam_ops);

  // The device-side step a CUDA graph captures (lr, step count and found_inf read on the device):
  // in its tensor-op form, what a LibTorch without PyTorch's fused Adam kernel runs, about as many
  // ops as the forward and backward above; with that kernel (CUDA, torch 2.x) the step count's
  // increment and the kernel itself. step_on_device() makes its device tensors on its first call.
  optimizer.step_on_device();
  counter.take();
  optimizer.step_on_device();
  const auto device_adam_ops = counter.take();
  std::cout << "adam on the device (tensor ops): " << OpCounter::total(device_adam_ops)
            << " ops:" << listing(device_adam_ops) << "\n";
  EXPECT_FALSE(optimizer.fused_kernel()) << "the fused kernel is CUDA's";
  EXPECT_LE(OpCounter::total(device_adam_ops), 24) << listing(device_adam_ops);
}

// The time-to-accuracy recipe's model through autograd against the device-side AdamW step that
// PyTorch's fused kernel replaces on CUDA. The convolutions take CPU kernels here (91 ops at the
// time of writing, copies and fills included, where cuDNN and bf16 autocast's casts differ on
// CUDA), so the step's count is a guide; the optimizer's tensor ops are the device path's own.
TEST(StepOpCount, FastCnnStepAgainstItsDeviceSideAdamW) {
  torch::manual_seed(0);
  auto model = models::make_model({"fastcnn", {1, 28, 28}, 10});
  model->to(torch::kFloat64);
  FlatOptimizer optimizer(model->parameters(), {"adamw", 0.01, 0.9, 0.999, 1e-8, 0, 0.05});
  AutogradStep step(classifier_loss(model, /*label_smoothing=*/0.1));
  const data::Batch batch{torch::rand({32, 1, 28, 28}, torch::kFloat64),
                          torch::randint(0, 10, {32}, torch::kInt64)};
  auto loss = torch::zeros({}, torch::kFloat64);
  auto correct = torch::zeros({}, torch::kInt64);
  step.run(batch, loss, correct);
  optimizer.step_on_device();

  OpCounter counter;
  optimizer.zero_grad();
  step.run(batch, loss, correct);
  const auto step_ops = counter.take();
  optimizer.step_on_device();
  const auto adamw_ops = counter.take();
  std::cout << "fastcnn step: " << OpCounter::total(step_ops) << " ops:" << listing(step_ops)
            << "\nadamw on the device (tensor ops): " << OpCounter::total(adamw_ops)
            << " ops:" << listing(adamw_ops) << "\n";
  EXPECT_GE(OpCounter::total(step_ops), 20) << listing(step_ops);    // 3 conv stages and a linear
  EXPECT_LE(OpCounter::total(adamw_ops), 29) << listing(adamw_ops);  // adam's 24 + decoupled decay
}

}  // namespace
}  // namespace spritetorch::train
