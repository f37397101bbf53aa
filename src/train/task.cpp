#include "train/task.h"

#include "common/error.h"
#include "train/model_state.h"

namespace spritetorch::train {

Error not_for_task(const std::string& option, const std::string& task, const std::string& why) {
  return Error(option + " does not apply to --task " + task + ": " + why,
               "drop " + option.substr(0, option.find(' ')));
}

std::unique_ptr<TrainStep> Task::fast_step(const FastStepSetup& setup) {
  if (setup.kind == StepKind::kFused)
    throw Error("--step fused is a classifier's fused MLP step; task '" + name() + "' has none",
                "use --step auto");
  return nullptr;
}

void Task::load(const Checkpoint& checkpoint, const std::string& source) {
  load_model_state(module(), checkpoint.model, source);
}

}  // namespace spritetorch::train
