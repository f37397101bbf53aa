#include "diffusion/schedule.h"

#include "common/error.h"

namespace spritetorch::diffusion {

NoiseSchedule::NoiseSchedule(int64_t steps, double beta_start, double beta_end) : steps_(steps) {
  if (steps < 1) throw Error("a noise schedule needs at least one step, got " + std::to_string(steps));
  if (!(beta_start > 0 && beta_end < 1 && beta_start <= beta_end))
    throw Error("noise schedule betas must satisfy 0 < start <= end < 1");
  // Computed in float64, stored in float32: abar_T is a long product.
  const auto b = torch::linspace(beta_start, beta_end, steps, torch::kFloat64);
  betas_ = b.to(torch::kFloat32);
  alphas_ = (1.0 - b).to(torch::kFloat32);
  const auto ab = torch::cumprod(1.0 - b, 0);
  alpha_bars_ = ab.to(torch::kFloat32);
  host_betas_.assign(b.data_ptr<double>(), b.data_ptr<double>() + steps);
  host_alpha_bars_.assign(ab.data_ptr<double>(), ab.data_ptr<double>() + steps);
}

void NoiseSchedule::to(torch::Device device) {
  betas_ = betas_.to(device);
  alphas_ = alphas_.to(device);
  alpha_bars_ = alpha_bars_.to(device);
}

torch::Tensor NoiseSchedule::add_noise(const torch::Tensor& x0, const torch::Tensor& t,
                                       const torch::Tensor& noise) const {
  const auto ab = alpha_bars_.index_select(0, t).view({-1, 1, 1, 1});  // (B, 1, 1, 1)
  return ab.sqrt() * x0 + (1.0 - ab).sqrt() * noise;
}

}  // namespace spritetorch::diffusion
