#include "train/task.h"

#include "common/error.h"
#include "train/config.h"
#include "train/model_state.h"

namespace spritetorch::train {

Error not_for_task(const std::string& option, const std::string& task, const std::string& why) {
  return Error(option + " does not apply to --task " + task + ": " + why,
               "drop " + option.substr(0, option.find(' ')));
}

void Task::configure(const TrainConfig& options) {
  const TrainConfig defaults;
  auto refuse = [&](const std::string& option, const std::string& whose) {
    throw Error(option + " is " + whose + "; task '" + name() + "' does not read it",
                "leave it at its default, or override Task::configure to take it");
  };
  if (!options.model.empty()) refuse("model '" + options.model + "'", "a built-in model's name");
  if (options.label_smoothing != defaults.label_smoothing)
    refuse("label_smoothing", "the built-in classifier's loss");
  if (options.test_time_augment != defaults.test_time_augment)
    refuse("test_time_augment", "the built-in classifier's evaluation");
  if (options.first_conv != defaults.first_conv) refuse("first_conv", "the built-in CNNs'");
  if (options.activation_checkpointing)
    refuse("activation_checkpointing", "the built-in models' (models::checkpointed is yours)");
  if (options.sample_every != defaults.sample_every || options.unet_base != defaults.unet_base ||
      options.unet_attention != defaults.unet_attention ||
      options.unet_scale_shift != defaults.unet_scale_shift ||
      options.unet_mult != defaults.unet_mult || options.prediction != defaults.prediction ||
      options.noise_schedule != defaults.noise_schedule ||
      options.min_snr_gamma != defaults.min_snr_gamma)
    refuse("a generator option (sample_every, unet_*, prediction, noise_schedule, min_snr_gamma)",
           "the built-in generator's");
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
