// What `spritetorch import` makes of a Python state dict before it checks the tensors: the model
// and dataset it is for, and the metadata of the checkpoint it becomes. Our own exports carry their
// checkpoint's metadata (__metadata__.spritetorch), which fills what the caller left open.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
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

// `config` holds the caller's choices and `given` the flags the caller set (e.g. "--dataset",
// "--size", "--seed"); config.model empty leaves the model open. What is open comes from the
// file's metadata, else the defaults (fashion-mnist; cnn for sprite datasets, else ann). Unless
// --dataset names another dataset than the metadata's, the metadata's data options (sprite
// options, seed) are the weights' own: a given sprite option (or the dummy data's --seed) that
// differs from them is an Error naming both values. The dataset is loaded (one sample of each
// split) for its shape and classes, exactly as training would see them. Throws DataError naming
// `source` and the field when __metadata__.spritetorch is not a JSON object or a field is of the
// wrong type or out of range.
ImportMeta import_meta(const TensorFile& state, const std::string& source,
                       train::TrainConfig config, const std::set<std::string>& given);

}  // namespace spritetorch::interop
