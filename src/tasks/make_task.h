// From a TrainConfig to a trained model: the task the config asks for (--task) and the one
// Trainer that trains it. What `spritetorch train` runs; library users with their own module build
// a train::ClassifierTask (or their own train::Task) and call train::Trainer::fit directly.
#pragma once

#include <memory>

#include "train/config.h"
#include "train/task.h"
#include "train/trainer.h"

namespace spritetorch {

// classify: a built-in classifier (--model, else default_model); generate: the sprite generator.
// Options that belong to the other task are refused here, naming the option and the task.
std::unique_ptr<train::Task> make_task(const train::TrainConfig& config);

// config's datasets (unless given), its task, one Trainer.
train::TrainReport run_training(const train::TrainConfig& config,
                                train::TrainObserver* observer = nullptr);
train::TrainReport run_training(const train::TrainConfig& config, const train::Datasets& data,
                                train::TrainObserver* observer = nullptr);

}  // namespace spritetorch
