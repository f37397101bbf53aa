// What `spritetorch import` makes of a Python state dict before it checks the tensors: the model
// and dataset it is for, and the metadata of the checkpoint it becomes. Our own exports carry their
// checkpoint's metadata (__metadata__.spritetorch), which fills what the caller left open.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "interop/safetensors.h"
#include "models/classifier.h"
#include "train/config.h"

namespace spritetorch::interop {

struct ImportMeta {
  train::TrainConfig config;  // the caller's, with dataset and model filled in
  models::ModelSpec spec;     // the model; input shape and classes as the dataset has them
  nlohmann::json meta;        // for checkpoint_from_python
};

// `config` holds the caller's choices: config.model empty leaves the model open; `dataset_given`
// false leaves the dataset (and its sprite options) open. Open ones come from the file's metadata,
// else the defaults (fashion-mnist; cnn for sprite datasets, else ann). The dataset is loaded (one
// sample of each split) for its shape and classes, exactly as training would see them. Throws
// DataError naming `source` when __metadata__.spritetorch is not a JSON object.
ImportMeta import_meta(const TensorFile& state, const std::string& source,
                       train::TrainConfig config, bool dataset_given);

}  // namespace spritetorch::interop
