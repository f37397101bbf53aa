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

// A sprite classifier (sprite datasets, no --epochs) trains for kSpriteClassifierEpochs epochs,
// held to at least kSpriteClassifierSteps and at most kSpriteClassifierMaxSteps optimizer steps
// (counting full batches), and never fewer than 5 epochs. Small real sets need their epochs: the
// 954 training sprites of the DCSS items get 36 (500 steps; held-out 0.77-0.81 after 5 epochs,
// 0.87-0.89 after 36, worse after 72), the 3,240 of the four-view characters 30 (1,500 steps;
// 0.91-0.93 after 10, 0.95-0.96 after 30, no better after 45 or 60; docs/sprites.md). The
// 7,200 procedural ones get 14 (1,500 steps), where 2 already reach 1.0: the cap bounds the time
// a larger set spends on epochs it does not need.
constexpr int64_t kSpriteClassifierEpochs = 30;
constexpr int64_t kSpriteClassifierSteps = 500;
constexpr int64_t kSpriteClassifierMaxSteps = 1500;
constexpr int64_t kSpriteClassifierMinEpochs = 5;
int64_t sprite_classifier_epochs(int64_t train_samples, int64_t batch);
// That rule in words ("30 epochs within 500-1500 steps, at least 5 epochs"), for --help and the
// "Epochs:" line of a run.
std::string sprite_classifier_epochs_rule();

// The epochs that make at least `steps` optimizer steps of `batch` (full batches) from
// `train_samples`, at least 1: the generator's and the sprite classifier's automatic epochs.
int64_t epochs_for_steps(int64_t steps, int64_t train_samples, int64_t batch);

}  // namespace spritetorch::train
