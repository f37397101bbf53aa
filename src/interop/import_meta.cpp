#include "interop/import_meta.h"

#include <c10/util/StringUtil.h>

#include <algorithm>

#include "common/error.h"
#include "common/json_field.h"
#include "data/sprite_sources.h"
#include "models/classifier.h"
#include "train/trainer.h"

namespace spritetorch::interop {

ImportMeta import_meta(const TensorFile& state, const std::string& source,
                       train::TrainConfig config, const std::set<std::string>& given) {
  nlohmann::json exported;
  if (auto it = state.metadata.find("spritetorch"); it != state.metadata.end()) {
    exported = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (!exported.is_object())
      throw DataError(source, "__metadata__.spritetorch holding a JSON object",
                      it->second.substr(0, 200));
  } else {
    exported = nlohmann::json::object();
  }
  const std::string where = source + " (__metadata__.spritetorch)";
  const std::string recorded_dataset =
      json_field(exported, "dataset", std::string(), where, "dataset");
  // The recorded data, unless --dataset names other data: the weights were trained on it, so the
  // data options given must agree with it (a model trained at --size 32 cannot take 16).
  if (!recorded_dataset.empty() &&
      (!given.count("--dataset") || config.dataset == recorded_dataset)) {
    config.dataset = recorded_dataset;
    if (exported.contains("sprites")) {  // as a checkpoint's: fields the dataset reads
      const auto recorded = data::sprite_options_read_by(
          config.dataset, data::sprite_options_from_json(exported["sprites"], where));
      data::check_sprite_options_apply(config.dataset, config.sprites);  // before they are replaced
      data::check_given_sprite_options_match(config.dataset, config.sprites, recorded, given,
                                             "the metadata of " + source);
      config.sprites = recorded;
    }
    if (exported.contains("seed")) {
      const auto seed = json_field(exported, "seed", uint64_t{0}, where, "seed");
      if (!given.count("--seed")) {
        config.seed = seed;
      } else if (config.dataset == "dummy" && config.seed != seed) {  // the dummy data's seed
        throw Error("--seed " + std::to_string(config.seed) + ": the metadata of " + source +
                        " records --seed " + std::to_string(seed) + " for the dummy dataset",
                    "leave --seed out to use the recorded value");
      }
    }
  }
  if (config.model.empty()) {
    config.model = json_field(exported, "model", std::string(), where, "model");
    const auto names = models::model_names();
    if (!config.model.empty() && std::find(names.begin(), names.end(), config.model) == names.end())
      throw DataError(where, "'model' as one of " + c10::Join(", ", names),
                      "'" + config.model + "'", "pass --model with the Python class it holds");
  }
  if (config.model.empty()) config.model = train::default_model(config);
  // Test-time flips change a classifier's answers: the weights keep the setting they were
  // exported with.
  const std::string flips =
      json_field(exported, "test_time_augment", std::string("none"), where, "test_time_augment");
  if (flips != "none" && flips != "flip")
    throw DataError(where, "'test_time_augment' as none or flip", "'" + flips + "'");

  // The dataset decides the input shape and the classes, exactly as training would.
  config.train_limit = config.test_limit = 1;
  const bool recorded = !recorded_dataset.empty() && config.dataset == recorded_dataset;
  const auto sets = [&] {
    try {
      return train::load_datasets(config);
    } catch (const Error& e) {
      if (!recorded || given.count("--dataset")) throw;
      throw Error("the dataset that " + where + " records, " + recorded_dataset + ": " + e.what(),
                  e.hint().empty() ? "pass --dataset with where that data is now" : e.hint());
    }
  }();
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
  if (flips != "none") out.meta["test_time_augment"] = flips;
  if (data::is_sprite_dataset(config.dataset))
    out.meta["sprites"] = data::sprite_options_json(config.sprites);
  out.config = std::move(config);
  return out;
}

}  // namespace spritetorch::interop
