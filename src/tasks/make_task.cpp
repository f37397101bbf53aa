#include "tasks/make_task.h"

#include "common/error.h"
#include "device/device.h"
#include "diffusion/generator_task.h"
#include "train/classifier_task.h"

namespace spritetorch {

using train::not_for_task;

std::unique_ptr<train::Task> make_task(const train::TrainConfig& config) {
  if (config.task == train::TaskKind::kClassify) {
    auto task = train::ClassifierTask::builtin(config.model, train::default_model(config));
    task->configure(config);  // its options, and the generator's refused, before the data is read
    return task;
  }
  if (config.task == train::TaskKind::kGenerate) {
    if (!config.model.empty() && config.model != "unet")
      throw not_for_task("--model " + config.model, "generate",
                         "the generator is a UNet, sized by --unet-base");
    if (config.step == train::StepKind::kFused)
      throw not_for_task("--step fused", "generate", "the fused step is for ReLU MLP classifiers");
    if (config.label_smoothing > 0)
      throw not_for_task("--label-smoothing", "generate", "the generator has no labels to smooth");
    if (config.test_time_augment != "none")
      throw not_for_task("--test-time-augment " + config.test_time_augment, "generate",
                         "it averages a classifier's predictions");
    if (config.first_conv != "learned")
      throw not_for_task("--first-conv " + config.first_conv, "generate",
                         "it fixes a classifier's first convolution");
    if (config.step_threads > 0)
      throw not_for_task("--step-threads", "generate",
                         "it splits the fused MLP step; the UNet's convolutions use --threads");
    diffusion::GeneratorDesign design;
    design.prediction = diffusion::parse_prediction(config.prediction);
    design.schedule = diffusion::parse_schedule(config.noise_schedule);
    if (config.unet_attention < 0 || config.unet_attention > 2)
      throw Error("--unet-attention " + std::to_string(config.unet_attention) +
                  ": expected 0 (none), 1 (at S/4) or 2 (at S/4 and S/2)");
    design.attention = config.unet_attention >= 1;
    design.attention_s2 = config.unet_attention >= 2;
    design.scale_shift = config.unet_scale_shift;
    design.unet_mult = diffusion::parse_unet_mult(config.unet_mult);
    design.min_snr_gamma = config.min_snr_gamma;
    return std::make_unique<diffusion::GeneratorTask>(config.unet_base, config.sample_every,
                                                      config.seed, config.activation_checkpointing,
                                                      design);
  }
  throw Error("unknown task");  // unreachable: TaskKind has two values
}

train::TrainReport run_training(const train::TrainConfig& config, train::TrainObserver* observer) {
  auto task = make_task(config);       // a bad option fails before the data is read
  device::pick_device(config.device);  // and so does an unavailable device
  const train::Datasets data = train::load_datasets(config);
  return train::Trainer(config).fit(*task, data, observer);
}

train::TrainReport run_training(const train::TrainConfig& config, const train::Datasets& data,
                                train::TrainObserver* observer) {
  auto task = make_task(config);
  return train::Trainer(config).fit(*task, data, observer);
}

}  // namespace spritetorch
