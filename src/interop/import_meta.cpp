#include "interop/import_meta.h"

#include "common/error.h"
#include "data/sprite_sources.h"
#include "train/trainer.h"

namespace spritetorch::interop {

ImportMeta import_meta(const TensorFile& state, const std::string& source,
                       train::TrainConfig config, bool dataset_given) {
  nlohmann::json exported;
  if (auto it = state.metadata.find("spritetorch"); it != state.metadata.end()) {
    exported = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (!exported.is_object())
      throw DataError(source, "__metadata__.spritetorch holding a JSON object",
                      it->second.substr(0, 200));
  }
  if (!dataset_given && exported.contains("dataset") && exported["dataset"].is_string()) {
    config.dataset = exported["dataset"].get<std::string>();
    if (exported.contains("sprites"))  // as a checkpoint's: fields the dataset reads
      config.sprites = data::sprite_options_read_by(
          config.dataset, data::sprite_options_from_json(exported["sprites"]));
  }
  if (config.model.empty() && exported.contains("model") && exported["model"].is_string())
    config.model = exported["model"].get<std::string>();
  if (config.model.empty()) config.model = train::default_model(config);

  // The dataset decides the input shape and the classes, exactly as training would.
  config.train_limit = config.test_limit = 1;
  const auto sets = train::load_datasets(config);
  auto shape = sets.test.inputs.sizes().vec();
  shape.erase(shape.begin());
  ImportMeta out;
  out.spec = models::ModelSpec{config.model, shape, sets.test.num_classes()};
  out.meta = {{"class_names", sets.test.class_names},
              {"dataset", config.dataset},
              {"epoch", 0},
              {"seed", config.seed},
              {"imported_from", source},
              {"spritetorch_version", SPRITETORCH_VERSION}};
  if (data::is_sprite_dataset(config.dataset))
    out.meta["sprites"] = data::sprite_options_json(config.sprites);
  out.config = std::move(config);
  return out;
}

}  // namespace spritetorch::interop
