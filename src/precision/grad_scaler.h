// Dynamic loss scaling for fp16 training, the C++ counterpart of torch.amp.GradScaler, shaped for
// spritetorch's flat gradient buffer (train/flat_optimizer.h): unscaling and the inf/NaN check are
// one or two whole-buffer operations instead of one per parameter.
//
// One step, in this order (train/amp_step.h: finish_step does it):
//   scaler.scale(loss).backward();     // grads = scale * dloss/dw, fp32, in the flat buffer
//   scaler.unscale_(grads);            // grads /= scale; found_inf = any inf/NaN among them
//   clip_grad_norm_(grads, max_norm);  // on true (unscaled) gradients
//   optimizer step, skipped when found_inf
//   scaler.update();                   // inf found: scale *= backoff; N clean steps: grow
//
// Everything lives on the device as 0-dim tensors and no method reads a value back to the host,
// except found_inf_host(), current_scale() and state(), which say so.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>

namespace spritetorch::precision {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps before the scale grows
  // Use the plain tensor-op path even where fused AMP kernels exist (tests compare the two).
  bool force_fallback = false;
};

class GradScaler {
 public:
  GradScaler(torch::Device device, GradScalerOptions options = {});

  // loss * scale; loss: () float on the scaler's device.
  torch::Tensor scale(const torch::Tensor& loss) const;
  // grads: a float32 buffer on the scaler's device, modified in place. Sets found_inf().
  void unscale_(torch::Tensor& grads);
  // Backs off or grows the scale from the found_inf of the last unscale_ (reset by the next one).
  void update();

  const torch::Tensor& scale_tensor() const { return scale_; }   // () float32, on device
  const torch::Tensor& found_inf() const { return found_inf_; }  // (1) float32: 1 = inf/NaN seen
  // Host reads (each one a device synchronisation on CUDA).
  bool found_inf_host() const;
  double current_scale() const;
  int64_t growth_tracker() const;
  const GradScalerOptions& options() const { return options_; }
  bool fused() const { return fused_; }

  // For checkpoints: {"scale", "growth_tracker", "growth_factor", "backoff_factor",
  // "growth_interval"}. load_state throws spritetorch::Error naming `source` when malformed.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state, const std::string& source);

 private:
  GradScalerOptions options_;
  bool fused_;           // use _amp_foreach_non_finite_check_and_unscale_ / _amp_update_scale_
  torch::Tensor scale_;  // () float32
  torch::Tensor growth_tracker_;  // () int32: clean steps since the last change
  torch::Tensor found_inf_;       // (1) float32
  torch::Tensor inv_scale_;       // (1) float32
};

// Scales grads (a flat buffer) so that their L2 norm is at most max_norm, without a host read
// (the factor min(1, max_norm / (norm + 1e-6)) is applied on the device). Returns the norm before
// clipping, () float32 on device. Call after GradScaler::unscale_.
torch::Tensor clip_grad_norm_(torch::Tensor& grads, double max_norm);

}  // namespace spritetorch::precision
