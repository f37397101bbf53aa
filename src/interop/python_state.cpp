#include "interop/python_state.h"

#include <map>
#include <set>

#include "common/error.h"
#include "common/json_field.h"
#include "common/json_text.h"
#include "data/dataset.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::interop {

namespace {

// (model, our name) -> Python name, for layers whose C++ name differs from the Python attribute.
// Empty: every classifier registers its layers under the Python names (models/classifier.cpp).
const std::map<std::pair<std::string, std::string>, std::string>& renames() {
  static const std::map<std::pair<std::string, std::string>, std::string> kRenames;
  return kRenames;
}

std::string dims(const torch::Tensor& t) { return c10::str(t.sizes()); }

std::string python_keys(const std::string& model_name, torch::nn::Module& model) {
  std::string out;
  for (const auto& p : model.named_parameters())
    out += (out.empty() ? "" : ", ") + python_name(model_name, p.key());
  return out;
}

}  // namespace

std::string python_name(const std::string& model, const std::string& ours) {
  const auto it = renames().find({model, ours});
  return it == renames().end() ? ours : it->second;
}

std::string our_name(const std::string& model, const std::string& python) {
  for (const auto& [key, py] : renames())
    if (key.first == model && py == python) return key.second;
  return python;
}

TensorFile python_state_dict(const train::Checkpoint& checkpoint, const std::string& source) {
  if (json_field(checkpoint.meta, "task", std::string(), source, "task") == "generate")
    throw DataError(source, "a classifier checkpoint (ann, cnn, fastcnn, simplenn)",
                    "a sprite generator checkpoint",
                    "export covers the classifiers; the generator's UNet has no Python twin in "
                    "docs/interop.md");
  nlohmann::json meta = checkpoint.meta;
  meta.erase("run");  // mid-run state belongs to resuming, not to the weights
  meta.erase("grad_scaler");
  TensorFile out;
  out.metadata["format"] = "pt";  // what Hugging Face's loaders expect of a PyTorch state dict
  out.metadata["spritetorch"] = json_text(meta);
  if (!train::own_module_description(checkpoint, source).empty()) {
    // A module of the user's program: no class of ours to check against, so its tensors go out
    // as the module registered them (LibTorch names a module's tensors as PyTorch names the same
    // module's), in name order, dtypes kept. load_state_dict matches by name, not order.
    for (const auto& [name, t] : checkpoint.model) out.tensors.emplace_back(name, t.contiguous());
    return out;
  }
  // Building the model checks the checkpoint's tensors against it and gives Python's order.
  auto model = train::model_from_checkpoint(checkpoint, source, torch::kCPU);
  const std::string model_name = checkpoint.meta.at("model").get<std::string>();
  // A TorchScript model's parameters keep the dtype it was saved with (its torchscript export and
  // its buffers do too); our own classes are float32.
  const bool script = model_name == "script";
  // Python's state_dict order: module by module, each one's parameters, then its buffers
  // (BatchNorm's running statistics follow its weight and bias).
  for (const auto& m : model->named_modules("", /*include_self=*/true)) {
    const std::string prefix = m.key().empty() ? "" : m.key() + ".";
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false))
      out.tensors.emplace_back(
          python_name(model_name, prefix + p.key()),
          (script ? p.value().detach() : p.value().detach().to(torch::kFloat32)).contiguous());
    for (const auto& b : m.value()->named_buffers(/*recurse=*/false))
      out.tensors.emplace_back(python_name(model_name, prefix + b.key()), b.value().contiguous());
  }
  return out;
}

void load_state_dict(torch::nn::Module& module, const TensorFile& state,
                     const std::string& source) {
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, t] : state.tensors) by_name[name] = t;
  train::load_model_state(module, by_name, source);
}

train::Checkpoint checkpoint_from_python(const TensorFile& state, const models::ModelSpec& spec,
                                         nlohmann::json meta, const std::string& source) {
  auto model = models::make_model(spec);
  train::Checkpoint out;
  std::set<std::string> used;
  auto take = [&](const std::string& ours, const torch::Tensor& target) {
    const std::string key = python_name(spec.name, ours);
    const torch::Tensor* found = state.find(key);
    // Integer buffers (BatchNorm's num_batches_tracked) stay integers under model.float(), and
    // PyTorch and our export save them as I64: any integer dtype is taken for them.
    const bool integer = !c10::isFloatingType(target.scalar_type());
    const std::string wanted =
        "'" + key + "' of shape " + dims(target) + (integer ? " of an integer dtype" : " F32");
    if (!found)
      throw DataError(source, "a tensor " + wanted + " (model '" + spec.name + "')", "no such key",
                      "the keys of model '" + spec.name + "' are " +
                          python_keys(spec.name, *model) + " (docs/interop.md)");
    const bool dtype_fits = integer
                                ? c10::isIntegralType(found->scalar_type(), /*includeBool=*/false)
                                : found->scalar_type() == torch::kFloat32;
    if (!dtype_fits)
      throw DataError(source, "tensor " + wanted, safetensors_dtype(found->scalar_type()),
                      integer ? "save the model's own state dict (model.state_dict())"
                              : "save the state dict of model.float()");
    if (found->sizes() != target.sizes())
      throw DataError(source, "tensor " + wanted, "shape " + dims(*found),
                      "check --model and the dataset options (input shape, class count)");
    if (!torch::isfinite(*found).all().item<bool>())
      throw DataError(source, "finite values in tensor '" + key + "'", "NaN or infinity");
    out.model[ours] = found->to(target.scalar_type()).clone();
    used.insert(key);
  };
  for (const auto& p : model->named_parameters()) take(p.key(), p.value());
  for (const auto& b : model->named_buffers()) take(b.key(), b.value());
  for (const auto& [key, tensor] : state.tensors)
    if (!used.count(key))
      throw DataError(
          source,
          "only the tensors of model '" + spec.name + "' (" + python_keys(spec.name, *model) + ")",
          "an extra tensor '" + key + "'", "is --model right? a state dict of a different module?");
  if (!meta.is_object()) meta = nlohmann::json::object();
  meta["model"] = spec.name;
  meta["input_shape"] = spec.input_shape;
  meta["classes"] = spec.classes;
  meta.erase("run");
  meta.erase("grad_scaler");
  out.meta = std::move(meta);
  return out;
}

TensorFile reference_outputs(const train::Checkpoint& checkpoint, const std::string& source,
                             int64_t count) {
  auto model = train::model_from_checkpoint(checkpoint, source, torch::kCPU);
  const auto shape = checkpoint.meta.at("input_shape").get<std::vector<int64_t>>();
  std::vector<int64_t> batch_shape{count};
  batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
  auto generator = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/20240);
  // Images are stored as uint8 pixels, features as float32: the same kinds a Dataset holds.
  const torch::Tensor inputs = shape.size() == 3
                                   ? at::randint(0, 256, batch_shape, generator, torch::kUInt8)
                                   : at::randn(batch_shape, generator, torch::kFloat32);
  model->eval();
  torch::NoGradGuard no_grad;
  TensorFile out;
  out.tensors = {{"inputs", inputs},
                 {"logits", model->forward(data::to_model_input(inputs)).contiguous()}};
  out.metadata["model"] = checkpoint.meta.at("model").get<std::string>();
  return out;
}

}  // namespace spritetorch::interop
