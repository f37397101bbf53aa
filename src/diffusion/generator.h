// The class-conditional sprite generator: a UNet denoiser trained with the DDPM loss and
// classifier-free guidance, sampled with DDPM (ancestral, T steps) or DDIM (deterministic, few
// steps), and turned into sprites: alpha binary or soft as the training set's art is, colours
// optionally snapped to a palette.
//
// Pixels: the model works on RGBA scaled to [-1, 1]; sprites in and out are (N, 4, S, S) uint8.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "diffusion/schedule.h"
#include "diffusion/unet.h"
#include "models/classifier.h"
#include "train/checkpoint.h"

namespace spritetorch::diffusion {

constexpr double kClassDropout = 0.1;  // share of training labels replaced by "no class"
constexpr double kEmaDecay = 0.995;    // the saved weights are an exponential moving average
// The EMA's decay after `updates` updates: (1 + k) / (10 + k), at most kEmaDecay (a warm-up, so
// that the initial weights leave the average within the first few hundred steps).
double ema_decay(int64_t updates);
constexpr int64_t kPaletteColours = 32;  // --palette auto: k-means colours of the training set

// Pixel art draws each sprite from a handful of colours (the DCSS items: 18 per sprite at 4 bits
// per channel); a generator's sprites come out with small colour noise on every pixel. Sprites out
// of generate and eval keep at most this many colours each (SampleOptions::colours).
constexpr int64_t kSpriteColours = 16;

// The sample sheets of a training run are previews: DDIM eta 1 at half generate's steps, so that
// ten sheets take ~5% of a default run instead of ~10%.
constexpr int64_t kPreviewSteps = 25;

// What the UNet's output stands for. eps: the noise (the DDPM paper; generators trained before v
// became the default); v: sqrt(abar) eps - sqrt(1 - abar) x0 (Salimans & Ho 2022), well defined
// at both ends of the schedule; x0: the clean image.
enum class Prediction { kEps, kV, kX0 };
std::string prediction_name(Prediction prediction);    // "eps" | "v" | "x0"
Prediction parse_prediction(const std::string& name);  // Error for anything else

// How the sampler's alpha channel becomes the sprites' alpha. binary: alpha >= 128 opaque, the
// rest transparent (pixel art's hard edges: the procedural sprites, sets drawn without soft
// pixels). soft: alpha as drawn, 8 bits, with the faint haze below kAlphaFloor cleared, for art
// with soft shadows, glows or antialiased edges (2 in 5 of the DCSS items have some; rendered
// game characters are mostly soft at their edges), which a binary cut would turn into hard black
// blobs or drop. RGB is 0 under transparent pixels either way.
enum class AlphaMode { kBinary, kSoft };
std::string alpha_mode_name(AlphaMode mode);          // "binary" | "soft"
AlphaMode parse_alpha_mode(const std::string& name);  // Error for anything else
// soft: alpha below this is cleared (1/16 of opaque: invisible on any background, and where a
// sampler's noise leaves a haze around the sprite).
constexpr int kAlphaFloor = 16;
// A training set calls for soft alpha when at least this share of its visible pixels (alpha > 0)
// is partly transparent: the DCSS items 12%, the procedural sprites 0.
constexpr double kSoftAlphaShare = 0.02;
// The share of visible pixels with 0 < alpha < 255. sprites: (N, 4, S, S) uint8; 0 if none visible.
double partial_alpha_share(const torch::Tensor& sprites);
AlphaMode alpha_mode_for(double partial_share);         // soft from kSoftAlphaShare on
AlphaMode alpha_mode_of(const torch::Tensor& sprites);  // alpha_mode_for(partial_alpha_share)
// Error "<who>: expected (N, 4, S, S) uint8 sprites, got ..." unless `sprites` is that.
void check_sprites(const torch::Tensor& sprites, const std::string& who);

// A trained generator, ready to sample on `device`.
struct Generator {
  UNet net{nullptr};
  NoiseSchedule schedule;
  Prediction prediction = Prediction::kEps;  // checkpoints without "prediction" predict eps
  std::vector<std::string> class_names;
  torch::Tensor palette;  // (K, 3) uint8 on the CPU: the training set's k-means colours
  AlphaMode alpha = AlphaMode::kBinary;  // the training set's (checkpoints without "alpha": binary)
  nlohmann::json meta;  // the checkpoint's metadata (dataset, sprites options, ...)
  int64_t size = 16;
};

// A generator checkpoint (meta task "generate"), not a classifier's: DataError naming `source`.
void check_generator_checkpoint(const train::Checkpoint& checkpoint, const std::string& source);

// The design a generator checkpoint's metadata records. Keys that older checkpoints lack take the
// values those checkpoints were trained with: no attention, additive embeddings (no scale-shift
// norms), widths 1,2,2, linear betas, eps. load_generator builds from it and a resumed run compares
// against it, so the two cannot read an old checkpoint differently.
struct CheckpointDesign {
  UNetOptions unet;
  ScheduleKind schedule = ScheduleKind::kLinear;
  Prediction prediction = Prediction::kEps;
};
// The most channels per unit of --unet-mult (--unet-base), the most classes and diffusion steps a
// generator may have: far past any sprite model (base 32, T = 500), short of what would exhaust
// memory. A checkpoint's metadata is held to them too.
constexpr int64_t kMaxUNetBase = 512;
constexpr int64_t kMaxGeneratorClasses = 100000;
constexpr int64_t kMaxScheduleSteps = 100000;

// The UNet's design, schedule and prediction from a generator checkpoint's metadata; a missing,
// mistyped or out-of-range field is a DataError naming `source` and the field.
CheckpointDesign checkpoint_design(const nlohmann::json& meta,
                                   const std::string& source = "generator metadata");
// The metadata a design is saved as ("unet", "schedule", "prediction"), the keys
// checkpoint_design reads: GeneratorTask::save writes it and a resumed run compares it.
nlohmann::json design_json(const CheckpointDesign& design);

Generator load_generator(const std::string& path, torch::Device device);

// Where DDIM and DPM-Solver evaluate the net: `uniform` in t, or `quadratic`, t = (T - 1) u^2 for
// evenly spaced u (the DDIM paper's choice for CIFAR-10), which puts more of the steps at low
// noise, where a sprite's edges and flat colours are decided.
enum class TimestepSpacing { kUniform, kQuadratic };
std::string spacing_name(TimestepSpacing spacing);       // "uniform" | "quadratic"
TimestepSpacing parse_spacing(const std::string& name);  // Error for anything else

// Where classifier-free guidance applies, as fractions of the schedule: steps with t / (T - 1) in
// [from, to] take the guided output; the others the conditional output alone (w = 1, one pass of
// the net instead of two). High noise decides a sprite's layout and class; low noise its edges
// and texture, where guidance adds colour noise and stray pixels; at the noisiest steps it costs
// variety (Kynkaanniemi et al. 2024 limit guidance to a middle interval for these reasons).
struct GuidanceInterval {
  double from = 0.0, to = 1.0;
  bool covers(int64_t t, int64_t schedule_steps) const;
  bool whole() const { return from <= 0.0 && to >= 1.0; }
};
// "A:B" with 0 <= A < B <= 1 -> the interval; Error naming the text otherwise.
GuidanceInterval parse_guidance_interval(const std::string& text);
std::string guidance_interval_text(const GuidanceInterval& interval);  // "0.4:1"

// The largest --guidance sampling takes: ten times the usual range's top.
constexpr double kMaxGuidance = 100.0;

struct SampleOptions {
  std::string sampler = "ddim";  // ddim | dpm++2m | ddpm
  // DDIM / DPM-Solver steps (DDPM always takes the schedule's T). 50: with eta 1, the DCSS items'
  // two-sample accuracy 0.77 / 0.79 against 0.80 at 25 steps, at twice the sampling time.
  int64_t steps = 50;
  TimestepSpacing spacing = TimestepSpacing::kUniform;  // of those steps
  // Classifier-free guidance scale w: eps_u + w (eps_c - eps_u), on the steps with t / (T - 1) in
  // guidance_interval. 4 on 0.3-0.9, the middle of the schedule: on the four-view characters class
  // agreement 0.902 / 0.922 (sampling seeds 1 / 2) against 0.854 / 0.875 for 2.5 on the noisier
  // 60%, two-sample accuracy 0.714 against 0.598, fewer stray pixels than 3.5 there (1.67 against
  // 1.90), and the same 60% of the steps guided (docs/sprites.md).
  double guidance = 4.0;
  GuidanceInterval guidance_interval{0.3, 0.9};
  // DDIM's noise: 0 deterministic, 1 DDPM-like (the other samplers do not use it). 1 by default:
  // on the DCSS items it gives the class agreement 0.59 against 0.45 for 0 and a two-sample
  // accuracy of 0.80 against 0.83-0.84, with fewer stray pixels (docs/sprites.md).
  double eta = 1.0;
  uint64_t seed = 1;
  int64_t batch = 512;  // sprites per forward pass
  // The UNet's passes in "fp32" or "bf16" (CUDA: bf16_copy, weights and activations in bf16; the
  // CPU: bf16 autocast, GroupNorm in fp32), or "auto" (resolve_sampling_precision). Its output,
  // guidance and the updates stay fp32.
  std::string precision = "fp32";
  bool cuda_graphs = true;  // CUDA, DDIM eta 0: replay batches as one graph (cuda_graph_sampler.h)
  // The passes on a copy of the UNet with channels_last convolution weights and channels_last
  // noise, so the activations stay NHWC from the first convolution on (cuDNN's tensor-core
  // convolutions take NHWC as it is; with NCHW they transpose in and out). Off: NCHW, the layout
  // LibTorch's CUDA GroupNorm takes (it converts channels_last back, docs/sprites.md).
  bool channels_last = false;
  // Sprites out (generate, eval): each sprite's opaque colours reduced to at most this many by
  // k-means (reduce_colours; 0: the model's own colours). Not applied by sample().
  int64_t colours = kSpriteColours;
  // Sprites out (generate, eval): their alpha; unset: the generator's own (Generator::alpha).
  std::optional<AlphaMode> alpha;
  // Asked before each UNet pass (before each batch where the passes replay as a CUDA graph): true
  // stops sample() with SamplingStopped (a training run's sample sheet when a SIGTERM comes).
  std::function<bool()> stop;
};

// What sample() throws when SampleOptions::stop said to stop.
struct SamplingStopped : std::exception {
  const char* what() const noexcept override { return "sampling stopped"; }
};

// The sampler as it runs, for generate's and eval's summaries: DDPM reports the schedule's T
// (`schedule_steps`) and no spacing; eta only for DDIM. JSON keys: sampler, steps, spacing, eta,
// guidance (null where they do not apply); text e.g. "ddim 50 uniform steps, eta 1, guidance 2".
nlohmann::json sampler_json(const SampleOptions& options, int64_t schedule_steps);
std::string describe_sampler(const SampleOptions& options, int64_t schedule_steps);

// labels: (N) int64 class indices -> (N, 4, S, S) float32 in [-1, 1] on the generator's device.
// The starting noise (and DDPM's per-step noise) comes from a CPU generator seeded with
// options.seed, so a seed gives the same sprites on every device up to float rounding.
torch::Tensor sample(Generator& generator, const torch::Tensor& labels,
                     const SampleOptions& options);
// The same sprites, each batch handed to `finish` as it comes out ((b, 4, S, S) float32 on the
// device) and what it returns concatenated: a large --count keeps its sprites as `finish` makes
// them (uint8 from finish_sprites: 1 KB a 16x16 sprite, where the float batches and their
// quantising took ~22 KB; 40,000 sprites peaked at 1.2 GB).
torch::Tensor sample(Generator& generator, const torch::Tensor& labels,
                     const SampleOptions& options,
                     const std::function<torch::Tensor(const torch::Tensor&)>& finish);

// "auto" -> "bf16" on a CPU whose native bf16 pays (DeviceInfo::bf16_auto: AMD's avx512_bf16), else
// "fp32"; "fp32" and "bf16" as they are, except "bf16" on a device other than CUDA and the CPU
// (MPS), which is an Error, as is any other text. On the DCSS items (Zen 4, one thread) bf16
// autocast sampled 1.9-2.0x faster with the same class agreement and two-sample accuracy within
// their noise (docs/sprites.md); on an Intel Xeon with AVX512-BF16 it sampled 0.73-0.82x as fast
// as fp32 (docs/precision.md); on CUDA the bf16 copy gained 10-15% on an H200, so auto stays fp32
// there.
std::string resolve_sampling_precision(const std::string& requested, const torch::Device& device);

// A copy of `net` held wholly in bf16, on its device, in eval mode: what sample() runs for
// precision "bf16" on CUDA. Its forward takes fp32 x and returns bf16.
UNet bf16_copy(const UNetImpl& net);
// A copy of `net` in `dtype`, on its device, in eval mode, its 4-D (convolution) weights
// channels_last when `channels_last`: what sample() runs for SampleOptions::channels_last. A
// parameter already in that dtype and layout is shared with `net`, not copied (sampling reads it).
UNet sampling_copy(const UNetImpl& net, torch::ScalarType dtype, bool channels_last);

// DDIM (Song et al. 2021, eq. 12) from x_T along ddim_timesteps(T, steps), then to abar = 1.
// x: (B, 4, S, S), c: (B). Each step clips the predicted x0 to [-1, 1] and re-derives eps from it.
// eta > 0 adds sigma_t(eta) noise drawn from `gen` (eta = 1 is DDPM-like; Error without a gen);
// eta = 0 is deterministic and draws nothing. `prediction`: what the net outputs.
torch::Tensor ddim_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, int64_t steps, double guidance, double eta = 0.0,
                          std::optional<at::Generator> gen = std::nullopt,
                          Prediction prediction = Prediction::kEps,
                          TimestepSpacing spacing = TimestepSpacing::kUniform,
                          GuidanceInterval interval = {});
// DPM-Solver++(2M) (Lu et al. 2022, alg. 2): the same ODE as DDIM with eta 0, solved to second
// order: from the second step on, the update extrapolates the clipped x0_hat of this step and the
// last (in log-SNR time), where DDIM uses this step's alone; the first step and the last (to
// abar = 1) are DDIM's. Same timesteps and clipping as ddim_sample; deterministic, draws nothing.
torch::Tensor dpm_solver_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                                const torch::Tensor& c, int64_t steps, double guidance,
                                Prediction prediction = Prediction::kEps,
                                TimestepSpacing spacing = TimestepSpacing::kUniform,
                                GuidanceInterval interval = {});
// DDPM ancestral sampling over all T steps (Ho et al. 2020): the posterior q(x_{t-1} | x_t, x0)
// at the clipped predicted x0, variance beta~_t; noise drawn from `gen` (CPU).
torch::Tensor ddpm_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, double guidance, at::Generator gen,
                          Prediction prediction = Prediction::kEps, GuidanceInterval interval = {});

// The samplers above on any model (x_t (B, 4, S, S), t (B) int64 -> its prediction (B, 4, S, S) of
// kind `prediction`): ddim_sample / ddpm_sample pass the guided UNet; tests pass an oracle.
using EpsModel = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& t)>;
torch::Tensor ddim_sample_eps(const EpsModel& model, const NoiseSchedule& schedule, torch::Tensor x,
                              int64_t steps, double eta = 0.0,
                              std::optional<at::Generator> gen = std::nullopt,
                              Prediction prediction = Prediction::kEps,
                              TimestepSpacing spacing = TimestepSpacing::kUniform);
torch::Tensor dpm_solver_sample_eps(const EpsModel& model, const NoiseSchedule& schedule,
                                    torch::Tensor x, int64_t steps,
                                    Prediction prediction = Prediction::kEps,
                                    TimestepSpacing spacing = TimestepSpacing::kUniform);
torch::Tensor ddpm_sample_eps(const EpsModel& model, const NoiseSchedule& schedule, torch::Tensor x,
                              at::Generator gen, Prediction prediction = Prediction::kEps);
// The samplers' timesteps: `steps` (clamped to [1, T]) distinct ones from T - 1 down to 0, spaced
// as `spacing` says.
std::vector<int64_t> ddim_timesteps(int64_t T, int64_t steps,
                                    TimestepSpacing spacing = TimestepSpacing::kUniform);

// [-1, 1] float -> uint8 RGBA, alpha as `alpha` says (binary: 0 or 255; soft: 0 or
// kAlphaFloor..255) and RGB 0 under transparent pixels, on the CPU (worked out on x's device,
// then copied).
torch::Tensor to_sprites(const torch::Tensor& x, AlphaMode alpha = AlphaMode::kBinary);
// What generate and eval make of the sampler's output: to_sprites, then reduce_colours, both on
// x's device, then the uint8 sprites to the CPU.
torch::Tensor finish_sprites(const torch::Tensor& x, int64_t colours,
                             AlphaMode alpha = AlphaMode::kBinary);
// Replaces every opaque pixel's RGB by the nearest palette colour. sprites: (N, 4, S, S) uint8;
// palette: (K, 3) uint8.
torch::Tensor snap_to_palette(const torch::Tensor& sprites, const torch::Tensor& palette);
// Each sprite's opaque colours reduced to at most `colours` by k-means over its own opaque pixels
// (farthest-point start from its first opaque pixel, 10 Lloyd iterations; deterministic, no RNG):
// flat regions lose the model's small colour noise, outlines and highlights keep their own
// cluster. sprites: (N, 4, S, S) uint8 as to_sprites gives them, on any device (the result is on
// the same one); alpha is left as it is. colours <= 0: unchanged.
torch::Tensor reduce_colours(const torch::Tensor& sprites, int64_t colours);
// The two forms reduce_colours picks from by device, equal byte for byte (tested): a loop over
// each sprite's opaque pixels, parallel over sprites (the CPU: 512 32x32 sprites in 0.14 s on
// one Zen 4 core, against 1.2 s for the tensor form there), and tensor operations over chunks of
// whole sprites (any other device: no per-sprite launches or host syncs).
torch::Tensor reduce_colours_loop(const torch::Tensor& sprites, int64_t colours);
torch::Tensor reduce_colours_batched(const torch::Tensor& sprites, int64_t colours);
// k-means (k-means++ start, seeded) over the opaque pixels of (N, 4, H, W) uint8 sprites -> (K, 3).
torch::Tensor kmeans_palette(const torch::Tensor& sprites, int64_t colours, uint64_t seed);
// The distinct colours of a PNG's opaque pixels (a palette strip, or any image) -> (K, 3) uint8.
torch::Tensor palette_from_png(const std::string& path);

// How often `classifier` assigns each of `sprites` (N, 4, S, S) uint8 to its label (N) int64:
// the mean and, per class 0..classes-1, the share (NaN for a class with no sprites). Run on
// generated sprites it is the class agreement; on held-out real ones, the ceiling that the
// classifier itself sets on it.
struct Agreement {
  double mean = 0;
  std::vector<double> per_class;
};
Agreement classifier_agreement(models::ClassifierImpl& classifier, const torch::Tensor& sprites,
                               const torch::Tensor& labels, int64_t classes);

// One pass of a classifier (&ClassifierImpl::forward or ::features) over stored sprites (N, 4, S,
// S) uint8, N >= 1, in eval and inference mode, in slices of 1,000 on the classifier's device (a
// whole real set may be large): (N, ...) on the CPU.
using ClassifierPass = torch::Tensor (models::ClassifierImpl::*)(torch::Tensor);
torch::Tensor classifier_pass(models::ClassifierImpl& classifier, const torch::Tensor& sprites,
                              ClassifierPass pass);

struct GeneratorEval {
  int64_t samples = 0;
  Agreement agreement;      // with the requested class: the class agreement
  double distinct = 0;      // share of distinct sprites among the samples
  double exact_copies = 0;  // share identical to a training sprite
  double sample_seconds = 0;
  double sprites_per_second = 0;
  torch::Tensor sprites;  // the samples judged: (N, 4, S, S) uint8 on the CPU
  torch::Tensor labels;   // (N) int64: the class each was drawn for
};

// `count` samples spread evenly over the classes, judged by `classifier` (trained on real data,
// same class order) and compared with `training` sprites (N, 4, S, S) uint8.
GeneratorEval evaluate_generator(Generator& generator, models::ClassifierImpl& classifier,
                                 const torch::Tensor& training, int64_t count,
                                 const SampleOptions& options);

}  // namespace spritetorch::diffusion
