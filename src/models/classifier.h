// Image classifiers by name. Every model takes a float32 batch (B, C, H, W) or (B, F) and returns
// logits (B, classes); layer names match the equivalent Python nn.Module, so state dicts line up.
#pragma once

#include <torch/torch.h>

#include <array>

#include <memory>
#include <string>
#include <vector>

namespace spritetorch::models {

struct ModelSpec {
  std::string name;                  // "ann", "simplenn", "cnn"; "script" (models/script_model.h)
  std::vector<int64_t> input_shape;  // per sample: {C, H, W} or {F}
  int64_t classes = 10;
  // "script" only: the TorchScript file's bytes, and what to name in errors (its file, or the
  // checkpoint that carries it).
  std::shared_ptr<const std::string> script = nullptr;
  std::string script_source = {};
};

class ClassifierImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // (B, D) features of a batch: what the model has learnt to see, as a Fréchet distance between
  // two sets of images compares them (diffusion/fidelity.h). The built-in models give the input of
  // their last layer (the CNNs' pooled over positions); a model that does not say gives its logits.
  virtual torch::Tensor features(torch::Tensor x) { return forward(std::move(x)); }
  // Non-empty when the model is exactly Linear, ReLU, Linear, ..., Linear on flattened inputs:
  // then the trainer may use its fused step (train/train_step.h).
  virtual std::vector<torch::nn::Linear> relu_mlp_layers() { return {}; }
  // Activation checkpointing (models/activation_checkpoint.h) of the convolution stages before
  // the classifier head: each keeps only its input from forward to backward and runs again in
  // backward. Only models with such stages take it (cnn, fastcnn*: has_conv_stages()); set_...
  // throws spritetorch::Error naming the model for the others (--activation-checkpointing's
  // refusal). The same gradients and BatchNorm statistics.
  virtual bool has_conv_stages() const { return false; }
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return checkpointing_; }

  // What make_model built this from (empty name for models made otherwise).
  const ModelSpec& spec() const { return spec_; }
  // A deep copy (own storage, same values, same train/eval mode), optionally on another device:
  // LibTorch's data_parallel replicates the model onto each GPU with this. Built by make_model
  // from spec(), so only models made by make_model can be cloned.
  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<torch::Device>& device = c10::nullopt) const override;

 private:
  friend std::shared_ptr<ClassifierImpl> make_model(const ModelSpec& spec);
  ModelSpec spec_;
  bool checkpointing_ = false;
};
using Classifier = std::shared_ptr<ClassifierImpl>;

// Throws spritetorch::Error for an unknown name or an input shape the model cannot take (a
// DataError naming spec.script_source for a TorchScript model that does not fit the data).
Classifier make_model(const ModelSpec& spec);
// The models made by name (not "script", which needs its file).
const std::vector<std::string>& model_names();

// The seed's network: flatten, 784-128-64-10 with ReLU (seeds/004, section 8).
class AnnImpl : public ClassifierImpl {
 public:
  AnnImpl(int64_t in_features, int64_t classes);
  torch::Tensor forward(torch::Tensor x) override;
  torch::Tensor features(torch::Tensor x) override;  // (B, 64): what `out` sees
  std::vector<torch::nn::Linear> relu_mlp_layers() override { return {fc1, fc2, out}; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};

// Seed 003's SimpleNN: 3-10-2 with ReLU.
class SimpleNnImpl : public ClassifierImpl {
 public:
  SimpleNnImpl(int64_t in_features, int64_t classes);
  torch::Tensor forward(torch::Tensor x) override;
  torch::Tensor features(torch::Tensor x) override;  // (B, 10): what fc2 sees
  std::vector<torch::nn::Linear> relu_mlp_layers() override { return {fc1, fc2}; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// A small CNN that beats the MLP: two 3x3 conv + ReLU + 2x2 max-pool stages (32, 64 channels),
// then 128 hidden units with dropout. Needs H and W divisible by 4.
class CnnImpl : public ClassifierImpl {
 public:
  CnnImpl(int64_t channels, int64_t height, int64_t width, int64_t classes);
  torch::Tensor forward(torch::Tensor x) override;
  torch::Tensor features(torch::Tensor x) override;  // (B, 128): the hidden units fc2 sees
  bool has_conv_stages() const override { return true; }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};
};

// The `--recipe fast` CNN: three 3x3 conv + BatchNorm + ReLU + 2x2 max-pool stages, then one
// linear layer on the remaining (H/8, W/8) map. BatchNorm lets it take a large learning rate, and
// it spends little at full resolution, where a CPU's time goes to memory-bound work (normalisation,
// pooling) rather than to the convolutions. Needs H and W of at least 8. `fastcnn` has 16/32/64
// channels; `fastcnn-2x` (the `--recipe mid` model: 93% on a CPU) 32/64/128; `fastcnn-wide` (the
// `--recipe wide` model, for accuracy on a GPU) 64/128/256.
class FastCnnImpl : public ClassifierImpl {
 public:
  FastCnnImpl(int64_t channels, int64_t height, int64_t width, int64_t classes,
              std::array<int64_t, 3> widths = {16, 32, 64});
  torch::Tensor forward(torch::Tensor x) override;
  // (B, w2): the last stage's map averaged over its (H/8, W/8) positions. fc sees the whole map
  // (w2 H W / 64 values: 4,096 for fastcnn-wide at 32 x 32), too many dimensions to estimate a
  // covariance from a few hundred images.
  torch::Tensor features(torch::Tensor x) override;
  bool has_conv_stages() const override { return true; }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Linear fc{nullptr};
};

}  // namespace spritetorch::models
