// Time to accuracy (`spritetorch bench --target-accuracy X`): one workload trained from several
// seeds, each to the end of its own schedule, with the test set evaluated along the way outside the
// timed training. Each run reports when it first reached the target (the training time, the way
// airbench counts it) and the accuracy its fixed schedule ends at, which keeps the figure honest:
// stopping on the test set selects on it, the full schedule does not.
#pragma once

#include <cstdint>
#include <vector>

#include "train/config.h"
#include "train/trainer.h"

namespace spritetorch {

struct TargetRun {
  uint64_t seed = 0;
  bool reached = false;
  double time_to_target_s = 0;  // when reached
  double target_epoch = 0;      // fractional epochs done then
  int64_t target_step = 0;
  double final_accuracy = 0;  // the whole schedule's test accuracy
  double train_s = 0;         // the whole schedule's training time
};

struct TimeToAccuracyReport {
  double target = 0;
  std::vector<TargetRun> runs;  // one per seed, in seed order
  int reached = 0;              // runs that reached the target
  // Over the runs that reached it (0 when none did).
  double median_time_s = 0, min_time_s = 0, max_time_s = 0;
  // Over all runs.
  double median_final_accuracy = 0, median_train_s = 0;
};

class TimeToAccuracyObserver {
 public:
  virtual ~TimeToAccuracyObserver() = default;
  virtual void on_run(const TargetRun& /*run*/) {}
};

// Trains `workload` (its target_accuracy > 0) from seeds workload.seed .. workload.seed + seeds - 1
// on the same data, each to the end of its schedule (stop_at_target off).
TimeToAccuracyReport run_time_to_accuracy(const train::TrainConfig& workload, int seeds,
                                          TimeToAccuracyObserver* observer = nullptr);

// The median of `values` (the mean of the middle two for an even count); 0 for none.
double median_of(std::vector<double> values);

}  // namespace spritetorch
