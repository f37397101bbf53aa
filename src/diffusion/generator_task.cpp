#include "diffusion/generator_task.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/json_field.h"
#include "train/interrupt.h"
#include "train/model_state.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace spritetorch::diffusion {

namespace {

// A generator checkpoint holds the EMA weights as its model (what `generate` samples with) and, to
// go on training, the raw weights ("weights/<name>" beside the optimizer state).
constexpr const char* kRawPrefix = "weights/";

// --sample-every sheets: a row of 8 sprites per class, at most 64 sprites in all.
constexpr int64_t kSheetSprites = 64;
int64_t sheet_per_class(int64_t classes) {
  return std::max<int64_t>(1, std::min<int64_t>(8, kSheetSprites / std::max<int64_t>(classes, 1)));
}

// The classes a sheet shows, (n) int64, each `per_class` times in a row: every class, or with more
// classes than a sheet holds, 64 spread evenly over them (a sheet of 500 classes was 34,000
// pixels tall and took longer to sample than the epoch to train).
torch::Tensor sheet_labels(int64_t classes, int64_t per_class) {
  if (classes <= kSheetSprites)
    return torch::arange(classes, torch::kInt64).repeat_interleave(per_class);
  return torch::arange(kSheetSprites, torch::kInt64).mul(classes).div(kSheetSprites, "floor");
}

}  // namespace

int64_t default_batch(torch::Device device) {
  return device.is_cpu() ? kDefaultCpuBatch : kDefaultBatch;
}

int64_t default_steps(int64_t batch) {
  const int64_t b = std::max<int64_t>(1, batch);
  return (kDefaultSprites + b - 1) / b;
}

int64_t default_epochs(int64_t train_samples, int64_t batch) {
  return train::epochs_for_steps(default_steps(batch), train_samples, batch);
}

torch::Tensor min_snr_weight(const torch::Tensor& snr, Prediction prediction, double gamma) {
  if (gamma <= 0) return torch::ones_like(snr);
  const auto clipped = snr.clamp_max(gamma);
  switch (prediction) {
    case Prediction::kV:
      return clipped / (snr + 1.0);
    case Prediction::kX0:
      return clipped;
    case Prediction::kEps:
      break;
  }
  return clipped / snr;
}

GeneratorTask::GeneratorTask(int64_t unet_base, int64_t sample_every, uint64_t palette_seed,
                             bool activation_checkpointing, GeneratorDesign design)
    : sample_every_(sample_every),
      palette_seed_(palette_seed),
      activation_checkpointing_(activation_checkpointing),
      design_(design),
      schedule_(500, design.schedule) {
  if (unet_base < 8 || unet_base % 8 != 0)
    throw Error("--unet-base must be a positive multiple of 8, got " + std::to_string(unet_base));
  if (!(design.min_snr_gamma >= 0))
    throw Error("--min-snr-gamma must be >= 0 (0: off), got " +
                std::to_string(design.min_snr_gamma));
  options_.base = unet_base;
  options_.attention = design.attention;
  options_.attention_s2 = design.attention_s2;
  options_.scale_shift = design.scale_shift;
  options_.mult = design.unet_mult;
}

torch::Tensor GeneratorTask::denoising_loss(const torch::Tensor& x0, const torch::Tensor& t,
                                            const torch::Tensor& noise, const torch::Tensor& c,
                                            at::Reduction::Reduction reduction) {
  const auto predicted = net_->forward(schedule_.add_noise(x0, t, noise), t, c).to(torch::kFloat32);
  const auto target = design_.prediction == Prediction::kEps ? noise
                      : design_.prediction == Prediction::kV ? schedule_.velocity(x0, t, noise)
                                                             : x0;
  // Per-sample MSE (B), weighted; in fp32 under autocast.
  const auto per_sample = (predicted - target).pow(2).flatten(1).mean(1);
  const auto weighted =
      per_sample * min_snr_weight(schedule_.snr(t), design_.prediction, design_.min_snr_gamma);
  return reduction == at::Reduction::Sum ? weighted.sum() : weighted.mean();
}

void GeneratorTask::configure(const train::TrainConfig& options) {
  auto differs = [](const std::string& option) {
    throw Error("TrainConfig::" + option + " differs from this GeneratorTask's own",
                "set it in GeneratorTask's constructor, or build the task with make_task(config)");
  };
  if (options.unet_base != options_.base) differs("unet_base");
  if (options.sample_every != sample_every_) differs("sample_every");
  if (options.activation_checkpointing != activation_checkpointing_)
    differs("activation_checkpointing");
}

train::TaskTraits GeneratorTask::traits() const {
  train::TaskTraits traits;
  traits.has_accuracy = false;
  traits.cuda_graphs = false;
  traits.no_cuda_graphs =
      "its step draws timesteps, noise and class dropout and updates an EMA of the weights "
      "outside the optimizer";
  traits.drop_last = true;  // every step sees a full batch of timesteps
  traits.builtin_model = true;
  return traits;
}

void GeneratorTask::build(const train::TaskSetup& setup) {
  const data::Dataset& train = setup.train;
  if (train.inputs.dim() != 4 || train.inputs.size(1) != 4 || train.inputs.size(2) % 4 != 0)
    throw Error("--task generate needs RGBA sprite datasets (N, 4, S, S) with S divisible by 4; '" +
                    train.name + "' has samples of shape " + c10::str(train.inputs.sizes()),
                "use --dataset sprites, folder:PATH, sheet:FILE or npy:FILE");
  train_ = &train;
  size_ = train.inputs.size(2);
  partial_alpha_ = partial_alpha_share(train.inputs);
  options_.classes = train.num_classes();
  net_ = UNet(options_);
  net_->set_activation_checkpointing(activation_checkpointing_);
}

void GeneratorTask::to_device(torch::Device device) {
  schedule_.to(device);
  ema_.clear();
  for (const auto& p : net_->parameters()) ema_.push_back(p.detach().clone());
}

train::StepLoss GeneratorTask::training_step(const data::Batch& batch) {
  const auto x0 = batch.inputs * 2.0 - 1.0;  // (B, 4, S, S) in [-1, 1]
  const int64_t b = x0.size(0);
  const auto on_device = torch::TensorOptions().device(x0.device());
  const auto t = torch::randint(schedule_.steps(), {b}, on_device.dtype(torch::kInt64));
  const auto noise = torch::randn_like(x0);
  const auto drop = torch::rand({b}, on_device) < kClassDropout;  // classifier-free guidance
  const auto c = torch::where(drop, torch::full_like(batch.labels, options_.classes), batch.labels);
  return {denoising_loss(x0, t, noise, c, at::Reduction::Mean), {}};
}

// The EMA's decay warms up as (1 + k) / (10 + k) after k updates, up to kEmaDecay: with 0.995 from
// the first step the initial weights would still make up 0.995^k of it (19% after 336 steps).
double ema_decay(int64_t updates) {
  return std::min(kEmaDecay,
                  (1.0 + static_cast<double>(updates)) / (10.0 + static_cast<double>(updates)));
}

void GeneratorTask::after_optimizer_step() {
  torch::NoGradGuard no_grad;
  const double decay = ema_decay(ema_updates_++);
  const auto params = net_->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    ema_[i].mul_(decay).add_(params[i].detach(), 1.0 - decay);
}

template <class Fn>
auto GeneratorTask::with_ema(Fn fn) {
  const auto params = net_->parameters();
  std::vector<torch::Tensor> saved;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      saved.push_back(params[i].detach().clone());
      params[i].detach().copy_(ema_[i]);
    }
  }
  // The training weights and mode back however fn ends (a sampling stopped by an interrupt, a
  // device out of memory): the run's checkpoint must hold them, not the EMA's.
  struct PutBack {
    UNet& net;
    const std::vector<torch::Tensor>& params;
    const std::vector<torch::Tensor>& saved;
    bool was_training;
    ~PutBack() {
      net->train(was_training);
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(saved[i]);
    }
  } put_back{net_, params, saved, net_->is_training()};
  net_->eval();
  return fn();
}

// The denoising loss on the held-out sprites with the EMA weights, at timesteps and noise drawn
// from a CPU generator with a fixed seed: the same draws after every epoch, so the numbers compare,
// and the global RNG (the training's) untouched.
train::EvalReport GeneratorTask::evaluate(data::Loader& test, bool /*keep_predictions*/) {
  return with_ema([&] {
    train::EvalReport report;
    report.has_accuracy = false;
    c10::InferenceMode inference;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(palette_seed_ + 1);
    double loss_sum = 0;
    test.start_epoch(0);
    data::Batch batch;
    torch::Tensor sum;  // () float64 on the device: read once at the end
    while (test.next(batch)) {
      const auto x0 = batch.inputs * 2.0 - 1.0;  // (B, 4, S, S)
      const int64_t b = x0.size(0);
      const auto t = torch::randint(schedule_.steps(), {b}, gen, torch::kInt64).to(x0.device());
      const auto noise = at::randn(x0.sizes(), gen, torch::kFloat32).to(x0.device());
      const auto batch_sum =
          denoising_loss(x0, t, noise, batch.labels, at::Reduction::Sum).to(torch::kFloat64);
      sum = sum.defined() ? sum + batch_sum : batch_sum;
      report.samples += b;
    }
    if (sum.defined()) loss_sum = sum.item<double>();
    report.loss = report.samples ? loss_sum / static_cast<double>(report.samples) : 0.0;
    return report;
  });
}

// A sheet's worth of sprites from the EMA weights, sheet_per_class per class, the same starting
// noise every time so that sheets of successive epochs compare (sample() draws from its own CPU
// generator, not the global RNG).
void GeneratorTask::on_epoch_end(int64_t epoch, bool last, train::TrainObserver& observer) {
  if (sample_every_ <= 0 || !(last || (epoch + 1) % sample_every_ == 0)) return;
  const int64_t classes = options_.classes;
  const int64_t per_class = sheet_per_class(classes);
  auto sprites = with_ema([&] {
    torch::NoGradGuard no_grad;
    Generator generator;
    generator.net = net_;
    generator.schedule = schedule_;
    generator.prediction = design_.prediction;
    generator.size = size_;
    const auto labels = sheet_labels(classes, per_class);  // (at most 64)
    SampleOptions preview;
    preview.steps = kPreviewSteps;
    // A sheet takes ~40 s on 2 CPU cores: a SIGINT/SIGTERM meanwhile leaves it out, so that the
    // run's checkpoint comes within a step, not after the sheet (a container's grace period).
    preview.stop = [] { return train::interrupt_signal() != 0; };
    try {
      return finish_sprites(sample(generator, labels, preview), kSpriteColours, alpha());
    } catch (const SamplingStopped&) {
      return torch::Tensor();
    }
  });
  if (sprites.defined()) observer.on_samples(epoch + 1, sprites, per_class);
}

void GeneratorTask::save(train::Checkpoint& checkpoint) const {
  if (!palette_) palette_ = kmeans_palette(train_->inputs, kPaletteColours, palette_seed_);
  nlohmann::json palette_json = nlohmann::json::array();
  const auto rgb = palette_->accessor<uint8_t, 2>();
  for (int64_t k = 0; k < palette_->size(0); ++k)
    palette_json.push_back({int{rgb[k][0]}, int{rgb[k][1]}, int{rgb[k][2]}});
  checkpoint.meta["task"] = "generate";
  checkpoint.meta["model"] = "unet";
  checkpoint.meta.update(design_json(saved_design()));
  checkpoint.meta["schedule_steps"] = schedule_.steps();
  checkpoint.meta["min_snr_gamma"] = design_.min_snr_gamma;
  checkpoint.meta["size"] = size_;
  checkpoint.meta["palette"] = palette_json;
  checkpoint.meta["alpha"] = alpha_mode_name(alpha());
  // The raw weights go beside the optimizer state; the model is the EMA weights.
  for (const auto& [name, t] : checkpoint.model) checkpoint.optimizer[kRawPrefix + name] = t;
  size_t i = 0;
  for (const auto& p : net_->named_parameters())
    checkpoint.model[p.key()] = ema_[i++].detach().cpu();
}

void GeneratorTask::load(const train::Checkpoint& c, const std::string& source) {
  check_generator_checkpoint(c, source);
  // The design and the sprite size, as saved, against what this run builds.
  nlohmann::json now = design_json(saved_design());
  now["size"] = size_;
  nlohmann::json then;
  then = design_json(checkpoint_design(c.meta, source));
  then["size"] = json_field<int64_t>(c.meta, "size", 0, source, "size");
  if (then != now)
    throw Error(
        "--resume " + source + " holds a UNet for " + then.dump() + "; this run builds " +
            now.dump(),
        "resume with the same --unet-base, --unet-attention, --unet-scale-shift, --prediction, "
        "--noise-schedule, --size and dataset");
  std::map<std::string, torch::Tensor> raw;
  for (const auto& [name, t] : c.optimizer)
    if (name.rfind(kRawPrefix, 0) == 0) raw[name.substr(std::strlen(kRawPrefix))] = t;
  if (raw.empty())
    throw DataError(source, "a generator checkpoint with its training state (raw weights, Adam)",
                    "EMA weights only (written before generator runs could be resumed)");
  // The EMA weights go through the net (load_model_state checks every name and shape), then the
  // raw ones take their place there.
  train::load_model_state(*net_, c.model, source);
  {
    torch::NoGradGuard no_grad;
    const auto params = net_->parameters();
    for (size_t i = 0; i < params.size(); ++i) ema_[i].copy_(params[i]);
  }
  train::load_model_state(*net_, raw, source);
  ema_updates_ = c.meta.value("steps", int64_t{0});  // one EMA update per optimizer step
}

train::Settings GeneratorTask::settings() const {
  int64_t parameters = 0;
  for (const auto& p : net_->parameters()) parameters += p.numel();
  return {
      {"model", "unet base " + std::to_string(options_.base) + " x " +
                    unet_mult_text(options_.mult) + " (" + std::to_string(parameters) +
                    " parameters" +
                    (options_.attention_s2 ? ", attention at S/2 and S/4"
                     : options_.attention  ? ", attention"
                                           : "") +
                    (options_.scale_shift ? ", scale-shift norms" : "") +
                    (activation_checkpointing_ ? ", activation checkpointing" : "") + ")"},
      {"task", "generate (predicts " + prediction_name(design_.prediction) + ", min-SNR gamma " +
                   (design_.min_snr_gamma > 0 ? c10::str(design_.min_snr_gamma) : "off") +
                   ", classifier-free guidance p=" + std::to_string(kClassDropout).substr(0, 4) +
                   ", EMA " + std::to_string(kEmaDecay).substr(0, 5) + ")"},
      {"schedule",
       schedule_name(schedule_.kind()) + " betas, T = " + std::to_string(schedule_.steps())},
      {"alpha", alpha_mode_name(alpha()) + " (" + c10::str(std::round(partial_alpha_ * 1000) / 10) +
                    "% of the training set's visible pixels are partly transparent; soft from " +
                    c10::str(kSoftAlphaShare * 100) + "%)"},
  };
}

}  // namespace spritetorch::diffusion
