// The bridge between spritetorch checkpoints and Python PyTorch state dicts.
//
// Our classifiers (models/classifier.h) register their layers under the attribute names of the
// equivalent Python nn.Module (docs/interop.md prints those classes), so `python_name` is the
// identity today. It is still the one place that knows the mapping: a model whose C++ layout
// differs from its Python twin adds its renames to the table in python_state.cpp, and export and
// import follow.
//
// Inputs on the Python side are what our models see after batching: float32 in [0, 1] (uint8
// pixels * (1/255)), (B, C, H, W) for images, (B, F) for feature vectors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "interop/safetensors.h"
#include "models/classifier.h"
#include "train/checkpoint.h"

namespace spritetorch::interop {

std::string python_name(const std::string& model, const std::string& ours);
std::string our_name(const std::string& model, const std::string& python);

// The checkpoint's weights as Python's `model.state_dict()` holds them: Python names, in the order
// the Python module registers them, on the CPU, float32 (a TorchScript model's: the dtypes it was
// saved with). Metadata key "spritetorch" holds the checkpoint's metadata (JSON) so `import` can
// restore it. Throws DataError naming `source` when the checkpoint does not describe a classifier
// or its tensors do not fit the model. A module of the user's own (train::own_module_description)
// is written as it was saved: its own names, in name order, its dtypes.
TensorFile python_state_dict(const train::Checkpoint& checkpoint, const std::string& source);

// The other way, for a module of the caller's own: a Python state dict (`safetensors.torch.
// save_file(model.state_dict(), ...)`, or an export of the caller's checkpoint) into `module`'s
// parameters and buffers, by name, as PyTorch's load_state_dict(strict=True) does: every tensor of
// the module present with its shape, no other (DataError naming `source` and the key); dtypes
// converted to the module's, as load_state_dict converts them.
void load_state_dict(torch::nn::Module& module, const TensorFile& state, const std::string& source);

// A spritetorch checkpoint (weights + `meta`, no optimizer state) from a Python state dict for
// the model `spec`. Every tensor of the model must be present, float32 and of the model's shape,
// and nothing else may be: otherwise DataError naming `source` and the key. `meta` must describe
// the dataset (class_names, dataset, ...); model, input_shape and classes are set from `spec`.
train::Checkpoint checkpoint_from_python(const TensorFile& state, const models::ModelSpec& spec,
                                         nlohmann::json meta, const std::string& source);

// Deterministic sample inputs for the checkpoint's model and the logits spritetorch computes for
// them (eval mode, CPU): "inputs" is uint8 (N, C, H, W) for image models (the Python side feeds
// inputs.float() / 255) or float32 (N, F) for feature models (fed as they are); "logits" is
// float32 (N, classes). Python checks its load_state_dict against these.
TensorFile reference_outputs(const train::Checkpoint& checkpoint, const std::string& source,
                             int64_t count);

}  // namespace spritetorch::interop
