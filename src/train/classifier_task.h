// Classification as a training task (train/task.h): cross-entropy on the logits of any module —
// one of ours by name (ann, cnn, simplenn: models/classifier.h) or the user's own — with accuracy,
// the confusion matrix and the misclassified samples in its evaluation.
//
//   struct NetImpl : torch::nn::Module { torch::Tensor forward(torch::Tensor x); ... };
//   TORCH_MODULE(Net);
//   train::ClassifierTask task(Net(), "net");   // forward: (B, ...) float32 -> (B, K) logits
//   train::Trainer(options).fit(task, data);
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/classifier.h"
#include "train/task.h"
#include "train/train_step.h"

namespace spritetorch::train {

// How a classifier is trained and judged beyond its module (--label-smoothing,
// --test-time-augment, --first-conv); recorded in its checkpoints so that eval and classify judge
// it the same way.
struct ClassifierOptions {
  double label_smoothing = 0;  // 0: plain cross-entropy
  bool flip_at_test = false;   // evaluate on the mean of the image's and its mirror's softmax
  // The first convolution fixed to whiten the training images' patches, and frozen
  // (models/patch_whitening.h; --first-conv whitened).
  bool whiten_first_conv = false;
};

// Test-time flip on any forward: log of the mean softmax of x and of x mirrored left-right (its
// argmax is the averaged prediction, its cross-entropy the averaged probabilities'). x: (B, C, H,
// W).
ForwardFn flip_averaged(ForwardFn forward);
// A checkpointed classifier's forward as its training run evaluated it: flip_averaged when its
// meta says test_time_augment = flip (eval and classify use it).
ForwardFn checkpoint_forward(const nlohmann::json& meta, const models::Classifier& model,
                             const std::string& source = "checkpoint metadata");

class ClassifierTask : public Task {
 public:
  // One of our models by name, built for the data's shape in build(). When resuming, the
  // checkpoint's model; `requested` (may be empty: then `fallback`) must then agree with it.
  static std::unique_ptr<ClassifierTask> builtin(std::string requested, std::string fallback);

  // The user's own module; `forward` maps (B, ...) float32 inputs to (B, K) logits.
  ClassifierTask(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                 std::string model_name);
  // Any module with `torch::Tensor forward(torch::Tensor)`, held by a shared_ptr or a TORCH_MODULE.
  template <class ModuleType>
  explicit ClassifierTask(std::shared_ptr<ModuleType> module, std::string model_name = "custom")
      : ClassifierTask(
            module, [raw = module.get()](const torch::Tensor& x) { return raw->forward(x); },
            std::move(model_name)) {}
  template <class Impl>
  explicit ClassifierTask(const torch::nn::ModuleHolder<Impl>& module,
                          std::string model_name = "custom")
      : ClassifierTask(module.ptr(), std::move(model_name)) {}

  // Before fit(). The fused MLP step computes plain cross-entropy: with label smoothing, --step
  // auto takes the autograd step and --step fused is refused. fit() also takes them from the
  // TrainConfig (configure): its label_smoothing and test_time_augment, where not the defaults,
  // replace these.
  void set_options(const ClassifierOptions& options) { options_ = options; }
  void configure(const TrainConfig& config) override;
  const ClassifierOptions& options() const { return options_; }

  std::string name() const override { return "classify"; }
  TaskTraits traits() const override;
  void build(const TaskSetup& setup) override;
  torch::nn::Module& module() override { return *module_; }
  StepLoss training_step(const data::Batch& batch) override { return loss_(batch); }
  std::unique_ptr<TrainStep> fast_step(const FastStepSetup& setup) override;
  void use_data_parallel(const std::vector<torch::Device>& devices) override;
  EvalReport evaluate(data::Loader& test, bool keep_predictions) override;
  void save(Checkpoint& checkpoint) const override;
  Settings settings() const override;
  double setup_train_seconds() const override { return first_conv_seconds_; }

  const std::string& model_name() const { return model_name_; }
  // The built-in model (null for the user's own).
  const models::Classifier& classifier() const { return builtin_; }

 private:
  ClassifierTask() = default;
  // --first-conv whitened: the filters from the training images (a resumed run: its checkpoint's,
  // frozen the same way).
  void prepare_first_conv(const TaskSetup& setup);

  std::string requested_, fallback_;  // ours: --model as given, and the default
  std::string model_name_;
  std::string script_file_;  // model "script": the file it came from (shown, and kept in the meta)
  models::Classifier builtin_;
  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;  // on module_ (evaluation always uses it)
  LossFn loss_;        // on forward_, or on the DataParallel wrapper under --strategy dp
  bool ours_ = false;  // made by builtin(): one of models::make_model's
  bool activation_checkpointing_ = false;  // --activation-checkpointing: the CNNs' stages
  models::Classifier step_model_;          // ours: builtin_, or its DataParallel wrapper
  std::vector<int64_t> input_shape_;
  int64_t classes_ = 0;
  ClassifierOptions options_;
  std::shared_ptr<ShardPool> eval_pool_;  // the fused step's threads, which evaluation borrows
  std::string first_conv_note_;           // the settings row of --first-conv whitened
  double first_conv_seconds_ = 0;         // computing its filters (counted as training time)
};

}  // namespace spritetorch::train
