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

// How the generator is built and trained beyond its width: the defaults are what
// docs/sprites.md measured on real sprite sets; old checkpoints load as eps / linear / no
// attention (load_generator).
struct GeneratorDesign {
  Prediction prediction = Prediction::kV;
  ScheduleKind schedule = ScheduleKind::kCosine;
  bool attention = true;      // self-attention at S/4
  bool attention_s2 = false;  // self-attention at S/2 as well (--unet-attention 2)
  bool scale_shift = true;    // the embedding scales and shifts the blocks' second norm
  std::array<int64_t, 3> unet_mult = {1, 2, 2};  // channels at S, S/2, S/4 = base x these
  double min_snr_gamma =
      5.0;  // loss weight min(SNR, gamma) / (what the target's MSE weighs); 0 off
};

// Without --batch-size a generator trains on batches of default_batch(device) sprites: 16 on the
// CPU, 64 elsewhere. A CPU step costs time in proportion to its sprites (0.114 s for 16, 0.225 s
// for 32 on a 2-vCPU EPYC), so within a time budget 16 buys twice the optimizer steps: on three
// runs over two real sets, the same class agreement as 32 and a lower held-out loss, two-sample
// accuracy and Fréchet distance (docs/sprites.md "Batch size on the CPU"). A GPU's step at these
// sizes is bound by launches, not sprites, so there a smaller batch would only cut the work done.
constexpr int64_t kDefaultCpuBatch = 16;
constexpr int64_t kDefaultBatch = 64;
int64_t default_batch(torch::Device device);

// Without --epochs a generator run draws about kDefaultSprites training sprites, in
// default_steps(batch) = ceil(kDefaultSprites / batch) optimizer steps (4,500 of 64, 18,000 of 16):
// default_epochs = ceil(default_steps / max(1, train_samples / batch)), at least 1, or fewer
// when they do not fit in kDefaultTimeBudgetSeconds of training (--time-budget, planned from the
// run's own speed). On the DCSS items 4,522 steps beat 3,010 on both quality numbers; 15 minutes
// of training leave room for the sample sheets and start-up inside the 20 minutes a default run
// may take on a 2-core CPU (docs/sprites.md).
constexpr int64_t kDefaultSprites = 4500 * 64;
constexpr double kDefaultTimeBudgetSeconds = 15 * 60;
int64_t default_steps(int64_t batch);
int64_t default_epochs(int64_t train_samples, int64_t batch);

// The per-sample weight of the MSE on `prediction`'s target that makes the loss
// min(SNR, gamma) x (the MSE of x0) (Hang et al. 2023): eps min(snr, g) / snr, v min(snr, g) /
// (snr + 1), x0 min(snr, g). gamma <= 0: 1. snr: (B) float32 -> (B).
torch::Tensor min_snr_weight(const torch::Tensor& snr, Prediction prediction, double gamma);

class GeneratorTask : public train::Task {
 public:
  // unet_base: UNet channels at full resolution (a positive multiple of 8). sample_every: epochs
  // between sample sheets for the observer (0: none). palette_seed: the k-means palette's seed.
  // activation_checkpointing: the UNet recomputes its blocks in backward (UNetImpl).
  GeneratorTask(int64_t unet_base, int64_t sample_every, uint64_t palette_seed,
                bool activation_checkpointing = false, GeneratorDesign design = {});

  std::string name() const override { return "generate"; }
  train::TaskTraits traits() const override;
  // Its design comes through the constructor (tasks/make_task.cpp builds it from the options and
  // refuses the classifier's): a TrainConfig whose generator options differ from it is refused,
  // not ignored.
  void configure(const train::TrainConfig& options) override;
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
  // The weighted loss of predicting x0 at t from x_t = add_noise(x0, t, noise) with class c.
  torch::Tensor denoising_loss(const torch::Tensor& x0, const torch::Tensor& t,
                               const torch::Tensor& noise, const torch::Tensor& c,
                               at::Reduction::Reduction reduction);

  int64_t sample_every_;
  uint64_t palette_seed_;
  bool activation_checkpointing_;
  GeneratorDesign design_;
  UNetOptions options_;
  UNet net_{nullptr};
  NoiseSchedule schedule_;
  std::vector<torch::Tensor> ema_;  // one per parameter, registration order, on the device
  int64_t ema_updates_ = 0;         // for the EMA's warm-up (ema_decay)
  const data::Dataset* train_ = nullptr;
  int64_t size_ = 0;
  mutable std::optional<torch::Tensor> palette_;  // (K, 3) uint8, from the training set, once
  double partial_alpha_ = 0;                      // partial_alpha_share of the training set
  AlphaMode alpha() const { return alpha_mode_for(partial_alpha_); }  // the training set's
  // What this run's checkpoints record of its design (checkpoint_design reads it back).
  CheckpointDesign saved_design() const { return {options_, schedule_.kind(), design_.prediction}; }
};

}  // namespace spritetorch::diffusion
