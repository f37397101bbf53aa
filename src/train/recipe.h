// Recipes: named sets of training defaults (`spritetorch train --recipe fast`). A recipe fills
// only the options a run leaves unset: the command line, the environment and a --config file
// override any of its values, and the run folder's config.toml records the values used. The
// choices and what each buys are measured in docs/benchmarks.md ("Time to accuracy").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spritetorch::train {

struct Recipe {
  std::string name;
  std::string summary;  // one line for --help
  // (long option name without dashes, value as the command line would give it), in the order
  // they are applied.
  std::vector<std::pair<std::string, std::string>> options;
};

const std::vector<Recipe>& recipes();
std::vector<std::string> recipe_names();
// "fast (summary); wide (summary)": every recipe for --help.
std::string describe_recipes();
// The recipe called `name`; an Error listing the names when there is none.
const Recipe& find_recipe(const std::string& name);

// What `train --task generate` takes for the options a run leaves unset when it names no
// recipe: the generator's defaults, measured on a real sprite set (docs/sprites.md). They are
// applied as a recipe is (flags, environment and --config files override each).
const Recipe& generator_defaults();

// A sprite classifier (sprite datasets, no --epochs) trains for at least kSpriteClassifierSteps
// optimizer steps (counting full batches) and at least the usual 5 epochs: the 954 training
// sprites of the DCSS items get 36 epochs (held-out accuracy 0.77-0.81 after 5 epochs, 0.88-0.89
// after 36; docs/sprites.md), the 7,200 procedural ones keep their 5 epochs.
constexpr int64_t kSpriteClassifierSteps = 500;
constexpr int64_t kSpriteClassifierMinEpochs = 5;
int64_t sprite_classifier_epochs(int64_t train_samples, int64_t batch);

// The epochs that make at least `steps` optimizer steps of `batch` (full batches) from
// `train_samples`, at least 1: the generator's and the sprite classifier's automatic epochs.
int64_t epochs_for_steps(int64_t steps, int64_t train_samples, int64_t batch);

}  // namespace spritetorch::train
