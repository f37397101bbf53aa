#include "train/checkpoint_dataset.h"

#include <string>

#include "data/sprite_sources.h"

namespace spritetorch::train {

TrainConfig checkpoint_data_config(const nlohmann::json& meta) {
  TrainConfig config;
  const bool generator = meta.value("task", std::string()) == "generate";
  config.dataset = meta.value("dataset", std::string(generator ? "sprites" : "fashion-mnist"));
  config.seed = meta.value("seed", uint64_t{1});
  // Absent in older checkpoints: the defaults of that time (sprite_options_from_json). Fields the
  // dataset does not read go back to their defaults (older runs recorded them as passed), so that
  // load_datasets takes the config.
  config.sprites = data::sprite_options_read_by(
      config.dataset,
      data::sprite_options_from_json(meta.value("sprites", nlohmann::json::object())));
  return config;
}

}  // namespace spritetorch::train
