// What a TrainConfig asks of the optimizer: its options (weight decay resolved to the optimizer's
// default), the learning-rate schedule, how both read in settings rows and checkpoints, and the
// check that a resumed run keeps its optimizer. Shared by the classifier trainer and the generator.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "train/checkpoint.h"
#include "train/config.h"
#include "train/flat_optimizer.h"
#include "train/lr_schedule.h"

namespace spritetorch::train {

struct Optimization {
  OptimizerOptions options;
  LrSchedule schedule;

  // The lr of 0-based global step `step`, in 0-based epoch `epoch`, of a run of `total_steps`.
  double lr_at(int64_t step, int64_t epoch, int64_t total_steps) const {
    return options.lr * lr_factor(schedule, step, epoch, total_steps);
  }
  // Sets the optimizer's lr for that step; nothing for a constant schedule.
  void set_step_lr(FlatOptimizer& optimizer, int64_t step, int64_t epoch,
                   int64_t total_steps) const {
    if (!schedule.constant()) optimizer.set_lr(lr_at(step, epoch, total_steps));
  }
  // "adamw lr 0.001, weight decay 0.01, cosine, warm-up 100 steps"
  std::string describe() const;
  // optimizer, lr, weight_decay, lr_schedule, warmup_steps: for checkpoint metadata.
  nlohmann::json meta(const std::string& lr_schedule_text) const;
};

// Throws Error on an unknown optimizer or schedule, or a negative weight decay.
Optimization optimization_of(const TrainConfig& config);

// A checkpoint trained with another optimizer than config.optimizer cannot be continued: its saved
// moments would be read as something else (adam's as sgd momentum). Checkpoints that name none
// were written by adam.
void check_resumed_optimizer(const Checkpoint& checkpoint, const std::string& path,
                             const TrainConfig& config);

}  // namespace spritetorch::train
