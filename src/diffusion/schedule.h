// The DDPM noise schedule (Ho et al. 2020): betas for T steps and the closed-form forward process
//   q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I),  abar_t = prod_{s <= t} (1 - beta_s),
// with t counted from 0 (the first noising step) to T - 1.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace spritetorch::diffusion {

class NoiseSchedule {
 public:
  // Linear betas from beta_start to beta_end (the DDPM paper's 1e-4 .. 0.02).
  NoiseSchedule(int64_t steps = 500, double beta_start = 1e-4, double beta_end = 0.02);

  int64_t steps() const { return steps_; }
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
  torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& t, const torch::Tensor& noise) const;

 private:
  int64_t steps_;
  torch::Tensor betas_, alphas_, alpha_bars_;
  std::vector<double> host_betas_, host_alpha_bars_;
};

}  // namespace spritetorch::diffusion
