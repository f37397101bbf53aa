#include "diffusion/generator.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_set>

#include "common/error.h"
#include "common/timer.h"
#include "io/png.h"
#include "train/checkpoint.h"
#include "train/model_state.h"

namespace spritetorch::diffusion {

namespace {

// eps with classifier-free guidance: one forward pass over [conditional; unconditional].
torch::Tensor guided_eps(UNet& net, const torch::Tensor& x, const torch::Tensor& t,
                         const torch::Tensor& c, double guidance) {
  if (guidance == 1.0) return net->forward(x, t, c);
  const auto null_c = torch::full_like(c, net->options().classes);
  auto eps = net->forward(torch::cat({x, x}), torch::cat({t, t}), torch::cat({c, null_c}));
  auto parts = eps.chunk(2);
  return parts[1] + guidance * (parts[0] - parts[1]);
}

torch::Tensor palette_tensor(const nlohmann::json& j) {
  std::vector<uint8_t> flat;
  for (const auto& rgb : j)
    for (const auto& v : rgb) flat.push_back(v.get<uint8_t>());
  return torch::tensor(flat, torch::kUInt8).view({-1, 3}).clone();
}

}  // namespace

void check_generator_checkpoint(const train::Checkpoint& c, const std::string& source) {
  if (c.meta.value("task", std::string()) != "generate")
    throw DataError(source, "a generator checkpoint (train --task generate)",
                    "a '" + c.meta.value("model", std::string("?")) + "' classifier checkpoint");
}

Generator load_generator(const std::string& path, torch::Device device) {
  const train::Checkpoint checkpoint = train::load_checkpoint(path);
  check_generator_checkpoint(checkpoint, path);
  Generator g;
  try {
    UNetOptions o;
    const auto& u = checkpoint.meta.at("unet");
    o.channels = u.at("channels").get<int64_t>();
    o.base = u.at("base").get<int64_t>();
    o.classes = u.at("classes").get<int64_t>();
    o.embed = u.at("embed").get<int64_t>();
    g.net = UNet(o);
    g.schedule = NoiseSchedule(checkpoint.meta.at("schedule_steps").get<int64_t>());
    g.class_names = checkpoint.meta.at("class_names").get<std::vector<std::string>>();
    g.size = checkpoint.meta.at("size").get<int64_t>();
    g.palette = palette_tensor(checkpoint.meta.at("palette"));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path, "generator metadata (unet, schedule_steps, class_names, size, palette)",
                    e.what());
  }
  g.meta = checkpoint.meta;
  train::load_model_state(*g.net, checkpoint.model, path);
  g.net->to(device);
  g.net->eval();
  g.schedule.to(device);
  return g;
}

torch::Tensor ddim_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, int64_t steps, double guidance, double eta,
                          std::optional<at::Generator> gen) {
  torch::NoGradGuard no_grad;
  const int64_t T = schedule.steps();
  steps = std::clamp<int64_t>(steps, 1, T);
  const auto ab = schedule.alpha_bars().cpu();
  const auto ab_a = ab.accessor<float, 1>();
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  // Evenly spaced timesteps from T - 1 down to 0; after the last one comes "t = -1" (abar = 1).
  auto timestep = [&](int64_t i) -> int64_t {
    if (i >= steps) return -1;
    return steps == 1 ? T - 1 : ((T - 1) * (steps - 1 - i)) / (steps - 1);
  };
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t t = timestep(i), t_prev = timestep(i + 1);
    const double a = ab_a[t], a_prev = t_prev >= 0 ? ab_a[t_prev] : 1.0;
    const auto eps = guided_eps(net, x, torch::full({x.size(0)}, t, opts), c, guidance);
    // No clipping of x0 on the way: clipped predictions at high noise pushed every colour to the
    // extremes (saturated, noisy sprites); the ODE path of the model itself is cleaner.
    const auto x0 = (x - std::sqrt(1.0 - a) * eps) / std::sqrt(a);
    // eta = 0: deterministic DDIM; eta = 1: DDPM-like noise at every step (Song et al., eq. 16).
    const double sigma =
        eta * std::sqrt((1.0 - a_prev) / (1.0 - a)) * std::sqrt(std::max(0.0, 1.0 - a / a_prev));
    x = std::sqrt(a_prev) * x0 + std::sqrt(std::max(0.0, 1.0 - a_prev - sigma * sigma)) * eps;
    if (sigma > 0 && gen)
      x = x + sigma * at::randn(x.sizes(), *gen, torch::kFloat32).to(x.device());
  }
  return x.clamp(-1.0, 1.0);
}

torch::Tensor ddpm_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, double guidance, at::Generator gen) {
  torch::NoGradGuard no_grad;
  const auto betas = schedule.betas().cpu(), alphas = schedule.alphas().cpu(),
             ab = schedule.alpha_bars().cpu();
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  for (int64_t t = schedule.steps() - 1; t >= 0; --t) {
    const double beta = betas[t].item<double>(), alpha = alphas[t].item<double>(),
                 a = ab[t].item<double>();
    const auto eps = guided_eps(net, x, torch::full({x.size(0)}, t, opts), c, guidance);
    x = (x - (beta / std::sqrt(1.0 - a)) * eps) / std::sqrt(alpha);
    if (t > 0) x = x + std::sqrt(beta) * at::randn(x.sizes(), gen, torch::kFloat32).to(x.device());
  }
  return x.clamp(-1.0, 1.0);
}

torch::Tensor sample(Generator& g, const torch::Tensor& labels, const SampleOptions& options) {
  if (options.sampler != "ddim" && options.sampler != "ddpm")
    throw Error("unknown sampler '" + options.sampler + "': expected ddim or ddpm");
  if (options.steps < 1) throw Error("--steps must be >= 1");
  const auto device = g.net->parameters().front().device();
  const int64_t n = labels.size(0), batch = std::max<int64_t>(options.batch, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::vector<torch::Tensor> out;
  for (int64_t start = 0; start < n; start += batch) {
    const int64_t b = std::min(batch, n - start);
    auto x =
        at::randn({b, g.net->options().channels, g.size, g.size}, gen, torch::kFloat32).to(device);
    const auto c = labels.narrow(0, start, b).to(device);
    out.push_back(options.sampler == "ddim"
                      ? ddim_sample(g.net, g.schedule, x, c, options.steps, options.guidance,
                                    options.eta, gen)
                      : ddpm_sample(g.net, g.schedule, x, c, options.guidance, gen));
  }
  return torch::cat(out);
}

torch::Tensor to_sprites(const torch::Tensor& x) {
  auto px = ((x.detach().to(torch::kFloat32).cpu() + 1.0) * 127.5)
                .round()
                .clamp(0, 255)
                .to(torch::kUInt8);
  const auto opaque = px.narrow(1, 3, 1) >= 128;  // (N, 1, S, S)
  px.narrow(1, 3, 1).copy_(opaque.to(torch::kUInt8) * 255);
  px.narrow(1, 0, 3).mul_(opaque.to(torch::kUInt8));
  return px;
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

GeneratorEval evaluate_generator(Generator& g, models::ClassifierImpl& classifier,
                                 const torch::Tensor& training, int64_t count,
                                 const SampleOptions& options) {
  const int64_t k = static_cast<int64_t>(g.class_names.size());
  const auto labels = torch::arange(count, torch::kInt64).remainder(k);  // balanced
  const auto device = g.net->parameters().front().device();
  DeviceTimer timer(device);
  const auto sprites = to_sprites(sample(g, labels, options));  // (N, 4, S, S) uint8, CPU
  GeneratorEval r;
  r.samples = count;
  r.sample_seconds = timer.seconds();
  r.sprites_per_second = static_cast<double>(count) / r.sample_seconds;
  {
    torch::InferenceMode guard;
    classifier.eval();
    const auto logits = classifier.forward(data::to_model_input(sprites.to(device)));
    const auto hit = (logits.argmax(1).cpu() == labels).to(torch::kFloat64);
    r.class_agreement = hit.mean().item<double>();
    for (int64_t c = 0; c < k; ++c)
      r.per_class_agreement.push_back(hit.index({labels == c}).mean().item<double>());
  }
  auto key = [](const torch::Tensor& s) {
    const auto c = s.contiguous();
    return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()),
                       static_cast<size_t>(c.numel()));
  };
  std::unordered_set<std::string> generated, train_keys;
  const auto real =
      to_sprites(training.to(torch::kFloat32) / 127.5 - 1.0);  // same binarisation as samples
  for (int64_t i = 0; i < real.size(0); ++i) train_keys.insert(key(real[i]));
  int64_t copies = 0;
  for (int64_t i = 0; i < count; ++i) {
    const auto k_i = key(sprites[i]);
    generated.insert(k_i);
    copies += train_keys.count(k_i) ? 1 : 0;
  }
  r.distinct = static_cast<double>(generated.size()) / static_cast<double>(count);
  r.exact_copies = static_cast<double>(copies) / static_cast<double>(count);
  return r;
}

}  // namespace spritetorch::diffusion
