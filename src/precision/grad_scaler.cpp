#include "precision/grad_scaler.h"

#include <cmath>

#include "common/compat.h"
#include "common/error.h"

namespace spritetorch::precision {

GradScaler::GradScaler(torch::Device device, GradScalerOptions options)
    : options_(options), fused_(compat::fused_amp_kernels(device) && !options.force_fallback) {
  if (!(options_.init_scale > 0) || !(options_.growth_factor > 1) ||
      !(options_.backoff_factor > 0 && options_.backoff_factor < 1) ||
      options_.growth_interval <= 0)
    throw Error(
        "grad scaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
        "growth_interval > 0");
  const auto f32 = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  scale_ = torch::full({}, options_.init_scale, f32);
  growth_tracker_ = torch::zeros({}, f32.dtype(torch::kInt32));
  found_inf_ = torch::zeros({1}, f32);
  inv_scale_ = torch::ones({1}, f32);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return loss * scale_.to(loss.scalar_type());
}

void GradScaler::unscale_(torch::Tensor& grads) {
  torch::NoGradGuard no_grad;
  if (grads.scalar_type() != torch::kFloat32)
    throw Error("grad scaler: gradients must be float32 (the flat buffer), found " +
                std::string(c10::toString(grads.scalar_type())));
  // PyTorch's GradScaler takes the reciprocal in double, then rounds to float.
  inv_scale_.copy_(scale_.to(torch::kFloat64).reciprocal().reshape({1}));
  found_inf_.zero_();
  if (fused_) {
    std::vector<torch::Tensor> list{grads};
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_inf_, inv_scale_);
    return;
  }
  // Fallback: one multiply and one reduction over the buffer. inf * x and NaN * x stay non-finite.
  grads.mul_(inv_scale_);
  found_inf_.copy_(grads.isfinite().all().logical_not().reshape({1}));
}

void GradScaler::update() {
  torch::NoGradGuard no_grad;
  if (fused_) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  } else {
    // The same rule as the fused kernel, as tensor ops (no host read):
    //   found_inf: scale *= backoff, tracker = 0
    //   else:      tracker += 1; at growth_interval: scale *= growth (if still finite), tracker = 0
    const auto found = found_inf_.reshape({}).gt(0);  // () bool
    auto tracker = torch::where(found, torch::zeros_like(growth_tracker_), growth_tracker_ + 1);
    const auto grow = tracker.ge(options_.growth_interval);  // () bool
    auto grown = scale_ * options_.growth_factor;
    grown = torch::where(grown.isfinite(), grown, scale_);
    auto next =
        torch::where(found, scale_ * options_.backoff_factor, torch::where(grow, grown, scale_));
    scale_.copy_(next);
    growth_tracker_.copy_(torch::where(grow, torch::zeros_like(tracker), tracker));
  }
}

bool GradScaler::found_inf_host() const { return found_inf_.item<float>() != 0.0f; }
double GradScaler::current_scale() const { return scale_.item<double>(); }
int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

nlohmann::json GradScaler::state() const {
  return {{"scale", current_scale()},
          {"growth_tracker", growth_tracker()},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", options_.growth_interval}};
}

void GradScaler::load_state(const nlohmann::json& state, const std::string& source) {
  double scale = 0;
  int64_t tracker = 0;
  try {
    scale = state.at("scale").get<double>();
    tracker = state.at("growth_tracker").get<int64_t>();
    options_.growth_factor = state.value("growth_factor", options_.growth_factor);
    options_.backoff_factor = state.value("backoff_factor", options_.backoff_factor);
    options_.growth_interval = state.value("growth_interval", options_.growth_interval);
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": grad scaler state: expected {scale, growth_tracker, ...}, found " +
                state.dump() + " (" + e.what() + ")");
  }
  if (!(scale > 0) || !std::isfinite(scale) || tracker < 0)
    throw Error(source +
                ": grad scaler state: expected a positive finite scale and a "
                "non-negative growth_tracker, found " +
                state.dump());
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  found_inf_.zero_();
}

torch::Tensor clip_grad_norm_(torch::Tensor& grads, double max_norm) {
  torch::NoGradGuard no_grad;
  if (!(max_norm > 0)) throw Error("--clip-grad-norm must be positive");
  auto norm = grads.norm(2);                                 // () float32
  auto factor = (max_norm / (norm + 1e-6)).clamp_max_(1.0);  // PyTorch's clip_grad_norm_
  grads.mul_(factor);
  return norm;
}

}  // namespace spritetorch::precision
