// `train --tensorboard`: where the event files go and what goes into them besides the observer's
// scalars (a sheet of training samples, the test results).
#pragma once

#include <memory>
#include <string>

#include "report/tensorboard.h"
#include "train/config.h"

namespace spritetorch::cli {

// The folder of this run's event files: runs/<YYYY-mm-dd_HH-MM-SS>_<host>, one TensorBoard run per
// training run (like PyTorch's SummaryWriter default), so `tensorboard --logdir runs` lists them.
// The one place to change when the run folder becomes the home of the event files.
std::string tensorboard_dir(const train::TrainConfig& config);

// The writer for this process, or nullptr on ranks other than 0 of a multi-process run (rank 0
// speaks for the job, as with the printed progress).
std::unique_ptr<report::EventWriter> open_tensorboard(const train::TrainConfig& config);

// A sheet of the first training images ("data/train_samples", step 0); nothing for feature
// datasets (dummy), which are not images.
void log_training_samples(report::EventWriter& events, const train::TrainConfig& config);

}  // namespace spritetorch::cli
