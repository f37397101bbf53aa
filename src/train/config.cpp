#include "train/config.h"

namespace spritetorch::train {

std::string default_model(const TrainConfig& config) {
  if (config.task == "generate") return "unet";
  return data::is_sprite_dataset(config.dataset) ? "cnn" : "ann";
}

}  // namespace spritetorch::train
