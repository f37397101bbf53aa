#include "diffusion/generator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <unordered_set>
#include <utility>

#include "common/error.h"
#include "common/json_field.h"
#include "common/timer.h"
#include "device/device.h"
#include "diffusion/cuda_graph_sampler.h"
#include "io/png.h"
#include "precision/autocast_guard.h"
#include "train/checkpoint.h"
#include "train/model_state.h"

namespace spritetorch::diffusion {

namespace {

// The net's output with classifier-free guidance: one forward pass over [conditional;
// unconditional]. Linear in the output, so it means the same for eps, v and x0 predictions.
torch::Tensor guided_eps(UNet& net, const torch::Tensor& x, const torch::Tensor& t,
                         const torch::Tensor& c, double guidance) {
  // The output in fp32 whatever the net's dtype: guidance and the update stay fp32.
  if (guidance == 1.0) return net->forward(x, t, c).to(torch::kFloat32);
  const auto null_c = torch::full_like(c, net->options().classes);
  auto eps = net->forward(torch::cat({x, x}), torch::cat({t, t}), torch::cat({c, null_c}))
                 .to(torch::kFloat32);
  auto parts = eps.chunk(2);
  return parts[1] + guidance * (parts[0] - parts[1]);
}

// (P, 3) uint8 from [[r, g, b], ...]; anything else is a DataError naming `source`.
torch::Tensor palette_tensor(const nlohmann::json& j, const std::string& source) {
  if (!j.is_array())
    throw DataError(source, "generator metadata 'palette' as a list of colours",
                    std::string("a JSON ") + j.type_name());
  std::vector<uint8_t> flat;
  for (const auto& rgb : j) {
    const bool triple =
        rgb.is_array() && rgb.size() == 3 &&
        std::all_of(rgb.begin(), rgb.end(), [](const nlohmann::json& v) {
          return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 255;
        });
    if (!triple) {
      std::string found = rgb.dump();
      if (found.size() > 60) found = found.substr(0, 57) + "...";
      throw DataError(source, "generator metadata 'palette' of [r, g, b] colours from 0 to 255",
                      found);
    }
    for (const auto& v : rgb) flat.push_back(static_cast<uint8_t>(v.get<int64_t>()));
  }
  return torch::tensor(flat, torch::kUInt8).view({-1, 3}).clone();
}

}  // namespace

std::string prediction_name(Prediction p) {
  return p == Prediction::kV ? "v" : p == Prediction::kX0 ? "x0" : "eps";
}

Prediction parse_prediction(const std::string& name) {
  if (name == "eps") return Prediction::kEps;
  if (name == "v") return Prediction::kV;
  if (name == "x0") return Prediction::kX0;
  throw Error("unknown prediction '" + name + "': expected eps, v or x0");
}

std::string alpha_mode_name(AlphaMode mode) { return mode == AlphaMode::kSoft ? "soft" : "binary"; }

AlphaMode parse_alpha_mode(const std::string& name) {
  if (name == "binary") return AlphaMode::kBinary;
  if (name == "soft") return AlphaMode::kSoft;
  throw Error("unknown alpha mode '" + name + "': expected binary or soft");
}

void check_sprites(const torch::Tensor& sprites, const std::string& who) {
  if (sprites.dim() != 4 || sprites.size(1) != 4 || sprites.scalar_type() != torch::kUInt8)
    throw Error(who + ": expected (N, 4, S, S) uint8 sprites, got " + c10::str(sprites.sizes()) +
                " " + std::string(c10::toString(sprites.scalar_type())));
}

double partial_alpha_share(const torch::Tensor& sprites) {
  check_sprites(sprites, "partial_alpha_share");
  const auto alpha = sprites.select(1, 3);  // (N, S, S)
  const double visible = (alpha > 0).sum().item<double>();
  return visible > 0 ? (alpha < 255).logical_and(alpha > 0).sum().item<double>() / visible : 0.0;
}

AlphaMode alpha_mode_for(double partial_share) {
  return partial_share >= kSoftAlphaShare ? AlphaMode::kSoft : AlphaMode::kBinary;
}

AlphaMode alpha_mode_of(const torch::Tensor& sprites) {
  return alpha_mode_for(partial_alpha_share(sprites));
}

void check_generator_checkpoint(const train::Checkpoint& c, const std::string& source) {
  const auto task = json_field(c.meta, "task", std::string(), source, "task");
  if (task == "generate") return;
  const std::string own = train::own_module_description(c, source);
  throw DataError(source, "a generator checkpoint (train --task generate)",
                  !own.empty()
                      ? own + ", from a program of its own (the library's Trainer)"
                      : "a '" + json_field(c.meta, "model", std::string("?"), source, "model") +
                            "' classifier checkpoint");
}

namespace {

// A required integer of a generator's metadata, within [lo, hi]: a damaged or hand-edited file must
// not build an absurd model (a UNet of 10^5 channels, a schedule of 10^9 steps) or reach LibTorch
// with a negative size.
int64_t design_int(const nlohmann::json& object, const std::string& key, int64_t lo, int64_t hi,
                   const std::string& source, const std::string& field) {
  required_field(object, key, source, "generator metadata '" + field + "'");
  const auto value = json_field<int64_t>(object, key, 0, source, field);
  if (value < lo || value > hi)
    throw DataError(source,
                    "generator metadata '" + field + "' from " + std::to_string(lo) + " to " +
                        std::to_string(hi),
                    std::to_string(value));
  return value;
}

// A named choice in the metadata (schedule, prediction, alpha), read by `parse`: a name it does not
// know is a DataError naming the checkpoint, not parse's bare "unknown ...".
template <typename Parse>
auto meta_choice(const nlohmann::json& meta, const char* key, const char* fallback,
                 const std::string& source, const char* names, Parse parse) {
  const std::string text = json_field(meta, key, std::string(fallback), source, key);
  try {
    return parse(text);
  } catch (const Error&) {
    throw DataError(source, std::string("generator metadata '") + key + "' of " + names,
                    "'" + text + "'");
  }
}

}  // namespace

CheckpointDesign checkpoint_design(const nlohmann::json& meta, const std::string& source) {
  CheckpointDesign d;
  // A copy: GCC 13's -Wdangling-reference takes a reference for one into the temporary message.
  const nlohmann::json u = required_field(meta, "unet", source, "generator metadata 'unet'");
  d.unet.channels = design_int(u, "channels", 1, 4, source, "unet.channels");
  d.unet.base = design_int(u, "base", 1, kMaxUNetBase, source, "unet.base");
  d.unet.classes = design_int(u, "classes", 1, kMaxGeneratorClasses, source, "unet.classes");
  d.unet.embed = design_int(u, "embed", 1, 16 * kMaxUNetBase, source, "unet.embed");
  // Absent before attention, S/2 attention and scale-shift norms existed.
  d.unet.attention = json_field(u, "attention", false, source, "unet.attention");
  d.unet.attention_s2 = json_field(u, "attention_s2", false, source, "unet.attention_s2");
  d.unet.scale_shift = json_field(u, "scale_shift", false, source, "unet.scale_shift");
  if (u.contains("mult")) {  // absent before --unet-mult existed: 1,2,2
    const auto mult = json_field(u, "mult", std::vector<int64_t>{}, source, "unet.mult");
    if (mult.size() != 3)
      throw DataError(source, "generator metadata 'unet.mult' of 3 multipliers",
                      std::to_string(mult.size()));
    std::copy(mult.begin(), mult.end(), d.unet.mult.begin());
  }
  const auto [lo, hi] = std::minmax_element(d.unet.mult.begin(), d.unet.mult.end());
  if (*lo < 1 || *hi > 16)
    throw DataError(source, "generator metadata 'unet.mult' from 1 to 16 (a damaged checkpoint?)",
                    unet_mult_text(d.unet.mult));
  // Checkpoints from before the cosine / v defaults have neither key.
  d.schedule = meta_choice(meta, "schedule", "linear", source, "linear or cosine", parse_schedule);
  d.prediction = meta_choice(meta, "prediction", "eps", source, "eps, v or x0", parse_prediction);
  return d;
}

nlohmann::json design_json(const CheckpointDesign& design) {
  const UNetOptions& u = design.unet;
  return {{"unet",
           {{"channels", u.channels},
            {"base", u.base},
            {"classes", u.classes},
            {"embed", u.embed},
            {"attention", u.attention},
            {"attention_s2", u.attention_s2},
            {"scale_shift", u.scale_shift},
            {"mult", u.mult}}},
          {"schedule", schedule_name(design.schedule)},
          {"prediction", prediction_name(design.prediction)}};
}

Generator load_generator(const std::string& path, torch::Device device) {
  const train::Checkpoint checkpoint = train::load_checkpoint(path);
  check_generator_checkpoint(checkpoint, path);
  Generator g;
  const nlohmann::json& meta = checkpoint.meta;
  const CheckpointDesign design = checkpoint_design(meta, path);
  // Every field is read (and bounded) before anything is built from it.
  const int64_t schedule_steps =
      design_int(meta, "schedule_steps", 2, kMaxScheduleSteps, path, "schedule_steps");
  required_field(meta, "class_names", path, "generator metadata 'class_names'");
  g.class_names = json_field(meta, "class_names", std::vector<std::string>{}, path, "class_names");
  if (static_cast<int64_t>(g.class_names.size()) != design.unet.classes)
    throw DataError(path,
                    "generator metadata 'class_names' with one name per class of its UNet (" +
                        std::to_string(design.unet.classes) + ")",
                    std::to_string(g.class_names.size()) + " names");
  g.size = design_int(meta, "size", 16, 64, path, "size");
  if (g.size != 16 && g.size != 32 && g.size != 64)
    throw DataError(path, "generator metadata 'size' of 16, 32 or 64", std::to_string(g.size));
  g.palette =
      palette_tensor(required_field(meta, "palette", path, "generator metadata 'palette'"), path);
  g.alpha = meta_choice(meta, "alpha", "binary", path, "binary or soft", parse_alpha_mode);
  g.prediction = design.prediction;
  g.net = UNet(design.unet);
  g.schedule = NoiseSchedule(schedule_steps, design.schedule);
  g.meta = checkpoint.meta;
  train::load_model_state(*g.net, checkpoint.model, path);
  train::check_finite_parameters(*g.net, path);
  g.net->to(device);
  // NCHW on every device. channels_last made a guided 32x32 UNet pass 1.26x slower on an H200
  // (23.4 against 18.6 ms at batch 2,048, bench/sampler_probe.py): CUDA's GroupNorm converts it
  // back to NCHW around every norm. SampleOptions::channels_last samples on a channels_last copy
  // (with the GroupNorm + SiLU kernel's NHWC form on CUDA).
  g.net->eval();
  g.schedule.to(device);
  return g;
}

namespace {

// Sets cuDNN's benchmark mode (a process-wide switch) for a scope and puts the old value back.
class CudnnBenchmarkScope {
 public:
  explicit CudnnBenchmarkScope(bool on) : old_(at::globalContext().benchmarkCuDNN()) {
    if (on) at::globalContext().setBenchmarkCuDNN(true);
  }
  ~CudnnBenchmarkScope() { at::globalContext().setBenchmarkCuDNN(old_); }
  CudnnBenchmarkScope(const CudnnBenchmarkScope&) = delete;
  CudnnBenchmarkScope& operator=(const CudnnBenchmarkScope&) = delete;

 private:
  bool old_;
};

// One reverse step from t to t_prev as both samplers take it (Song et al. 2021, eq. 12, with
// DDPM's posterior as the eta = 1, all-steps case), on the model's output `out`:
//   x0_hat = clip(k_x x_t - k_out out, -1, 1)
//   x_prev = c_x0 x0_hat + c_x x_t + sigma z
// k_x, k_out by prediction: eps 1 / sqrt(abar), sqrt(1 / abar - 1); v sqrt(abar), sqrt(1 - abar);
// x0 0, -1. The coefficients are plain doubles, worked out on the host before the loop (no
// per-step sync).
// DPM-Solver++(2M) adds c_prev x0_hat_prev, the previous step's clipped x0_hat (0 for the others).
struct ReverseStep {
  int64_t t = 0;
  double k_x = 0, k_out = 0;
  double c_x0 = 0, c_x = 0, sigma = 0;
  double c_prev = 0;
};

// x0_hat = k_x x_t - k_out out at abar_t = a.
std::pair<double, double> x0_coefficients(Prediction p, double a) {
  switch (p) {
    case Prediction::kV:
      return {std::sqrt(a), std::sqrt(1.0 - a)};
    case Prediction::kX0:
      return {0.0, -1.0};
    case Prediction::kEps:
      break;
  }
  return {1.0 / std::sqrt(a), std::sqrt(1.0 / a - 1.0)};
}

// The net at one step: x_t, t as a (B) device tensor and the same t on the host (what the
// guidance interval is decided by, without reading the device).
using StepModel =
    std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& t, int64_t t_host)>;

StepModel ignoring_host_t(const EpsModel& model) {
  return [&model](const torch::Tensor& x, const torch::Tensor& t, int64_t) { return model(x, t); };
}

// The guided UNet: guidance w inside `interval`, the conditional output alone outside it.
StepModel guided_model(UNet& net, const torch::Tensor& c, double guidance,
                       GuidanceInterval interval, int64_t schedule_steps) {
  return [&net, &c, guidance, interval, schedule_steps](const torch::Tensor& x,
                                                        const torch::Tensor& t, int64_t t_host) {
    return guided_eps(net, x, t, c, interval.covers(t_host, schedule_steps) ? guidance : 1.0);
  };
}

// The shared loop. x: (B, C, H, W) x_T; steps in order T - 1 .. 0. Noise for sigma > 0 is drawn on
// the CPU from `gen` (a seed gives the same sprites on every device) and copied without a sync.
torch::Tensor reverse_loop(const StepModel& eps_model, torch::Tensor x,
                           const std::vector<ReverseStep>& steps,
                           std::optional<at::Generator> gen) {
  torch::NoGradGuard no_grad;
  const int64_t b = x.size(0);
  const auto t_options = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  torch::Tensor x0_prev;  // the previous step's clipped x0_hat, for DPM-Solver++(2M)
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    // (B) t filled on the device: no host-to-device copy, so the loop can be captured as a graph.
    const auto out = eps_model(x, torch::full({b}, s.t, t_options), s.t);
    // Clipping keeps x0_hat in the data's range; the update then uses the eps implied by the
    // clipped x0_hat (folded into c_x0 / c_x), which keeps it on the DDIM / posterior path.
    const auto x0 = (s.k_x * x - s.k_out * out).clamp(-1.0, 1.0);
    x = s.c_prev != 0 ? s.c_x0 * x0 + s.c_prev * x0_prev + s.c_x * x : s.c_x0 * x0 + s.c_x * x;
    x0_prev = x0;
    if (s.sigma > 0) {
      auto z = at::randn(x.sizes(), *gen, torch::kFloat32);
      if (x.is_cuda()) z = z.pin_memory();  // pinned: the copy below does not block the host
      x = x + s.sigma * z.to(x.device(), /*non_blocking=*/true);
    }
  }
  return x.clamp(-1.0, 1.0);
}

}  // namespace

std::string spacing_name(TimestepSpacing spacing) {
  return spacing == TimestepSpacing::kQuadratic ? "quadratic" : "uniform";
}

nlohmann::json sampler_json(const SampleOptions& options, int64_t schedule_steps) {
  const bool ddpm = options.sampler == "ddpm";
  return {{"sampler", options.sampler},
          {"steps", ddpm ? schedule_steps : options.steps},
          {"spacing", ddpm ? nlohmann::json() : nlohmann::json(spacing_name(options.spacing))},
          {"eta", options.sampler == "ddim" ? nlohmann::json(options.eta) : nlohmann::json()},
          {"guidance", options.guidance},
          {"guidance_interval",
           nlohmann::json::array({options.guidance_interval.from, options.guidance_interval.to})}};
}

bool GuidanceInterval::covers(int64_t t, int64_t schedule_steps) const {
  const double f =
      schedule_steps > 1 ? static_cast<double>(t) / static_cast<double>(schedule_steps - 1) : 1.0;
  return f >= from && f <= to;
}

std::string guidance_interval_text(const GuidanceInterval& interval) {
  return c10::str(interval.from) + ":" + c10::str(interval.to);
}

GuidanceInterval parse_guidance_interval(const std::string& text) {
  const auto colon = text.find(':');
  GuidanceInterval g;
  bool ok = colon != std::string::npos;
  if (ok) {
    try {
      size_t used_a = 0, used_b = 0;
      const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
      g.from = std::stod(a, &used_a);
      g.to = std::stod(b, &used_b);
      ok = used_a == a.size() && used_b == b.size();
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || !(g.from >= 0.0 && g.from < g.to && g.to <= 1.0))
    throw Error("cannot read --guidance-interval '" + text +
                    "': expected FROM:TO, fractions of the noise schedule with 0 <= FROM < TO <= 1",
                "e.g. 0.3:0.9 (the default) guides the middle 60% of the steps, 0:1 every step");
  return g;
}

std::string describe_sampler(const SampleOptions& options, int64_t schedule_steps) {
  const auto& interval = options.guidance_interval;
  // Few steps can all miss the interval (--steps 1 samples at t/T 1 alone): the guidance then
  // changes nothing, and the line says so rather than naming a guidance that is not applied.
  bool guided = options.sampler == "ddpm";
  if (!guided)
    for (int64_t t : ddim_timesteps(schedule_steps, options.steps, options.spacing))
      guided = guided || interval.covers(t, schedule_steps);
  const std::string guidance =
      ", guidance " + c10::str(options.guidance) +
      (interval.whole() || options.guidance == 1.0
           ? std::string()
           : " at t/T " + c10::str(interval.from) + "-" + c10::str(interval.to) +
                 (guided ? std::string()
                         : std::string(options.steps == 1 ? " (its one step is outside it"
                                                          : " (none of its steps falls in it") +
                               ": unguided; widen --guidance-interval)"));
  if (options.sampler == "ddpm")
    return "ddpm, all " + std::to_string(schedule_steps) + " steps" + guidance;
  return options.sampler + " " + std::to_string(options.steps) + " " +
         spacing_name(options.spacing) + (options.steps == 1 ? " step" : " steps") +
         (options.sampler == "ddim" ? ", eta " + c10::str(options.eta) : "") + guidance;
}

TimestepSpacing parse_spacing(const std::string& name) {
  if (name == "uniform") return TimestepSpacing::kUniform;
  if (name == "quadratic") return TimestepSpacing::kQuadratic;
  throw Error("unknown timestep spacing '" + name + "': expected uniform or quadratic");
}

std::vector<int64_t> ddim_timesteps(int64_t T, int64_t steps, TimestepSpacing spacing) {
  steps = std::clamp<int64_t>(steps, 1, T);
  if (steps == 1) return {T - 1};
  std::vector<int64_t> out;
  // From T - 1 down to 0, both included: evenly spaced, or at (T - 1) u^2 for evenly spaced u.
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t k = steps - 1 - i;
    if (spacing == TimestepSpacing::kUniform) {
      out.push_back(((T - 1) * k) / (steps - 1));
    } else {
      const double u = static_cast<double>(k) / static_cast<double>(steps - 1);
      out.push_back(std::llround(static_cast<double>(T - 1) * u * u));
    }
  }
  // Distinct: where rounding put two at the same t (the quadratic's low end), the earlier one
  // moves up; steps <= T keeps them within [0, T - 1].
  for (int64_t i = steps - 2; i >= 0; --i) out[i] = std::max(out[i], out[i + 1] + 1);
  return out;
}

namespace {

// Each sampler's steps, worked out on the host before its loop.
std::vector<ReverseStep> ddim_plan(const NoiseSchedule& schedule, int64_t steps, double eta,
                                   bool has_gen, Prediction prediction, TimestepSpacing spacing) {
  if (!(eta >= 0)) throw Error("DDIM eta must be >= 0, got " + std::to_string(eta));
  if (eta > 0 && !has_gen) throw Error("DDIM with eta > 0 needs a generator for its noise");
  const auto& ab = schedule.host_alpha_bars();
  const auto ts = ddim_timesteps(schedule.steps(), steps, spacing);
  std::vector<ReverseStep> plan;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t t = ts[i];
    // After the last timestep comes "t = -1": abar = 1, i.e. x_prev = x0_hat.
    const double a = ab[t], a_prev = i + 1 < ts.size() ? ab[ts[i + 1]] : 1.0;
    // sigma_t(eta), Song et al. eq. 16.
    const double sigma =
        eta * std::sqrt(std::max(0.0, (1.0 - a_prev) / (1.0 - a) * (1.0 - a / a_prev)));
    // Eq. 12: x_prev = sqrt(a_prev) x0 + sqrt(1 - a_prev - sigma^2) eps + sigma z, with
    // eps = (x - sqrt(a) x0) / sqrt(1 - a) re-derived from the clipped x0.
    const double dir = std::sqrt(std::max(0.0, 1.0 - a_prev - sigma * sigma)) / std::sqrt(1.0 - a);
    const auto [k_x, k_out] = x0_coefficients(prediction, a);
    plan.push_back({t, k_x, k_out, std::sqrt(a_prev) - dir * std::sqrt(a), dir, sigma});
  }
  return plan;
}

std::vector<ReverseStep> dpm_solver_plan(const NoiseSchedule& schedule, int64_t steps,
                                         Prediction prediction, TimestepSpacing spacing) {
  const auto& ab = schedule.host_alpha_bars();
  const auto ts = ddim_timesteps(schedule.steps(), steps, spacing);
  // log(alpha / sigma) at abar = a: the solver's time variable.
  auto lambda = [](double a) { return 0.5 * std::log(a / (1.0 - a)); };
  std::vector<ReverseStep> plan;
  for (size_t i = 0; i < ts.size(); ++i) {
    const double a = ab[ts[i]];
    const bool last = i + 1 == ts.size();  // to abar = 1: x_prev = x0_hat
    const double a_prev = last ? 1.0 : ab[ts[i + 1]];
    const auto [k_x, k_out] = x0_coefficients(prediction, a);
    ReverseStep s{ts[i], k_x, k_out};
    if (last) {
      s.c_x0 = 1.0;
    } else {
      // x_prev = (sigma_prev / sigma) x + alpha_prev (1 - e^-h) D, h = lambda_prev - lambda:
      // with D = x0_hat this is DDIM's eta-0 step (first order).
      const double h = lambda(a_prev) - lambda(a);
      const double g = std::sqrt(a_prev) * -std::expm1(-h);
      s.c_x = std::sqrt((1.0 - a_prev) / (1.0 - a));
      s.c_x0 = g;
      if (i > 0) {
        // D = (1 + 1/(2r)) x0_hat - 1/(2r) x0_hat_prev, r = h_last / h (Lu et al. 2022, alg. 2).
        const double r = (lambda(a) - lambda(ab[ts[i - 1]])) / h;
        s.c_x0 = g * (1.0 + 0.5 / r);
        s.c_prev = -g * 0.5 / r;
      }
    }
    plan.push_back(s);
  }
  return plan;
}

std::vector<ReverseStep> ddpm_plan(const NoiseSchedule& schedule, Prediction prediction) {
  const auto& ab = schedule.host_alpha_bars();
  const auto& betas = schedule.host_betas();
  std::vector<ReverseStep> plan;
  for (int64_t t = schedule.steps() - 1; t >= 0; --t) {
    const double a = ab[t], a_prev = t > 0 ? ab[t - 1] : 1.0, beta = betas[t];
    // Ho et al. eq. 7: the posterior q(x_{t-1} | x_t, x0) at the clipped x0_hat, with its own
    // variance beta~_t = beta_t (1 - a_prev) / (1 - a) (0 at t = 0: the last step adds no noise).
    const auto [k_x, k_out] = x0_coefficients(prediction, a);
    plan.push_back({t, k_x, k_out, std::sqrt(a_prev) * beta / (1.0 - a),
                    std::sqrt(1.0 - beta) * (1.0 - a_prev) / (1.0 - a),
                    std::sqrt(beta * (1.0 - a_prev) / (1.0 - a))});
  }
  return plan;
}

}  // namespace

torch::Tensor ddim_sample_eps(const EpsModel& eps_model, const NoiseSchedule& schedule,
                              torch::Tensor x, int64_t steps, double eta,
                              std::optional<at::Generator> gen, Prediction prediction,
                              TimestepSpacing spacing) {
  const auto plan = ddim_plan(schedule, steps, eta, gen.has_value(), prediction, spacing);
  return reverse_loop(ignoring_host_t(eps_model), std::move(x), plan, eta > 0 ? gen : std::nullopt);
}

torch::Tensor dpm_solver_sample_eps(const EpsModel& eps_model, const NoiseSchedule& schedule,
                                    torch::Tensor x, int64_t steps, Prediction prediction,
                                    TimestepSpacing spacing) {
  return reverse_loop(ignoring_host_t(eps_model), std::move(x),
                      dpm_solver_plan(schedule, steps, prediction, spacing), std::nullopt);
}

torch::Tensor ddpm_sample_eps(const EpsModel& eps_model, const NoiseSchedule& schedule,
                              torch::Tensor x, at::Generator gen, Prediction prediction) {
  return reverse_loop(ignoring_host_t(eps_model), std::move(x), ddpm_plan(schedule, prediction),
                      gen);
}

torch::Tensor ddim_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, int64_t steps, double guidance, double eta,
                          std::optional<at::Generator> gen, Prediction prediction,
                          TimestepSpacing spacing, GuidanceInterval interval) {
  const auto plan = ddim_plan(schedule, steps, eta, gen.has_value(), prediction, spacing);
  return reverse_loop(guided_model(net, c, guidance, interval, schedule.steps()), std::move(x),
                      plan, eta > 0 ? gen : std::nullopt);
}

torch::Tensor dpm_solver_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                                const torch::Tensor& c, int64_t steps, double guidance,
                                Prediction prediction, TimestepSpacing spacing,
                                GuidanceInterval interval) {
  return reverse_loop(guided_model(net, c, guidance, interval, schedule.steps()), std::move(x),
                      dpm_solver_plan(schedule, steps, prediction, spacing), std::nullopt);
}

torch::Tensor ddpm_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, double guidance, at::Generator gen,
                          Prediction prediction, GuidanceInterval interval) {
  return reverse_loop(guided_model(net, c, guidance, interval, schedule.steps()), std::move(x),
                      ddpm_plan(schedule, prediction), gen);
}

UNet sampling_copy(const UNetImpl& net, torch::ScalarType dtype, bool channels_last) {
  UNet copy(net.options());
  torch::NoGradGuard no_grad;
  const auto from = net.named_parameters();
  for (auto& p : copy->named_parameters()) {
    auto value = from[p.key()].to(dtype);
    if (channels_last && value.dim() == 4) value = value.contiguous(at::MemoryFormat::ChannelsLast);
    p.value().set_data(value);
  }
  copy->eval();
  return copy;
}

UNet bf16_copy(const UNetImpl& net) { return sampling_copy(net, torch::kBFloat16, false); }

std::string resolve_sampling_precision(const std::string& requested, const torch::Device& device) {
  if (requested == "bf16" && !device.is_cuda() && !device.is_cpu())
    throw Error("--precision bf16: sampling in bf16 runs on CUDA and the CPU, not " + device.str(),
                "use --precision fp32");
  if (requested == "fp32" || requested == "bf16") return requested;
  if (requested != "auto")
    throw Error("unknown sampling precision '" + requested + "': expected auto, fp32 or bf16");
  return device.is_cpu() && device::describe_device(device).bf16_auto ? "bf16" : "fp32";
}

torch::Tensor sample(Generator& g, const torch::Tensor& labels, const SampleOptions& options) {
  return sample(g, labels, options, {});
}

torch::Tensor sample(Generator& g, const torch::Tensor& labels, const SampleOptions& options,
                     const std::function<torch::Tensor(const torch::Tensor&)>& finish) {
  if (options.sampler != "ddim" && options.sampler != "ddpm" && options.sampler != "dpm++2m")
    throw Error("unknown sampler '" + options.sampler + "': expected ddim, dpm++2m or ddpm");
  if (options.steps < 1) throw Error("--steps must be >= 1");
  const int64_t T = g.schedule.steps();
  if (options.sampler != "ddpm" && options.steps > T)
    throw Error("--steps " + std::to_string(options.steps) +
                    ": this generator's noise schedule has " + std::to_string(T) +
                    " timesteps, the most " + options.sampler + " can take",
                "pass --steps " + std::to_string(T) + " or fewer");
  // Far above the usual 1-10 the guided output leaves the sprites' range and every pixel
  // saturates to the palette's extremes (1e30 gave sheets of nine colours).
  if (!(options.guidance >= 0 && options.guidance <= kMaxGuidance))
    throw Error("--guidance " + c10::str(options.guidance) + ": expected a scale from 0 to " +
                c10::str(kMaxGuidance) + " (0: unconditional, 1: no guidance; 1-10 is usual)");
  const auto device = g.net->parameters().front().device();
  const std::string precision = resolve_sampling_precision(options.precision, device);
  const int64_t n = labels.size(0), batch = std::max<int64_t>(options.batch, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const bool graphs = graph_sampling_applies(device, options, n);
  // bf16: the UNet's passes in bf16, its output and the updates between passes in fp32. On CUDA a
  // bf16 copy of the UNet (g.net stays as it is): half the bytes of every pass and no casts
  // around each layer. On the CPU autocast: with LibTorch 1.13 it sampled 1.6x faster than fp32
  // on a Zen 4 core, the copy 1.2x slower (bf16 GroupNorm and elementwise kernels).
  const bool bf16 = precision == "bf16";
  const bool copy_in_bf16 = bf16 && device.is_cuda();
  UNet net = copy_in_bf16 || options.channels_last
                 ? sampling_copy(*g.net, copy_in_bf16 ? torch::kBFloat16 : torch::kFloat32,
                                 options.channels_last)
                 : g.net;
  const BatchSampler eager = [&](const torch::Tensor& x, const torch::Tensor& c) {
    std::optional<precision::AutocastGuard> autocast;
    if (bf16 && !device.is_cuda())
      autocast.emplace(device.type(), torch::kBFloat16, true, /*cache_enabled=*/!graphs);
    // (What ddim_sample, dpm_solver_sample and ddpm_sample run, with the stop asked before each
    // pass; a graph's capture asks nothing: the batch loop below does.)
    StepModel model = guided_model(net, c, options.guidance, options.guidance_interval, T);
    if (options.stop && !graphs)
      model = [inner = std::move(model), &stop = options.stop](
                  const torch::Tensor& x_t, const torch::Tensor& t, int64_t host_t) {
        if (stop()) throw SamplingStopped();
        return inner(x_t, t, host_t);
      };
    if (options.sampler == "dpm++2m")
      return reverse_loop(model, x,
                          dpm_solver_plan(g.schedule, options.steps, g.prediction, options.spacing),
                          std::nullopt);
    if (options.sampler == "ddim")
      return reverse_loop(model, x,
                          ddim_plan(g.schedule, options.steps, options.eta, /*has_gen=*/true,
                                    g.prediction, options.spacing),
                          options.eta > 0 ? std::optional<at::Generator>(gen) : std::nullopt);
    return reverse_loop(model, x, ddpm_plan(g.schedule, g.prediction), gen);
  };
  std::optional<CudaGraphSampler> graphed;
  if (graphs) graphed.emplace(eager, device);
  // Every batch but the last has one shape, so on CUDA cuDNN times its algorithms once and keeps
  // the fastest (its heuristics picked FFT and im2col kernels here); restored on return.
  const CudnnBenchmarkScope cudnn_benchmark(device.is_cuda());
  std::vector<torch::Tensor> out;
  for (int64_t start = 0; start < n; start += batch) {
    if (options.stop && options.stop()) throw SamplingStopped();
    const int64_t b = std::min(batch, n - start);
    auto x =
        at::randn({b, g.net->options().channels, g.size, g.size}, gen, torch::kFloat32).to(device);
    if (options.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const auto c = labels.narrow(0, start, b).to(device);
    torch::Tensor batch_out = graphed ? graphed->run(x, c) : eager(x, c);  // (b, 4, S, S) float
    // Weights that overflow give NaN, which the sprites' conversion turns into blank pixels: a
    // sheet of nothing, written as a result. (One flag read per batch; the sprites are read next.)
    if (!torch::isfinite(batch_out).all().item<bool>())
      throw Error("the generator's output is not finite (NaN or infinity) for sprites " +
                      std::to_string(start + 1) + "-" + std::to_string(start + b),
                  "its weights overflow: the run that wrote them was diverging; take an earlier "
                  "checkpoint of it");
    out.push_back(finish ? finish(batch_out) : batch_out);
  }
  return torch::cat(out);
}

namespace {
// to_sprites on x's device: (N, 4, S, S) uint8 there.
torch::Tensor quantise(const torch::Tensor& x, AlphaMode mode) {
  auto px =
      ((x.detach().to(torch::kFloat32) + 1.0) * 127.5).round().clamp(0, 255).to(torch::kUInt8);
  auto alpha = px.narrow(1, 3, 1);  // (N, 1, S, S)
  const auto shown = (alpha >= (mode == AlphaMode::kSoft ? kAlphaFloor : 128)).to(torch::kUInt8);
  if (mode == AlphaMode::kSoft)
    alpha.mul_(shown);
  else
    alpha.copy_(shown * 255);
  px.narrow(1, 0, 3).mul_(shown);
  return px;
}
}  // namespace

torch::Tensor to_sprites(const torch::Tensor& x, AlphaMode alpha) {
  return quantise(x, alpha).cpu();
}

torch::Tensor finish_sprites(const torch::Tensor& x, int64_t colours, AlphaMode alpha) {
  return reduce_colours(quantise(x, alpha), colours).cpu();
}

torch::Tensor snap_to_palette(const torch::Tensor& sprites, const torch::Tensor& palette) {
  if (palette.dim() != 2 || palette.size(1) != 3 || palette.size(0) == 0)
    throw Error("a palette must be (K, 3) with K >= 1, got " + c10::str(palette.sizes()));
  auto out = sprites.clone();
  const int64_t n = out.size(0), s = out.size(2) * out.size(3);
  auto rgb =
      out.narrow(1, 0, 3).permute({0, 2, 3, 1}).reshape({n * s, 3}).to(torch::kFloat32);  // (P, 3)
  const auto pal = palette.to(torch::kFloat32);                                           // (K, 3)
  const auto nearest = torch::cdist(rgb, pal).argmin(1);                                  // (P)
  auto snapped =
      palette.index_select(0, nearest).view({n, out.size(2), out.size(3), 3}).permute({0, 3, 1, 2});
  const auto opaque = out.narrow(1, 3, 1) > 0;
  out.narrow(1, 0, 3).copy_(torch::where(opaque, snapped, out.narrow(1, 0, 3)));
  return out;
}

namespace {

// One sprite's opaque pixels as the loop form works on them.
using Rgb = std::array<float, 3>;
float squared_distance(const Rgb& a, const Rgb& b) {  // r, g, b in this order, as the tensor form
  float d = (a[0] - b[0]) * (a[0] - b[0]);
  d = d + (a[1] - b[1]) * (a[1] - b[1]);
  return d + (a[2] - b[2]) * (a[2] - b[2]);
}

// One sprite (4, H, W) uint8, contiguous, in place.
void reduce_sprite_colours(uint8_t* sprite, int64_t pixels, int64_t colours) {
  std::vector<int64_t> where;  // raster index of each opaque pixel
  std::vector<Rgb> px;
  for (int64_t q = 0; q < pixels; ++q)
    if (sprite[3 * pixels + q] >= 128) {
      where.push_back(q);
      px.push_back({static_cast<float>(sprite[q]), static_cast<float>(sprite[pixels + q]),
                    static_cast<float>(sprite[2 * pixels + q])});
    }
  if (px.empty()) return;
  std::vector<Rgb> c = {px[0]};
  std::vector<float> d2(px.size());
  for (size_t q = 0; q < px.size(); ++q) d2[q] = squared_distance(px[q], c[0]);
  while (static_cast<int64_t>(c.size()) < colours) {
    const auto far = static_cast<size_t>(std::max_element(d2.begin(), d2.end()) - d2.begin());
    if (d2[far] == 0) break;  // fewer distinct colours than asked
    c.push_back(px[far]);
    for (size_t q = 0; q < px.size(); ++q)
      d2[q] = std::min(d2[q], squared_distance(px[q], c.back()));
  }
  const auto nearest = [&](const Rgb& p) {  // the first of equally near centres
    size_t best = 0;
    float best_d = squared_distance(p, c[0]);
    for (size_t j = 1; j < c.size(); ++j) {
      const float d = squared_distance(p, c[j]);
      if (d < best_d) best = j, best_d = d;
    }
    return best;
  };
  std::vector<size_t> assign(px.size());
  for (int iter = 0; iter <= 10; ++iter) {  // 10 Lloyd updates, then the final assignment
    for (size_t q = 0; q < px.size(); ++q) assign[q] = nearest(px[q]);
    if (iter == 10) break;
    std::vector<Rgb> sums(c.size(), Rgb{0, 0, 0});
    std::vector<float> counts(c.size(), 0);
    for (size_t q = 0; q < px.size(); ++q) {
      for (int ch = 0; ch < 3; ++ch) sums[assign[q]][ch] += px[q][ch];
      counts[assign[q]] += 1;
    }
    for (size_t j = 0; j < c.size(); ++j)
      if (counts[j] > 0)
        for (int ch = 0; ch < 3; ++ch) c[j][ch] = sums[j][ch] / counts[j];
  }
  const auto snap = [&](int64_t q, size_t centre) {
    for (int ch = 0; ch < 3; ++ch)
      sprite[ch * pixels + q] =
          static_cast<uint8_t>(std::clamp(std::nearbyint(c[centre][ch]), 0.0f, 255.0f));
  };
  for (size_t q = 0; q < px.size(); ++q) snap(where[q], assign[q]);
  // Partly transparent pixels (a soft-alpha model's edges) take the nearest of those colours too:
  // at most `colours` over every visible pixel, as --palette snaps them.
  for (int64_t q = 0; q < pixels; ++q)
    if (sprite[3 * pixels + q] > 0 && sprite[3 * pixels + q] < 128)
      snap(q, nearest({static_cast<float>(sprite[q]), static_cast<float>(sprite[pixels + q]),
                       static_cast<float>(sprite[2 * pixels + q])}));
}

// Squared RGB distance of every pixel to every centre, summed in a fixed order (r, g, b).
// px: (B, P, 3), centres: (B, K, 3) float -> (B, P, K).
torch::Tensor squared_distances(const torch::Tensor& px, const torch::Tensor& centres) {
  torch::Tensor d;
  for (int64_t ch = 0; ch < 3; ++ch) {
    const auto diff = px.select(2, ch).unsqueeze(2) - centres.select(2, ch).unsqueeze(1);
    d = ch == 0 ? diff * diff : d + diff * diff;
  }
  return d;
}

// reduce_colours on B sprites at once, in place: sprites (B, 4, S, S) uint8 on any device.
void reduce_colours_batch(torch::Tensor sprites, int64_t k) {
  const int64_t b = sprites.size(0), p = sprites.size(2) * sprites.size(3);
  const auto opaque = sprites.select(1, 3).reshape({b, p}) >= 128;  // (B, P)
  const auto px = sprites.narrow(1, 0, 3).reshape({b, 3, p}).transpose(1, 2).to(torch::kFloat32);
  const auto pick = [&](const torch::Tensor& index) {  // (B) pixel index -> (B, 3) its colour
    return px.gather(1, index.view({b, 1, 1}).expand({b, 1, 3})).squeeze(1);
  };
  // Farthest-point start from each sprite's first opaque pixel. d2: (B, P) squared distance to the
  // nearest centre so far, -1 at transparent pixels (never picked). A sprite whose farthest pixel
  // is at distance 0 has all its colours: its later centres are not valid (the per-sprite loop's
  // early stop), and stay so, as d2 only shrinks.
  const auto first = opaque.to(torch::kUInt8).argmax(1);  // (B) the first opaque pixel
  std::vector<torch::Tensor> centres = {pick(first)}, valid = {opaque.any(1)};
  auto d2 = torch::where(opaque, squared_distances(px, centres[0].unsqueeze(1)).squeeze(2),
                         torch::full({}, -1.0f, px.options()));
  for (int64_t j = 1; j < k; ++j) {
    const auto [farthest, at] = d2.max(1);  // (B) the first farthest pixel
    centres.push_back(pick(at));
    valid.push_back(farthest > 0);
    d2 = torch::minimum(d2, squared_distances(px, centres.back().unsqueeze(1)).squeeze(2));
  }
  auto c = torch::stack(centres, 1);                                      // (B, K, 3)
  const auto unused = torch::stack(valid, 1).logical_not().unsqueeze(1);  // (B, 1, K)
  const auto inf = torch::full({}, std::numeric_limits<float>::infinity(), px.options());
  const auto assign = [&] {  // (B, P) nearest valid centre, the first on ties
    return torch::where(unused, inf, squared_distances(px, c)).argmin(2);
  };
  // Sums of integer colours stay exact in fp32 (at most 255 x 4,096 pixels), whatever the order
  // scatter_add adds them in on the GPU.
  const auto weight = opaque.to(torch::kFloat32);  // (B, P): transparent pixels count for nothing
  const auto weighted = px * weight.unsqueeze(2);
  for (int iter = 0; iter < 10; ++iter) {
    const auto a = assign();
    const auto sums =
        torch::zeros_like(c).scatter_add_(1, a.unsqueeze(2).expand({b, p, 3}), weighted);
    const auto counts = torch::zeros({b, k}, px.options()).scatter_add_(1, a, weight);  // (B, K)
    c = torch::where(counts.unsqueeze(2) > 0, sums / counts.clamp_min(1).unsqueeze(2), c);
  }
  const auto snapped = c.round()
                           .clamp(0, 255)
                           .to(torch::kUInt8)
                           .gather(1, assign().unsqueeze(2).expand({b, p, 3}));  // (B, P, 3)
  // Every visible pixel of a sprite with opaque ones, partly transparent edges included.
  const auto visible = (sprites.select(1, 3).reshape({b, p}) > 0).logical_and(opaque.any(1, true));
  auto rgb = sprites.narrow(1, 0, 3);
  rgb.copy_(torch::where(visible.view({b, 1, sprites.size(2), sprites.size(3)}),
                         snapped.transpose(1, 2).reshape(rgb.sizes()), rgb));
}

}  // namespace

torch::Tensor reduce_colours(const torch::Tensor& sprites, int64_t colours) {
  return sprites.is_cpu() ? reduce_colours_loop(sprites, colours)
                          : reduce_colours_batched(sprites, colours);
}

torch::Tensor reduce_colours_loop(const torch::Tensor& sprites, int64_t colours) {
  if (colours <= 0) return sprites;
  auto out = sprites.cpu().clone(torch::MemoryFormat::Contiguous);  // one copy, contiguous
  const int64_t pixels = out.size(2) * out.size(3);
  uint8_t* data = out.data_ptr<uint8_t>();
  at::parallel_for(0, out.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      reduce_sprite_colours(data + i * 4 * pixels, pixels, colours);
  });
  return out;
}

torch::Tensor reduce_colours_batched(const torch::Tensor& sprites, int64_t colours) {
  if (colours <= 0) return sprites;
  auto out = sprites.clone();
  // Sprites in chunks: the (B, P, K) distances are the largest tensors (CUDA ~128 MB each).
  const int64_t per_sprite = out.size(2) * out.size(3) * colours;
  const int64_t budget = out.is_cuda() ? (int64_t{32} << 20) : (int64_t{4} << 20);
  const int64_t chunk = std::max<int64_t>(1, budget / std::max<int64_t>(per_sprite, 1));
  for (int64_t start = 0; start < out.size(0); start += chunk)
    reduce_colours_batch(out.narrow(0, start, std::min(chunk, out.size(0) - start)), colours);
  return out;
}

torch::Tensor kmeans_palette(const torch::Tensor& sprites, int64_t colours, uint64_t seed) {
  const auto cpu = sprites.cpu();
  auto rgba = cpu.permute({0, 2, 3, 1}).reshape({-1, 4});
  auto pixels =
      rgba.index({rgba.select(1, 3) >= 128}).narrow(1, 0, 3).to(torch::kFloat32);  // (P, 3)
  if (pixels.size(0) == 0)
    throw Error("cannot build a palette: the training sprites have no opaque pixels");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (pixels.size(0) > 20000)
    pixels = pixels.index_select(0, torch::randperm(pixels.size(0), gen).narrow(0, 0, 20000));
  const int64_t k = std::min(colours, pixels.size(0));
  // k-means++: each next centre drawn with probability proportional to the squared distance.
  std::vector<torch::Tensor> centres = {
      pixels[at::randint(pixels.size(0), {1}, gen).item<int64_t>()]};
  auto d2 = (pixels - centres[0]).pow(2).sum(1);
  for (int64_t i = 1; i < k; ++i) {
    const auto pick = torch::multinomial(d2 + 1e-6, 1, false, gen).item<int64_t>();
    centres.push_back(pixels[pick]);
    d2 = torch::minimum(d2, (pixels - centres.back()).pow(2).sum(1));
  }
  auto c = torch::stack(centres);  // (k, 3)
  for (int iter = 0; iter < 25; ++iter) {
    const auto assign = torch::cdist(pixels, c).argmin(1);
    auto sums = torch::zeros_like(c).index_add_(0, assign, pixels);
    auto counts =
        torch::zeros({k}, torch::kFloat32).index_add_(0, assign, torch::ones({pixels.size(0)}));
    c = torch::where(counts.unsqueeze(1) > 0, sums / counts.clamp_min(1).unsqueeze(1), c);
  }
  return c.round().clamp(0, 255).to(torch::kUInt8);
}

torch::Tensor palette_from_png(const std::string& path) {
  const auto image = io::read_png(path).reshape({-1, 4});
  const auto opaque = image.index({image.select(1, 3) >= 128}).narrow(1, 0, 3).contiguous();
  if (opaque.size(0) == 0)
    throw DataError(path, "a palette image with opaque pixels", "only transparent pixels");
  std::set<std::array<uint8_t, 3>> seen;
  std::vector<uint8_t> flat;
  const auto a = opaque.accessor<uint8_t, 2>();
  for (int64_t i = 0; i < opaque.size(0); ++i) {
    std::array<uint8_t, 3> rgb{a[i][0], a[i][1], a[i][2]};
    if (seen.insert(rgb).second) flat.insert(flat.end(), rgb.begin(), rgb.end());
    if (seen.size() > 4096) throw DataError(path, "a palette of at most 4096 colours", "more");
  }
  return torch::tensor(flat, torch::kUInt8).view({-1, 3}).clone();
}

torch::Tensor classifier_pass(models::ClassifierImpl& classifier, const torch::Tensor& sprites,
                              ClassifierPass pass) {
  torch::InferenceMode guard;
  classifier.eval();
  const auto device = classifier.parameters().front().device();
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < sprites.size(0); i += 1000) {
    const auto part = sprites.narrow(0, i, std::min<int64_t>(1000, sprites.size(0) - i));
    parts.push_back((classifier.*pass)(data::to_model_input(part.to(device))).cpu());
  }
  return torch::cat(parts);
}

Agreement classifier_agreement(models::ClassifierImpl& classifier, const torch::Tensor& sprites,
                               const torch::Tensor& labels, int64_t classes) {
  Agreement a;
  if (sprites.size(0) == 0) return a;
  const auto predicted = classifier_pass(classifier, sprites, &models::ClassifierImpl::forward);
  torch::InferenceMode guard;
  const auto truth = labels.cpu();
  const auto hit = (predicted.argmax(1) == truth).to(torch::kFloat64);
  a.mean = hit.mean().item<double>();
  for (int64_t c = 0; c < classes; ++c)
    a.per_class.push_back(hit.index({truth == c}).mean().item<double>());
  return a;
}

GeneratorEval evaluate_generator(Generator& g, models::ClassifierImpl& classifier,
                                 const torch::Tensor& training, int64_t count,
                                 const SampleOptions& options) {
  const int64_t k = static_cast<int64_t>(g.class_names.size());
  const auto labels = torch::arange(count, torch::kInt64).remainder(k);  // balanced
  const auto device = g.net->parameters().front().device();
  DeviceTimer timer(device);
  // (N, 4, S, S) uint8, CPU, as generate writes them.
  const AlphaMode alpha = options.alpha.value_or(g.alpha);
  const auto sprites = finish_sprites(sample(g, labels, options), options.colours, alpha);
  GeneratorEval r;
  r.samples = count;
  r.sample_seconds = timer.seconds();
  r.sprites_per_second = static_cast<double>(count) / r.sample_seconds;
  r.agreement = classifier_agreement(classifier, sprites, labels, k);
  auto key = [](const torch::Tensor& s) {
    const auto c = s.contiguous();
    return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()),
                       static_cast<size_t>(c.numel()));
  };
  std::unordered_set<std::string> generated, train_keys;
  const auto real = to_sprites(training.to(torch::kFloat32) / 127.5 - 1.0, alpha);  // as samples
  for (int64_t i = 0; i < real.size(0); ++i) train_keys.insert(key(real[i]));
  int64_t copies = 0;
  for (int64_t i = 0; i < count; ++i) {
    const auto k_i = key(sprites[i]);
    generated.insert(k_i);
    copies += train_keys.count(k_i) ? 1 : 0;
  }
  r.distinct = static_cast<double>(generated.size()) / static_cast<double>(count);
  r.exact_copies = static_cast<double>(copies) / static_cast<double>(count);
  r.sprites = sprites;
  r.labels = labels;
  return r;
}

}  // namespace spritetorch::diffusion
