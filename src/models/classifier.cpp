#include "models/classifier.h"

#include <numeric>

#include "common/error.h"
#include "models/activation_checkpoint.h"
#include "models/bn_relu_pool.h"
#include "models/conv3x3.h"
#include "models/script_model.h"

namespace spritetorch::models {

namespace {

int64_t product(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + ")";
}

Classifier make_model_of_kind(const ModelSpec& spec);  // below: one constructor call per name

// One convolution stage: checkpointed when the model asks for it and autograd records (the
// stages draw no random numbers: no generator state to keep).
torch::Tensor run_stage(ClassifierImpl& model,
                        const std::function<torch::Tensor(const torch::Tensor&)>& stage,
                        const torch::Tensor& x) {
  if (!model.activation_checkpointing() || !torch::GradMode::is_enabled()) return stage(x);
  CheckpointOptions options;
  options.preserve_rng = false;
  return checkpointed(model, stage, x, options);
}

}  // namespace

void ClassifierImpl::set_activation_checkpointing(bool on) {
  if (on && !has_conv_stages())
    throw Error(
        "--activation-checkpointing recomputes a CNN's convolution stages in backward; " +
            (spec_.name == "script" ? std::string("a TorchScript model's forward is one piece")
             : spec_.name.empty()   ? std::string("this model has none")
                                    : "--model " + spec_.name + " has none"),
        "use it with --model cnn, fastcnn, fastcnn-2x or fastcnn-wide");
  checkpointing_ = on;
}

AnnImpl::AnnImpl(int64_t in_features, int64_t classes) {
  fc1 = register_module("fc1", torch::nn::Linear(in_features, 128));
  fc2 = register_module("fc2", torch::nn::Linear(128, 64));
  out = register_module("out", torch::nn::Linear(64, classes));
}

torch::Tensor AnnImpl::features(torch::Tensor x) {
  x = x.flatten(1);  // (B, 784); a view where it can be, a copy of a non-contiguous input
  x = torch::relu(fc1(x));
  return torch::relu(fc2(x));
}

torch::Tensor AnnImpl::forward(torch::Tensor x) {
  return out(features(std::move(x)));  // logits: CrossEntropy applies the softmax
}

SimpleNnImpl::SimpleNnImpl(int64_t in_features, int64_t classes) {
  fc1 = register_module("fc1", torch::nn::Linear(in_features, 10));
  fc2 = register_module("fc2", torch::nn::Linear(10, classes));
}

torch::Tensor SimpleNnImpl::features(torch::Tensor x) { return torch::relu(fc1(x.flatten(1))); }

torch::Tensor SimpleNnImpl::forward(torch::Tensor x) { return fc2(features(std::move(x))); }

CnnImpl::CnnImpl(int64_t channels, int64_t height, int64_t width, int64_t classes) {
  using torch::nn::Conv2dOptions;
  conv1 = register_module(
      "conv1", torch::nn::Conv2d(Conv2dOptions(channels, 32, /*kernel_size=*/3).padding(1)));
  conv2 = register_module("conv2",
                          torch::nn::Conv2d(Conv2dOptions(32, 64, /*kernel_size=*/3).padding(1)));
  fc1 = register_module("fc1", torch::nn::Linear(64 * (height / 4) * (width / 4), 128));
  fc2 = register_module("fc2", torch::nn::Linear(128, classes));
  dropout = register_module("dropout", torch::nn::Dropout(0.25));
}

torch::Tensor CnnImpl::features(torch::Tensor x) {
  // relu(max_pool(x)) is max_pool(relu(x)), gradients included (the same element wins each
  // window or none gets a gradient), with the ReLU on a quarter of the values.
  auto stage1 = [this](const torch::Tensor& in) {
    return torch::relu(torch::max_pool2d(conv1(in), 2));  // (B, 32, H/2, W/2)
  };
  auto stage2 = [this](const torch::Tensor& in) {
    return torch::relu(torch::max_pool2d(conv3x3(*conv2, in), 2));  // (B, 64, H/4, W/4)
  };
  x = run_stage(*this, stage1, x);
  x = run_stage(*this, stage2, x);
  return torch::relu(fc1(x.flatten(1)));
}

torch::Tensor CnnImpl::forward(torch::Tensor x) { return fc2(dropout(features(std::move(x)))); }

FastCnnImpl::FastCnnImpl(int64_t channels, int64_t height, int64_t width, int64_t classes,
                         std::array<int64_t, 3> w) {
  using torch::nn::Conv2dOptions;
  auto conv = [](int64_t in, int64_t out) {
    return torch::nn::Conv2d(Conv2dOptions(in, out, /*kernel_size=*/3).padding(1).bias(false));
  };
  conv1 = register_module("conv1", conv(channels, w[0]));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(w[0]));
  conv2 = register_module("conv2", conv(w[0], w[1]));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(w[1]));
  conv3 = register_module("conv3", conv(w[1], w[2]));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(w[2]));
  fc = register_module("fc", torch::nn::Linear(w[2] * (height / 8) * (width / 8), classes));
}

namespace {
// Each stage's norm, ReLU and pool as one op on the CPU (in training, and in eval mode with
// AVX-512), the first stage in training with its convolution (models/bn_relu_pool.h).
torch::Tensor fast_cnn_map(FastCnnImpl& m, torch::Tensor x) {
  auto stage1 = [&m](const torch::Tensor& in) {
    // In the layout of the next convolution's weights (channels_last where the trainer runs so).
    return first_conv_bn_relu_pool(*m.conv1, *m.bn1, in, gemm::best_kernel(),
                                   m.conv2->weight.suggest_memory_format());  // (B, w0, H/2, W/2)
  };
  auto stage2 = [&m](const torch::Tensor& in) {
    return bn_relu_pool(*m.bn2, conv3x3(*m.conv2, in));  // (B, w1, H/4, W/4)
  };
  x = run_stage(m, stage1, x);
  x = run_stage(m, stage2, x);
  // The last stage plainly: backward needs its activations first, so keeping them costs nothing.
  return bn_relu_pool(*m.bn3, conv3x3(*m.conv3, x));  // (B, w2, H/8, W/8)
}
}  // namespace

torch::Tensor FastCnnImpl::forward(torch::Tensor x) {
  return fc(fast_cnn_map(*this, std::move(x)).flatten(1));
}

torch::Tensor FastCnnImpl::features(torch::Tensor x) {
  return fast_cnn_map(*this, std::move(x)).mean({2, 3});
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> kNames = {"ann",        "cnn",          "fastcnn",
                                                  "fastcnn-2x", "fastcnn-wide", "simplenn"};
  return kNames;
}

Classifier make_model(const ModelSpec& spec) {
  Classifier model = make_model_of_kind(spec);
  model->spec_ = spec;
  return model;
}

std::shared_ptr<torch::nn::Module> ClassifierImpl::clone(
    const c10::optional<torch::Device>& device) const {
  if (spec_.name.empty())
    throw Error("this classifier was not made by models::make_model and cannot be cloned");
  Classifier copy = make_model(spec_);
  torch::NoGradGuard no_grad;
  // set_data keeps the copy's Parameter objects (and their names) but gives them new storage.
  auto copy_into = [&device](const torch::Tensor& from, torch::Tensor to) {
    to.set_data(device ? from.to(*device, /*non_blocking=*/false, /*copy=*/true) : from.clone());
  };
  const auto params = named_parameters(/*recurse=*/true);
  const auto copy_params = copy->named_parameters(/*recurse=*/true);
  for (const auto& p : params) copy_into(p.value(), copy_params[p.key()]);
  const auto buffers = named_buffers(/*recurse=*/true);
  const auto copy_buffers = copy->named_buffers(/*recurse=*/true);
  for (const auto& b : buffers) copy_into(b.value(), copy_buffers[b.key()]);
  copy->train(is_training());
  copy->checkpointing_ = checkpointing_;
  return copy;
}

namespace {

Classifier make_model_of_kind(const ModelSpec& spec) {
  if (spec.classes < 2)
    throw Error("a classifier needs at least 2 classes, got " + std::to_string(spec.classes));
  const int64_t features = product(spec.input_shape);
  if (spec.name == "script") {
    if (!spec.script)
      throw Error("model 'script' needs its TorchScript file (--model script:FILE)");
    auto model = std::make_shared<ScriptClassifierImpl>(*spec.script, spec.script_source);
    model->check_logits(spec.input_shape, spec.classes);
    return model;
  }
  if (spec.name == "ann") return std::make_shared<AnnImpl>(features, spec.classes);
  if (spec.name == "simplenn") return std::make_shared<SimpleNnImpl>(features, spec.classes);
  if (spec.name == "cnn") {
    const auto& s = spec.input_shape;
    if (s.size() != 3 || s[1] % 4 != 0 || s[2] % 4 != 0)
      throw Error(
          "model 'cnn' needs image inputs (C, H, W) with H and W divisible by 4; this "
          "dataset's samples are " +
              shape_string(s),
          "use --model ann or simplenn for feature vectors");
    return std::make_shared<CnnImpl>(s[0], s[1], s[2], spec.classes);
  }
  if (spec.name == "fastcnn" || spec.name == "fastcnn-2x" || spec.name == "fastcnn-wide") {
    const auto& s = spec.input_shape;
    if (s.size() != 3 || s[1] < 8 || s[2] < 8)
      throw Error("model '" + spec.name +
                      "' needs image inputs (C, H, W) of at least 8x8; this dataset's samples "
                      "are " +
                      shape_string(s),
                  "use --model ann or simplenn for feature vectors");
    if (spec.name == "fastcnn-2x")
      return std::make_shared<FastCnnImpl>(s[0], s[1], s[2], spec.classes,
                                           std::array<int64_t, 3>{32, 64, 128});
    if (spec.name == "fastcnn-wide")
      return std::make_shared<FastCnnImpl>(s[0], s[1], s[2], spec.classes,
                                           std::array<int64_t, 3>{64, 128, 256});
    return std::make_shared<FastCnnImpl>(s[0], s[1], s[2], spec.classes);
  }
  std::string names;
  for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown model '" + spec.name + "': expected one of " + names);
}

}  // namespace

}  // namespace spritetorch::models
