// Which data a checkpoint was trained on, read back from its metadata, so that `eval` (of
// classifiers and of generators) reloads the same train/test split the run had.
#pragma once

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace spritetorch::train {

// A TrainConfig whose data settings are the checkpoint's: "dataset" (where absent, from before the
// field: sprites for generators, else fashion-mnist), "seed" (else 1; the dummy dataset depends on
// it) and "sprites" (the sprite options: size, holdout, data seed, resize...; where absent, those
// older checkpoints were trained with: resize "nearest"). The rest keeps its defaults;
// data_dir and the limits are the caller's. load_datasets(result) gives the run's split. A field
// of the wrong JSON type or out of range is a DataError naming `source` (the checkpoint file).
TrainConfig checkpoint_data_config(const nlohmann::json& meta,
                                   const std::string& source = "checkpoint metadata");

}  // namespace spritetorch::train
