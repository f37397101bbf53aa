#include "train/task.h"

#include "common/error.h"
#include "train/model_state.h"

namespace spritetorch::train {

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
