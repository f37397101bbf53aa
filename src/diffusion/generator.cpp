#include "diffusion/generator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_set>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/timer.h"
#include "data/loader.h"
#include "device/device.h"
#include "io/png.h"
#include "train/checkpoint.h"
#include "train/flat_optimizer.h"
#include "train/interrupt.h"
#include "train/optimization.h"
#include "train/run_state.h"

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

// --sample-every sheets: a row of 8 sprites per class, at most 64 sprites in all.
int64_t sheet_per_class(int64_t classes) {
  return std::max<int64_t>(1, std::min<int64_t>(8, 64 / std::max<int64_t>(classes, 1)));
}

// A sheet's worth of sprites from the EMA weights (what a checkpoint would hold), sheet_per_class
// per class, the same starting noise every time so that sheets of successive epochs compare.
// The training weights are put back afterwards; the global RNG is not touched (CPU generator).
torch::Tensor sample_with_ema(UNet& net, const std::vector<torch::Tensor>& params,
                              const std::vector<torch::Tensor>& ema, const NoiseSchedule& schedule,
                              const data::Dataset& train_set) {
  const int64_t classes = train_set.num_classes();
  const int64_t per_class = sheet_per_class(classes);
  std::vector<torch::Tensor> saved;
  torch::Tensor sprites;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      saved.push_back(params[i].detach().clone());
      params[i].detach().copy_(ema[i]);
    }
    net->eval();
    Generator generator;
    generator.net = net;
    generator.schedule = schedule;
    generator.size = train_set.inputs.size(2);
    const auto labels =
        torch::arange(classes, torch::kInt64).repeat_interleave(per_class);  // (K * per_class)
    sprites = to_sprites(sample(generator, labels, SampleOptions{}));
    net->train();
    for (size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(saved[i]);
  }
  return sprites;
}

// A generator checkpoint, not a classifier's (DataError naming `source` otherwise).
void check_generator_task(const train::Checkpoint& c, const std::string& source) {
  if (c.meta.value("task", std::string()) != "generate")
    throw DataError(source, "a generator checkpoint (train --task generate)",
                    "a '" + c.meta.value("model", std::string("?")) + "' classifier checkpoint");
}

// A generator checkpoint holds the EMA weights as its model (what `generate` samples with) and, to
// go on training, the raw weights ("weights/<name>" beside the Adam state in the optimizer map)
// and the run state (epoch, step within it, running loss, RNG: train/run_state.h).
constexpr const char* kRawPrefix = "weights/";

struct GeneratorRun {
  UNet& net;
  train::FlatOptimizer& optimizer;
  std::vector<torch::Tensor>& ema;  // one per parameter, registration order
};

// Puts a checkpoint's raw weights, EMA weights and Adam state into `run`; every name and shape is
// checked (DataError naming `source`). The UNet's shape must match the checkpoint's.
void load_generator_state(const train::Checkpoint& c, const std::string& source,
                          const UNetOptions& options, int64_t size, GeneratorRun run) {
  check_generator_task(c, source);
  const nlohmann::json now = {{"base", options.base}, {"classes", options.classes}, {"size", size}};
  nlohmann::json then;
  try {
    then = {{"base", c.meta.at("unet").at("base")},
            {"classes", c.meta.at("unet").at("classes")},
            {"size", c.meta.at("size")}};
  } catch (const nlohmann::json::exception& e) {
    throw DataError(source, "generator metadata (unet, size)", e.what());
  }
  if (then != now)
    throw Error("--resume " + source + " holds a UNet for " + then.dump() + "; this run builds " +
                    now.dump(),
                "resume with the same --unet-base, --size and dataset");
  std::map<std::string, torch::Tensor> raw;
  for (const auto& [name, t] : c.optimizer)
    if (name.rfind(kRawPrefix, 0) == 0) raw[name.substr(std::strlen(kRawPrefix))] = t;
  if (raw.empty())
    throw DataError(source, "a generator checkpoint with its training state (raw weights, Adam)",
                    "EMA weights only (written before generator runs could be resumed)");
  // The EMA weights go through the net (load_model_state checks every name and shape), then the
  // raw ones take their place there.
  train::load_model_state(*run.net, c.model, source);
  {
    torch::NoGradGuard no_grad;
    const auto params = run.net->parameters();
    for (size_t i = 0; i < params.size(); ++i) run.ema[i].copy_(params[i]);
  }
  train::load_model_state(*run.net, raw, source);
  try {
    run.optimizer.load_state(c.optimizer);
  } catch (const Error& e) {
    throw DataError(source, "the generator's Adam state", e.what());
  }
}

}  // namespace

GeneratorTrainReport train_generator(const train::TrainConfig& config,
                                     train::TrainObserver* observer) {
  train::TrainObserver silent;
  if (!observer) observer = &silent;
  if (config.epochs < 0) throw Error("--epochs must be >= 0");
  if (config.batch_size <= 0) throw Error("--batch-size must be positive");
  const std::string run_base = train::run_checkpoint_base(config);
  train::check_run_outputs(config, run_base);  // before any work
  const torch::Device device = device::pick_device(config.device);
  const train::Optimization optimization = train::optimization_of(config);  // before any work
  // A UNet: convolutions (common/cpu_threads.h).
  const CpuThreads threads =
      apply_cpu_threads(config.threads, config.blas_threads, CpuWork::kConvolutions);
  torch::manual_seed(config.seed);

  const train::Datasets data = train::load_datasets(config);
  const auto& train_set = data.train;
  if (train_set.inputs.dim() != 4 || train_set.inputs.size(1) != 4 ||
      train_set.inputs.size(2) % 4 != 0)
    throw Error("--task generate needs RGBA sprite datasets (N, 4, S, S) with S divisible by 4; '" +
                    config.dataset + "' has samples of shape " + c10::str(train_set.inputs.sizes()),
                "use --dataset sprites, folder:PATH, sheet:FILE or npy:FILE");
  UNetOptions unet_options;
  unet_options.classes = train_set.num_classes();
  if (config.unet_base < 8 || config.unet_base % 8 != 0)
    throw Error("--unet-base must be a positive multiple of 8, got " +
                std::to_string(config.unet_base));
  unet_options.base = config.unet_base;
  UNet net(unet_options);
  net->to(device);
  NoiseSchedule schedule;
  schedule.to(device);
  // Adam (--optimizer) over flat buffers (train/flat_optimizer.h): PyTorch's arithmetic, and a
  // state that checkpoints the same way on LibTorch 1.13 and 2.x.
  train::FlatOptimizer optimizer(net->parameters(), optimization.options);
  // EMA copies of the parameters, on the device.
  std::vector<torch::Tensor> params = net->parameters(), ema;
  for (const auto& p : params) ema.push_back(p.detach().clone());

  GeneratorTrainReport report;
  int64_t start_epoch = 0;
  std::optional<train::RunState> run_state;  // resuming: where the checkpoint stopped
  if (!config.resume.empty()) {
    const train::Checkpoint c = train::load_checkpoint(config.resume);
    train::check_resumed_optimizer(c, config.resume, config);
    load_generator_state(c, config.resume, unet_options, train_set.inputs.size(2),
                         {net, optimizer, ema});
    start_epoch = c.meta.value("epoch", int64_t{0});
    report.steps = c.meta.value("steps", int64_t{0});
    run_state = train::load_run_state(c, device, config.resume);
    if (run_state && run_state->step > 0) train::check_mid_run_resume(config, c, *run_state);
  }

  int64_t parameters = 0;
  for (const auto& p : params) parameters += p.numel();
  report.device = device::display_name(device);
  report.class_names = train_set.class_names;
  report.settings = {
      {"device", report.device},
      {"task", "generate (DDPM, classifier-free guidance p=" +
                   std::to_string(kClassDropout).substr(0, 4) + ")"},
      {"model", "unet base " + std::to_string(unet_options.base) + " (" +
                    std::to_string(parameters) + " parameters)"},
      {"dataset", train_set.name + " (" + std::to_string(train_set.size()) + " train, " +
                      std::to_string(train_set.num_classes()) + " classes)"},
      {"schedule", "linear betas, T = " + std::to_string(schedule.steps())},
      {"batch", std::to_string(config.batch_size)},
      {"epochs", std::to_string(config.epochs) +
                     (start_epoch ? " (resuming after " + std::to_string(start_epoch) + ")" : "")},
      {"optimizer",
       optimization.describe() + " (flat buffers), EMA " + std::to_string(kEmaDecay).substr(0, 5)},
      {"seed", std::to_string(config.seed)},
      {"threads", describe_cpu_threads(threads)},
  };
  observer->on_start(report.device, report.settings);

  data::ResidentLoader loader(
      train_set, device, {config.batch_size, /*shuffle=*/true, /*drop_last=*/true, config.seed});
  const auto on_device = torch::TensorOptions().device(device);
  const int64_t steps_per_epoch = loader.batches_per_epoch();
  std::optional<torch::Tensor> palette;  // for --palette auto, from the training sprites, once
  // Every checkpoint of the run: the final one and the periodic / interrupt ones. `rs`: where the
  // run stands (its RNG is captured here).
  auto make_checkpoint = [&](train::RunState rs) {
    if (!palette) palette = kmeans_palette(train_set.inputs, kPaletteColours, config.seed);
    nlohmann::json palette_json = nlohmann::json::array();
    for (int64_t k = 0; k < palette->size(0); ++k)
      palette_json.push_back({(*palette)[k][0].item<int>(), (*palette)[k][1].item<int>(),
                              (*palette)[k][2].item<int>()});
    train::Checkpoint checkpoint;
    checkpoint.meta = {
        {"task", "generate"},
        {"model", "unet"},
        {"unet",
         {{"channels", unet_options.channels},
          {"base", unet_options.base},
          {"classes", unet_options.classes},
          {"embed", unet_options.embed}}},
        {"schedule_steps", schedule.steps()},
        {"size", train_set.inputs.size(2)},
        {"class_names", train_set.class_names},
        {"dataset", config.dataset},
        {"sprites", data::sprite_options_json(config.sprites)},
        {"palette", palette_json},
        {"epoch", rs.epoch},
        {"steps", report.steps},
        {"seed", config.seed},
        {"batch_size", config.batch_size},
        {"train_seconds", report.train_seconds},
        {"spritetorch_version", SPRITETORCH_VERSION},
    };
    // The raw weights go beside the Adam state; the model is the net's state with the EMA weights
    // in place of its parameters.
    checkpoint.meta.update(optimization.meta(config.lr_schedule));
    checkpoint.model = train::model_state(*net);
    checkpoint.optimizer = optimizer.state();
    for (const auto& [name, t] : checkpoint.model) checkpoint.optimizer[kRawPrefix + name] = t;
    size_t i = 0;
    for (const auto& p : net->named_parameters())
      checkpoint.model[p.key()] = ema[i++].detach().cpu();
    train::capture_rng(rs, device);
    train::store_run_state(rs, checkpoint);
    return checkpoint;
  };
  auto zero = [&](torch::ScalarType type) { return torch::zeros({}, on_device.dtype(type)); };

  if (run_state) train::restore_rng(*run_state, device, config.resume);
  // From here a SIGINT/SIGTERM stops after the current step with a checkpoint (train/interrupt.h).
  train::InterruptGuard interrupt_guard;
  DeviceTimer total(device);
  for (int64_t epoch = start_epoch; epoch < config.epochs; ++epoch) {
    net->train();
    DeviceTimer epoch_timer(device);
    auto loss_sum = zero(torch::kFloat32);  // summed per-step mean losses of the logged intervals
    auto interval = zero(torch::kFloat32);  // the same since the last log
    int64_t step = 0;
    loader.start_epoch(epoch);
    data::Batch batch;
    if (run_state && run_state->epoch == epoch) {  // resuming mid-epoch: skip the batches done
      loss_sum = run_state->loss_sum, interval = run_state->interval_loss;
      for (; step < run_state->step; ++step)
        if (!loader.next(batch))
          throw DataError(config.resume,
                          "at most " + std::to_string(steps_per_epoch) + " steps per epoch",
                          "step " + std::to_string(run_state->step));
    }
    run_state.reset();
    // Steps since the last log (logs fall on multiples of --log-every, so a resumed run knows it).
    auto interval_steps = [&] { return config.log_every > 0 ? step % config.log_every : step; };
    while (loader.next(batch)) {
      const auto x0 = batch.inputs * 2.0 - 1.0;  // (B, 4, S, S) in [-1, 1]
      const int64_t b = x0.size(0);
      const auto t = torch::randint(schedule.steps(), {b}, on_device.dtype(torch::kInt64));
      const auto noise = torch::randn_like(x0);
      const auto drop = torch::rand({b}, on_device) < kClassDropout;
      const auto c =
          torch::where(drop, torch::full_like(batch.labels, unet_options.classes), batch.labels);
      const auto loss =
          torch::mse_loss(net->forward(schedule.add_noise(x0, t, noise), t, c), noise);
      optimizer.zero_grad();
      loss.backward();
      optimization.set_step_lr(optimizer, epoch * steps_per_epoch + step, steps_per_epoch,
                               config.epochs);
      optimizer.step();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i)
          ema[i].mul_(kEmaDecay).add_(params[i].detach(), 1.0 - kEmaDecay);
        interval += loss.detach();
      }
      ++step;
      ++report.steps;
      observer->on_step(
          {epoch + 1, config.epochs, step, steps_per_epoch, step * config.batch_size});
      if (config.log_every > 0 && step % config.log_every == 0) {
        const double mean = interval.item<double>() / static_cast<double>(config.log_every);
        if (!std::isfinite(mean))
          throw Error("generator training diverged (loss " + std::to_string(mean) + ")",
                      "lower --lr");
        observer->on_log({epoch + 1, step, steps_per_epoch, mean, optimizer.options().lr});
        loss_sum += interval;
        interval.zero_();
      }
      const int signal = train::interrupt_signal();
      const int64_t global_step = epoch * steps_per_epoch + step;
      if (signal || (config.checkpoint_every > 0 && global_step % config.checkpoint_every == 0)) {
        if (!std::isfinite(interval.item<double>()))
          throw Error("generator training diverged in epoch " + std::to_string(epoch + 1) +
                          " at or before step " + std::to_string(step) + "; no checkpoint written",
                      "lower --lr");
        train::RunState rs{epoch,
                           step,
                           step * config.batch_size,
                           interval_steps() * config.batch_size,
                           loss_sum,
                           zero(torch::kInt64),
                           interval,
                           {},
                           {}};
        const std::string path = train::periodic_checkpoint_path(run_base, global_step);
        train::save_checkpoint(path, make_checkpoint(rs));
        train::prune_periodic_checkpoints(run_base, config.keep_last);
        if (signal) throw train::Interrupted(signal, path, epoch + 1, step);
      }
    }
    loss_sum += interval;
    train::EpochReport er;
    er.epoch = epoch + 1;
    er.epochs = config.epochs;
    er.has_accuracy = false;
    er.samples = step * config.batch_size;
    er.loss = loss_sum.item<double>() / static_cast<double>(std::max<int64_t>(step, 1));
    er.seconds = epoch_timer.seconds();
    er.images_per_second = static_cast<double>(er.samples) / er.seconds;
    if (!std::isfinite(er.loss))
      throw Error("generator training diverged in epoch " + std::to_string(er.epoch), "lower --lr");
    report.final_loss = er.loss;
    observer->on_epoch(er);
    const bool last_epoch = epoch + 1 == config.epochs;
    if (config.sample_every > 0 && (last_epoch || (epoch + 1) % config.sample_every == 0)) {
      DeviceTimer sample_timer(device);
      observer->on_samples(epoch + 1, sample_with_ema(net, params, ema, schedule, train_set),
                           sheet_per_class(train_set.num_classes()));
      report.sample_seconds += sample_timer.seconds();
    }
  }
  report.train_seconds = total.seconds() - report.sample_seconds;

  if (!config.save.empty()) {
    const int64_t done = std::max(config.epochs, start_epoch);
    train::save_checkpoint(config.save, make_checkpoint({done,
                                                         0,
                                                         0,
                                                         0,
                                                         zero(torch::kFloat32),
                                                         zero(torch::kInt64),
                                                         zero(torch::kFloat32),
                                                         {},
                                                         {}}));
  }
  return report;
}

Generator load_generator(const std::string& path, torch::Device device) {
  const train::Checkpoint checkpoint = train::load_checkpoint(path);
  check_generator_task(checkpoint, path);
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

namespace {

// One reverse step from t to t_prev as both samplers take it (Song et al. 2021, eq. 12, with
// DDPM's posterior as the eta = 1, all-steps case):
//   x0_hat = clip(x_t / sqrt(abar_t) - sqrt(1 / abar_t - 1) eps, -1, 1)
//   x_prev = c_x0 x0_hat + c_x x_t + sigma z
// The coefficients are plain doubles, worked out on the host before the loop (no per-step sync).
struct ReverseStep {
  int64_t t = 0;
  double recip_sqrt_ab = 0;     // 1 / sqrt(abar_t)
  double recipm1_sqrt_ab = 0;   // sqrt(1 / abar_t - 1)
  double c_x0 = 0, c_x = 0, sigma = 0;
};

// The shared loop. x: (B, C, H, W) x_T; steps in order T - 1 .. 0. Noise for sigma > 0 is drawn on
// the CPU from `gen` (a seed gives the same sprites on every device) and copied without a sync.
torch::Tensor reverse_loop(const EpsModel& eps_model, torch::Tensor x,
                           const std::vector<ReverseStep>& steps, std::optional<at::Generator> gen) {
  torch::NoGradGuard no_grad;
  const int64_t b = x.size(0);
  std::vector<int64_t> ts;
  for (const auto& s : steps) ts.push_back(s.t);
  // (steps) int64 on x's device, copied once; each step's (B) t is a view of it.
  const auto t_all = torch::tensor(ts, torch::kInt64).to(x.device());
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    const auto eps = eps_model(x, t_all.select(0, static_cast<int64_t>(i)).expand({b}));
    // Clipping keeps x0_hat in the data's range; the update then uses the eps implied by the
    // clipped x0_hat (folded into c_x0 / c_x), which keeps it on the DDIM / posterior path.
    const auto x0 = (s.recip_sqrt_ab * x - s.recipm1_sqrt_ab * eps).clamp(-1.0, 1.0);
    x = s.c_x0 * x0 + s.c_x * x;
    if (s.sigma > 0) {
      auto z = at::randn(x.sizes(), *gen, torch::kFloat32);
      if (x.is_cuda()) z = z.pin_memory();  // pinned: the copy below does not block the host
      x = x + s.sigma * z.to(x.device(), /*non_blocking=*/true);
    }
  }
  return x.clamp(-1.0, 1.0);
}

}  // namespace

std::vector<int64_t> ddim_timesteps(int64_t T, int64_t steps) {
  steps = std::clamp<int64_t>(steps, 1, T);
  std::vector<int64_t> out;
  // Evenly spaced from T - 1 down to 0, both included; distinct since steps <= T.
  for (int64_t i = 0; i < steps; ++i)
    out.push_back(steps == 1 ? T - 1 : ((T - 1) * (steps - 1 - i)) / (steps - 1));
  return out;
}

torch::Tensor ddim_sample_eps(const EpsModel& eps_model, const NoiseSchedule& schedule,
                              torch::Tensor x, int64_t steps, double eta,
                              std::optional<at::Generator> gen) {
  if (!(eta >= 0)) throw Error("DDIM eta must be >= 0, got " + std::to_string(eta));
  if (eta > 0 && !gen) throw Error("DDIM with eta > 0 needs a generator for its noise");
  const auto& ab = schedule.host_alpha_bars();
  const auto ts = ddim_timesteps(schedule.steps(), steps);
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
    plan.push_back({t, 1.0 / std::sqrt(a), std::sqrt(1.0 / a - 1.0),
                    std::sqrt(a_prev) - dir * std::sqrt(a), dir, sigma});
  }
  return reverse_loop(eps_model, std::move(x), plan, eta > 0 ? gen : std::nullopt);
}

torch::Tensor ddpm_sample_eps(const EpsModel& eps_model, const NoiseSchedule& schedule,
                              torch::Tensor x, at::Generator gen) {
  const auto& ab = schedule.host_alpha_bars();
  const auto& betas = schedule.host_betas();
  std::vector<ReverseStep> plan;
  for (int64_t t = schedule.steps() - 1; t >= 0; --t) {
    const double a = ab[t], a_prev = t > 0 ? ab[t - 1] : 1.0, beta = betas[t];
    // Ho et al. eq. 7: the posterior q(x_{t-1} | x_t, x0) at the clipped x0_hat, with its own
    // variance beta~_t = beta_t (1 - a_prev) / (1 - a) (0 at t = 0: the last step adds no noise).
    plan.push_back({t, 1.0 / std::sqrt(a), std::sqrt(1.0 / a - 1.0),
                    std::sqrt(a_prev) * beta / (1.0 - a),
                    std::sqrt(1.0 - beta) * (1.0 - a_prev) / (1.0 - a),
                    std::sqrt(beta * (1.0 - a_prev) / (1.0 - a))});
  }
  return reverse_loop(eps_model, std::move(x), plan, gen);
}

torch::Tensor ddim_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, int64_t steps, double guidance, double eta,
                          std::optional<at::Generator> gen) {
  return ddim_sample_eps(
      [&](const torch::Tensor& xt, const torch::Tensor& t) {
        return guided_eps(net, xt, t, c, guidance);
      },
      schedule, std::move(x), steps, eta, std::move(gen));
}

torch::Tensor ddpm_sample(UNet& net, const NoiseSchedule& schedule, torch::Tensor x,
                          const torch::Tensor& c, double guidance, at::Generator gen) {
  return ddpm_sample_eps(
      [&](const torch::Tensor& xt, const torch::Tensor& t) {
        return guided_eps(net, xt, t, c, guidance);
      },
      schedule, std::move(x), std::move(gen));
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
