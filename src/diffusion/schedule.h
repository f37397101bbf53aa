// The diffusion noise schedule: betas for T steps and the closed-form forward process
//   q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I),  abar_t = prod_{s <= t} (1 - beta_s),
// with t counted from 0 (the first noising step) to T - 1.
//
// Two kinds: the DDPM paper's linear betas (Ho et al. 2020; what generators trained before the
// cosine default used), and the cosine schedule of Nichol & Dhariwal 2021, whose last abar is ~0,
// so that x_T really is the N(0, I) the samplers start from (the linear one at T = 500 keeps
// sqrt(abar_T) = 0.08 of the image).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spritetorch::diffusion {

enum class ScheduleKind { kLinear, kCosine };
std::string schedule_name(ScheduleKind kind);          // "linear" | "cosine"
ScheduleKind parse_schedule(const std::string& name);  // Error for anything else

class NoiseSchedule {
 public:
  // Linear betas from beta_start to beta_end (the DDPM paper's 1e-4 .. 0.02).
  NoiseSchedule(int64_t steps = 500, double beta_start = 1e-4, double beta_end = 0.02);
  // kLinear: as above; kCosine: abar_t = f(t + 1) / f(0), f(u) = cos^2((u / T + s) / (1 + s) pi/2),
  // s = 0.008, betas capped at 0.999 (so abar_{T-1} is ~1e-3 abar_{T-2}, not exactly 0).
  NoiseSchedule(int64_t steps, ScheduleKind kind);

  int64_t steps() const { return steps_; }
  ScheduleKind kind() const { return kind_; }
  // (T) float32, on the device of the last to().
  const torch::Tensor& betas() const { return betas_; }
  const torch::Tensor& alphas() const { return alphas_; }
  const torch::Tensor& alpha_bars() const { return alpha_bars_; }
  // The same in float64 on the host: what the samplers work out their per-step coefficients from,
  // before their loops, without reading anything back from the device.
  const std::vector<double>& host_betas() const { return host_betas_; }
  const std::vector<double>& host_alpha_bars() const { return host_alpha_bars_; }
  void to(torch::Device device);

  // x_t from x_0 in one step. x0, noise: (B, C, H, W) float32; t: (B) int64 in [0, T). Same device.
  torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& t,
                          const torch::Tensor& noise) const;
  // The velocity v = sqrt(abar_t) noise - sqrt(1 - abar_t) x0 (Salimans & Ho 2022). Same shapes.
  torch::Tensor velocity(const torch::Tensor& x0, const torch::Tensor& t,
                         const torch::Tensor& noise) const;
  // The signal-to-noise ratio abar_t / (1 - abar_t): (B) float32 on t's device.
  torch::Tensor snr(const torch::Tensor& t) const;

 private:
  void set_betas(const torch::Tensor& betas);  // (T) float64

  int64_t steps_;
  ScheduleKind kind_ = ScheduleKind::kLinear;
  torch::Tensor betas_, alphas_, alpha_bars_;
  std::vector<double> host_betas_, host_alpha_bars_;
};

}  // namespace spritetorch::diffusion
