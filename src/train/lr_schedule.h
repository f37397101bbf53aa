// Learning-rate schedules. The lr of a step is a function of the run's global step alone (and of
// its length), so interrupted, resumed and multi-rank runs follow one curve with nothing extra in
// the checkpoint: resuming with the same command continues it exactly.
#pragma once

#include <cstdint>
#include <string>

namespace spritetorch::train {

struct LrSchedule {
  enum class Kind { kConstant, kCosine, kStep };
  Kind kind = Kind::kConstant;
  int64_t every_epochs = 1;  // kStep: multiply by gamma every this many epochs
  double gamma = 0.1;        // kStep
  int64_t warmup_steps =
      0;  // linear warm-up: lr * (s + 1) / warmup_steps for steps s < warmup_steps

  bool constant() const { return kind == Kind::kConstant && warmup_steps == 0; }
};

// "constant" | "cosine" | "step:E" | "step:E:G" (every E epochs times G, default 0.1); throws Error
// naming the text otherwise.
LrSchedule parse_lr_schedule(const std::string& text, int64_t warmup_steps = 0);

// The multiplier of the base lr at 0-based global step `step`, in 0-based epoch `epoch`, of a run
// of `total_steps` steps. The epoch is given, not step / steps per epoch: a run resumed at an
// epoch's end with another --batch-size has epochs of two lengths. cosine: from 1 after the
// warm-up down to 0 at the last step's end (PyTorch's CosineAnnealingLR with T_max = the steps
// after the warm-up, eta_min 0, stepped each step); step: gamma^(epoch / every_epochs) (StepLR
// stepped each epoch).
double lr_factor(const LrSchedule& schedule, int64_t step, int64_t epoch, int64_t total_steps);

// "constant", "cosine, warm-up 100 steps", "step every 2 epochs x0.5": for settings rows.
std::string describe_lr_schedule(const LrSchedule& schedule);

}  // namespace spritetorch::train
