#include "train/checkpoint_dataset.h"

#include <string>

#include "common/json_field.h"
#include "data/sprite_sources.h"

namespace spritetorch::train {

TrainConfig checkpoint_data_config(const nlohmann::json& meta, const std::string& source) {
  TrainConfig config;
  const bool generator = json_field(meta, "task", std::string(), source, "task") == "generate";
  config.dataset = json_field(meta, "dataset", std::string(generator ? "sprites" : "fashion-mnist"),
                              source, "dataset");
  config.seed = json_field(meta, "seed", uint64_t{1}, source, "seed");
  // Absent in older checkpoints: the defaults of that time (sprite_options_from_json). Fields the
  // dataset does not read go back to their defaults (older runs recorded them as passed), so that
  // load_datasets takes the config.
  config.sprites = data::sprite_options_read_by(
      config.dataset,
      data::sprite_options_from_json(meta.value("sprites", nlohmann::json::object()), source));
  return config;
}

}  // namespace spritetorch::train
