#include "train/checkpoint_dataset.h"

#include <string>

#include "data/sprite_sources.h"

namespace spritetorch::train {

TrainConfig checkpoint_data_config(const nlohmann::json& meta) {
  TrainConfig config;
  const bool generator = meta.value("task", std::string()) == "generate";
  config.dataset = meta.value("dataset", std::string(generator ? "sprites" : "fashion-mnist"));
  config.seed = meta.value("seed", uint64_t{1});
  // Absent in older checkpoints: the defaults of that time (sprite_options_from_json). Other
  // datasets read none of them: the defaults, so that load_datasets takes the config.
  if (data::is_sprite_dataset(config.dataset))
    config.sprites =
        data::sprite_options_from_json(meta.value("sprites", nlohmann::json::object()));
  return config;
}

}  // namespace spritetorch::train
