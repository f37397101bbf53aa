#include "train/recipe.h"

#include <algorithm>

#include "common/error.h"

namespace spritetorch::train {

namespace {

using Options = std::vector<std::pair<std::string, std::string>>;

// `base` with the values of `changes` in place of its own (same keys, same order).
Options changed(Options base, const Options& changes) {
  for (const auto& [key, value] : changes)
    for (auto& option : base)
      if (option.first == key) option.second = value;
  return base;
}

}  // namespace

const std::vector<Recipe>& recipes() {
  static const Options kFast = {
      {"model", "fastcnn"},       {"batch-size", "256"},     {"epochs", "4"},
      {"precision", "auto"},      {"optimizer", "adamw"},    {"lr", "0.01"},
      {"weight-decay", "0.05"},   {"lr-schedule", "cosine"}, {"warmup-steps", "100"},
      {"label-smoothing", "0.1"}, {"augment", "flip"},       {"test-time-augment", "flip"},
      {"first-conv", "whitened"}};
  // The fast recipe's 4 epochs: its 92% comes sooner than with 5 or 7. mid's 5: the shortest
  // cosine schedule that reaches 93% on every seed measured (4 misses on one of three). wide's
  // first convolution (64 channels: the 9 directions repeated 3.5 times) stays learned: whitened is
  // measured on long's 24 epochs only (94% at epochs 20 / 21 / 21 against 22 / 22 / 21;
  // docs/benchmarks.md, "A whitened first convolution").
  static const Options kWide = changed(kFast, {{"model", "fastcnn-wide"},
                                               {"epochs", "16"},
                                               {"augment", "flip,shift:2"},
                                               {"first-conv", "learned"}});
  static const std::vector<Recipe> kRecipes = {
      {"fast",
       "a good Fashion-MNIST model in the least training time: BatchNorm CNN whose first "
       "convolution whitens the images' 3x3 patches (frozen), batch 256, 4 epochs of AdamW with "
       "warm-up and cosine decay, label smoothing, flip augmentation, flip test-time averaging, "
       "bf16 where the device's native bf16 pays: 92% after 705-800 steps (6 of 6 seeds)",
       kFast},
      {"mid",
       "the fast recipe's loop with 2x the channels (fastcnn-2x: 32/64/128) and 5 epochs: 93% "
       "after 840-1,040 steps (6 of 6 seeds), under half wide's; 0.82 s on an H200, where a "
       "step's cost grows far more slowly than its work",
       changed(kFast, {{"model", "fastcnn-2x"}, {"epochs", "5"}})},
      {"wide",
       "the fast recipe's loop with 4x the channels (fastcnn-wide: 64/128/256), a learned first "
       "convolution, flips and 2-pixel shifts, 16 epochs: for 93% and more on a GPU, where the "
       "wider convolutions cost little",
       kWide},
      {"long",
       "the wide recipe over 24 epochs with the whitened first convolution: 94% (3 of 3 seeds, at "
       "epoch 20-21; wide's 16 epochs end near 93.9%), meant for a GPU",
       changed(kWide, {{"epochs", "24"}, {"first-conv", "whitened"}})},
  };
  return kRecipes;
}

const Recipe& generator_defaults() {
  static const Recipe kGenerator = {
      "generator defaults",
      "UNet base 32, bf16 where the device's native bf16 pays, Adam at lr 0.002 with cosine decay "
      "after 100 warm-up steps, every class drawn equally often, NCHW on CUDA (its GroupNorms "
      "run NCHW)",
      {{"unet-base", "32"},
       {"precision", "auto"},
       {"channels-last", "false"},
       {"lr", "0.002"},
       {"lr-schedule", "cosine"},
       {"warmup-steps", "100"},
       {"class-sampling", "balanced"}}};
  return kGenerator;
}

int64_t epochs_for_steps(int64_t steps, int64_t train_samples, int64_t batch) {
  const int64_t per_epoch = std::max<int64_t>(1, train_samples / std::max<int64_t>(1, batch));
  return std::max<int64_t>(1, (steps + per_epoch - 1) / per_epoch);
}

int64_t sprite_classifier_epochs(int64_t train_samples, int64_t batch) {
  const int64_t fewest = epochs_for_steps(kSpriteClassifierSteps, train_samples, batch);
  const int64_t most = epochs_for_steps(kSpriteClassifierMaxSteps, train_samples, batch);
  return std::max(kSpriteClassifierMinEpochs, std::clamp(kSpriteClassifierEpochs, fewest, most));
}

std::string sprite_classifier_epochs_rule() {
  return std::to_string(kSpriteClassifierEpochs) + " epochs within " +
         std::to_string(kSpriteClassifierSteps) + "-" + std::to_string(kSpriteClassifierMaxSteps) +
         " steps, at least " + std::to_string(kSpriteClassifierMinEpochs) + " epochs";
}

std::vector<std::string> recipe_names() {
  std::vector<std::string> names;
  for (const auto& r : recipes()) names.push_back(r.name);
  return names;
}

std::string describe_recipes() {
  std::string out;
  for (const auto& r : recipes())
    out += (out.empty() ? "" : "; ") + r.name + " (" + r.summary + ")";
  return out;
}

const Recipe& find_recipe(const std::string& name) {
  for (const auto& r : recipes())
    if (r.name == name) return r;
  std::string names;
  for (const auto& r : recipes()) names += (names.empty() ? "" : ", ") + r.name;
  throw Error("unknown recipe '" + name + "': expected one of " + names);
}

}  // namespace spritetorch::train
