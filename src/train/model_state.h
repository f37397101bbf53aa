// A module's weights as a name -> tensor map and back, and the built-in classifier a checkpoint
// describes: what checkpoints, export and import share.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>

#include "models/classifier.h"
#include "train/checkpoint.h"

namespace spritetorch::train {

// Parameters and buffers as name -> tensor, on the CPU.
std::map<std::string, torch::Tensor> model_state(const torch::nn::Module& model);
// Copies `state` into the module's own tensors (flat-optimizer views stay valid); checks every name
// and shape and names `source` in its errors.
void load_model_state(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& state,
                      const std::string& source);
// What a checkpoint holds when no command of spritetorch's can build it: "model 'tinynet'" (a
// ClassifierTask over a module of the user's program) or "task 'denoise'" (a task of the user's
// own); empty for the built-in classifiers and the generator. Export writes such weights as they
// are; eval, classify and generate refuse them with this description.
std::string own_module_description(const Checkpoint& checkpoint, const std::string& source);
// A TorchScript model's checkpoint (model "script") carries the archive in its task section under
// this name; script_archive reads it back (a DataError naming `source` when it is missing).
inline constexpr char kScriptArchive[] = "script";
std::shared_ptr<const std::string> script_archive(const Checkpoint& checkpoint,
                                                  const std::string& source);
// Refuses a model whose parameters hold a NaN or an infinity (a run that diverged, or a file
// another tool wrote), naming the first such tensor and `source`: its outputs would be NaN, read by
// eval as a loss of NaN, by classify as class 0, by generate as blank sprites. Parameters only: a
// TorchScript model may keep an infinity in a buffer on purpose (a -inf attention mask).
void check_finite_parameters(const torch::nn::Module& model, const std::string& source);
// Builds the built-in classifier a checkpoint describes and loads its weights, on `device`.
models::Classifier model_from_checkpoint(const Checkpoint& checkpoint, const std::string& source,
                                         torch::Device device);

}  // namespace spritetorch::train
