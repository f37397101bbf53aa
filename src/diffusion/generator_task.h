// The sprite generator as a training task (train/task.h): the DDPM loss (predict the noise added at
// a random timestep) with classifier-free guidance's class dropout, an exponential moving average
// of the weights after every optimizer step, the held-out denoising loss as its evaluation, and a
// sheet of samples every `sample_every` epochs. Everything else — device, precision, strategy, data
// path, resume, interrupts — is the Trainer's, as for classifiers.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "diffusion/generator.h"
#include "train/task.h"

namespace spritetorch::diffusion {

class GeneratorTask : public train::Task {
 public:
  // unet_base: UNet channels at full resolution (a positive multiple of 8). sample_every: epochs
  // between sample sheets for the observer (0: none). palette_seed: the k-means palette's seed.
  // activation_checkpointing: the UNet recomputes its blocks in backward (UNetImpl).
  GeneratorTask(int64_t unet_base, int64_t sample_every, uint64_t palette_seed,
                bool activation_checkpointing = false);

  std::string name() const override { return "generate"; }
  train::TaskTraits traits() const override;
  void build(const train::TaskSetup& setup) override;
  torch::nn::Module& module() override { return *net_; }
  void to_device(torch::Device device) override;
  train::StepLoss training_step(const data::Batch& batch) override;
  void after_optimizer_step() override;
  train::EvalReport evaluate(data::Loader& test, bool keep_predictions) override;
  void on_epoch_end(int64_t epoch, bool last, train::TrainObserver& observer) override;
  void save(train::Checkpoint& checkpoint) const override;
  void load(const train::Checkpoint& checkpoint, const std::string& source) override;
  train::Settings settings() const override;

 private:
  // Runs `fn` with the EMA weights in the net (what a checkpoint holds), then puts the training
  // weights back.
  template <class Fn>
  auto with_ema(Fn fn);

  int64_t sample_every_;
  uint64_t palette_seed_;
  bool activation_checkpointing_;
  UNetOptions options_;
  UNet net_{nullptr};
  NoiseSchedule schedule_;
  std::vector<torch::Tensor> ema_;  // one per parameter, registration order, on the device
  int64_t ema_updates_ = 0;         // for the EMA's warm-up (ema_decay)
  const data::Dataset* train_ = nullptr;
  int64_t size_ = 0;
  mutable std::optional<torch::Tensor> palette_;  // (K, 3) uint8, from the training set, once
};

}  // namespace spritetorch::diffusion
