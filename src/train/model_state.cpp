#include "train/model_state.h"

#include <algorithm>
#include <set>

#include "common/error.h"
#include "common/json_field.h"
#include "train/run_state.h"

namespace spritetorch::train {

std::map<std::string, torch::Tensor> model_state(const torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().detach().cpu();
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value().cpu();
  return out;
}

void load_model_state(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& state,
                      const std::string& source) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  auto load = [&](const std::string& name, torch::Tensor target) {
    auto it = state.find(name);
    if (it == state.end()) throw DataError(source, "a tensor '" + name + "'", "none");
    if (it->second.sizes() != target.sizes())
      throw DataError(source, "'" + name + "' of shape " + c10::str(target.sizes()),
                      "shape " + c10::str(it->second.sizes()));
    target.copy_(it->second);  // copy_ keeps target's storage (flat optimizer views stay valid)
    used.insert(name);
  };
  for (auto& p : model.named_parameters()) load(p.key(), p.value());
  for (auto& b : model.named_buffers()) load(b.key(), b.value());
  if (used.size() != state.size()) {
    // Name one: a state dict of another model says at once which.
    std::string extra;
    for (const auto& [name, t] : state)
      if (!used.count(name)) {
        extra = name;
        break;
      }
    throw DataError(source, std::to_string(used.size()) + " model tensors",
                    std::to_string(state.size()) + ", among them '" + extra +
                        "', which this model does not have");
  }
}

std::string own_module_description(const Checkpoint& checkpoint, const std::string& source) {
  const auto task = json_field(checkpoint.meta, "task", std::string("classify"), source, "task");
  if (task == "generate") return "";
  if (task != "classify") return "task '" + task + "'";
  const auto model = json_field(checkpoint.meta, "model", std::string(), source, "model");
  const auto& ours = models::model_names();
  if (model.empty() || model == "script" ||
      std::find(ours.begin(), ours.end(), model) != ours.end())
    return "";
  return "model '" + model + "'";
}

std::shared_ptr<const std::string> script_archive(const Checkpoint& checkpoint,
                                                  const std::string& source) {
  const auto it = checkpoint.task.find(kScriptArchive);
  if (it == checkpoint.task.end() || it->second.scalar_type() != torch::kUInt8 ||
      it->second.dim() != 1)
    throw DataError(source, "the TorchScript archive of its model 'script' (task.script, uint8)",
                    it == checkpoint.task.end() ? "none" : "a tensor of another kind");
  const torch::Tensor bytes = it->second.contiguous();
  return std::make_shared<const std::string>(reinterpret_cast<const char*>(bytes.data_ptr()),
                                             static_cast<size_t>(bytes.numel()));
}

void check_finite_parameters(const torch::nn::Module& model, const std::string& source) {
  for (const auto& p : model.named_parameters())
    if (p.value().is_floating_point() && !torch::isfinite(p.value()).all().item<bool>())
      throw DataError(source, "finite weights", "NaN or infinity in '" + p.key() + "'",
                      "the run that wrote it diverged: take an earlier checkpoint of it, or train "
                      "again with a lower --lr");
}

models::Classifier model_from_checkpoint(const Checkpoint& checkpoint, const std::string& source,
                                         torch::Device device) {
  // What the file is, before what it holds: a generator's metadata lacks input_shape, and "found no
  // 'input_shape'" would not say that the wrong kind of checkpoint was passed.
  const auto task = json_field(checkpoint.meta, "task", std::string("classify"), source, "task");
  if (task == "generate")
    throw DataError(source, "a classifier checkpoint (train --task classify)",
                    "a sprite generator checkpoint (task 'generate')");
  const std::string own = own_module_description(checkpoint, source);
  if (!own.empty()) {
    std::string ours;
    for (const auto& name : models::model_names()) ours += (ours.empty() ? "" : ", ") + name;
    throw DataError(source, "a classifier spritetorch can build (" + ours + ")",
                    own + ", from a program of its own (the library's Trainer)",
                    "run it in the program that trained it; `spritetorch export --checkpoint " +
                        source + " OUT.safetensors` writes its weights for Python");
  }
  models::ModelSpec spec;
  for (const char* key : {"model", "input_shape", "classes"})
    if (!checkpoint.meta.contains(key))
      throw DataError(source, "metadata with model, input_shape and classes",
                      std::string("no '") + key + "'");
  spec.name = json_field(checkpoint.meta, "model", std::string(), source, "model");
  spec.input_shape =
      json_field(checkpoint.meta, "input_shape", std::vector<int64_t>(), source, "input_shape");
  spec.classes = json_field(checkpoint.meta, "classes", int64_t{0}, source, "classes");
  int64_t file_values = 0;
  for (const auto& [name, t] : checkpoint.model) file_values += t.numel();
  if (spec.name == "script") {
    spec.script = script_archive(checkpoint, source);
    spec.script_source = source;
    // A TorchScript model may pool: its weights do not bound its input. The probe make_model runs
    // is a batch of 2, so the input still has to stay plausible.
    file_values = std::max<int64_t>(file_values, int64_t{1} << 24);
  }
  check_model_spec(spec, file_values, source);  // a hostile file must not size our allocations
  // Names are optional (a dataset without them predicts class numbers), but when present there is
  // one per output: classify and eval would otherwise print a wrong name, or none, for a class.
  const auto names =
      json_field(checkpoint.meta, "class_names", std::vector<std::string>(), source, "class_names");
  if (!names.empty() && static_cast<int64_t>(names.size()) != spec.classes)
    throw DataError(source,
                    "metadata 'class_names' with one name for each of its " +
                        std::to_string(spec.classes) + " classes",
                    std::to_string(names.size()) + " names");
  auto model = models::make_model(spec);
  load_model_state(*model, checkpoint.model, source);
  check_finite_parameters(*model, source);  // on the CPU, before the copy to the device
  model->to(device);
  return model;
}

}  // namespace spritetorch::train
