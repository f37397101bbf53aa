#include "tasks/time_to_accuracy.h"

#include <algorithm>

#include "common/error.h"
#include "tasks/make_task.h"

namespace spritetorch {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

TimeToAccuracyReport run_time_to_accuracy(const train::TrainConfig& workload, int seeds,
                                          TimeToAccuracyObserver* observer) {
  if (workload.target_accuracy <= 0 || workload.target_accuracy > 1)
    throw Error("time to accuracy needs a target accuracy in (0, 1]");
  if (seeds < 1) throw Error("time to accuracy needs at least one seed");
  if (workload.task != train::TaskKind::kClassify)
    throw Error("time to accuracy measures classifiers (--task classify)");
  if (!workload.save.empty() || !workload.resume.empty())
    throw Error("time to accuracy trains from scratch and keeps no checkpoint",
                "drop --save and --resume");
  const train::Datasets data = train::load_datasets(workload);
  TimeToAccuracyReport report;
  report.target = workload.target_accuracy;
  std::vector<double> times, finals, trains;
  {
    // Untimed warm-up through the same path (as airbench does): the device's context, lazy
    // kernel loading, cuDNN's algorithm search and the allocator's pools are paid here, not by the
    // first seed (on an H100 they made one seed's 1.4 s read 7 s).
    train::TrainConfig warm = workload;
    warm.epochs = 1;
    warm.target_accuracy = 0;
    warm.eval_every_steps = 0;
    // Its 16 steps may end inside the lr warm-up: the same schedule as the timed runs, not refused.
    warm.warmup_steps_origin = "the untimed warm-up run";
    // 16 full batches and, where the set does not split into whole batches, a last batch of the
    // timed run's remainder: every training batch shape meets cuDNN's algorithm search (and the
    // eager path the CUDA graph leaves partial batches to) here. head() keeps what there is when
    // a set is smaller.
    const int64_t batch = std::max<int64_t>(1, warm.batch_size);
    const int64_t remainder = warm.drop_last ? 0 : data.train.size() % batch;
    train::Datasets few{data.train.head(16 * batch + remainder), data.test.head(1000)};
    run_training(warm, few);
  }
  for (int i = 0; i < seeds; ++i) {
    train::TrainConfig config = workload;
    config.seed = workload.seed + static_cast<uint64_t>(i);
    config.stop_at_target = false;  // the fixed schedule's end is the second figure
    const train::TrainReport trained = run_training(config, data);
    TargetRun run;
    run.seed = config.seed;
    run.final_accuracy = trained.test.accuracy;
    run.train_s = trained.train_seconds;
    if (trained.target_reached) {
      run.reached = true;
      run.time_to_target_s = trained.target_reached->train_seconds;
      run.target_epoch = trained.target_reached->epoch;
      run.target_step = trained.target_reached->step;
      times.push_back(run.time_to_target_s);
    }
    finals.push_back(run.final_accuracy);
    trains.push_back(run.train_s);
    report.runs.push_back(run);
    if (observer) observer->on_run(run);
  }
  report.reached = static_cast<int>(times.size());
  if (!times.empty()) {
    report.median_time_s = median_of(times);
    report.min_time_s = *std::min_element(times.begin(), times.end());
    report.max_time_s = *std::max_element(times.begin(), times.end());
  }
  report.median_final_accuracy = median_of(finals);
  report.median_train_s = median_of(trains);
  return report;
}

}  // namespace spritetorch
