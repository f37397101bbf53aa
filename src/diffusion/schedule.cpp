#include "diffusion/schedule.h"

#include <cmath>

#include "common/error.h"

namespace spritetorch::diffusion {

std::string schedule_name(ScheduleKind kind) {
  return kind == ScheduleKind::kCosine ? "cosine" : "linear";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "linear") return ScheduleKind::kLinear;
  if (name == "cosine") return ScheduleKind::kCosine;
  throw Error("unknown noise schedule '" + name + "': expected linear or cosine");
}

NoiseSchedule::NoiseSchedule(int64_t steps, double beta_start, double beta_end) : steps_(steps) {
  if (steps < 1)
    throw Error("a noise schedule needs at least one step, got " + std::to_string(steps));
  if (!(beta_start > 0 && beta_end < 1 && beta_start <= beta_end))
    throw Error("noise schedule betas must satisfy 0 < start <= end < 1");
  set_betas(torch::linspace(beta_start, beta_end, steps, torch::kFloat64));
}

NoiseSchedule::NoiseSchedule(int64_t steps, ScheduleKind kind) : NoiseSchedule(steps) {
  kind_ = kind;
  if (kind == ScheduleKind::kLinear) return;
  constexpr double s = 0.008, pi = 3.14159265358979323846;
  auto f = [&](double u) {
    const double c = std::cos((u / static_cast<double>(steps) + s) / (1.0 + s) * pi / 2.0);
    return c * c;
  };
  std::vector<double> betas;
  for (int64_t t = 0; t < steps; ++t)
    betas.push_back(
        std::min(0.999, 1.0 - f(static_cast<double>(t + 1)) / f(static_cast<double>(t))));
  set_betas(torch::tensor(betas, torch::kFloat64));
}

void NoiseSchedule::set_betas(const torch::Tensor& b) {
  // Computed in float64, stored in float32: abar_T is a long product.
  betas_ = b.to(torch::kFloat32);
  alphas_ = (1.0 - b).to(torch::kFloat32);
  const auto ab = torch::cumprod(1.0 - b, 0);
  alpha_bars_ = ab.to(torch::kFloat32);
  host_betas_.assign(b.data_ptr<double>(), b.data_ptr<double>() + steps_);
  host_alpha_bars_.assign(ab.data_ptr<double>(), ab.data_ptr<double>() + steps_);
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

torch::Tensor NoiseSchedule::velocity(const torch::Tensor& x0, const torch::Tensor& t,
                                      const torch::Tensor& noise) const {
  const auto ab = alpha_bars_.index_select(0, t).view({-1, 1, 1, 1});  // (B, 1, 1, 1)
  return ab.sqrt() * noise - (1.0 - ab).sqrt() * x0;
}

torch::Tensor NoiseSchedule::snr(const torch::Tensor& t) const {
  const auto ab = alpha_bars_.index_select(0, t);  // (B)
  return ab / (1.0 - ab);
}

}  // namespace spritetorch::diffusion
