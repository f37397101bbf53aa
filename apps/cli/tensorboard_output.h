// `train --tensorboard`: where the event files go and what goes into them besides the observer's
// scalars (a sheet of training samples, the test results).
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"
#include "report/tensorboard.h"
#include "train/config.h"

namespace spritetorch::cli {

// The folder of this run's event files: the run folder (docs/runs.md) when there is one, so that
// `tensorboard --logdir runs` shows one TensorBoard run per training run; with --no-run-dir,
// <runs root>/<YYYY-mm-dd_HH-MM-SS>_<host> (like PyTorch's SummaryWriter default).
std::string tensorboard_dir(const std::string& run_folder, const std::string& runs_root);

// The writer for this process, or nullptr on ranks other than 0 of a multi-process run (rank 0
// speaks for the job, as with the printed progress).
std::unique_ptr<report::EventWriter> open_tensorboard(const std::string& run_folder,
                                                      const std::string& runs_root);

// A sheet of the first 64 training images ("data/train_samples", step 0); nothing for feature
// datasets (dummy), which are not images. `train`: the datasets the run trains on (read once).
void log_training_samples(report::EventWriter& events, const data::Dataset& train);

}  // namespace spritetorch::cli
