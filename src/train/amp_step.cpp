#include "train/amp_step.h"

#include "common/error.h"

namespace spritetorch::train {

void AmpAutogradStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  const auto& plan = precision_.plan;
  torch::Tensor logits, loss;
  {
    // Disabled guard for fp32 (channels_last or scaling alone): the same code path either way.
    precision::AutocastGuard autocast(plan.device_type, plan.compute_dtype, plan.autocast,
                                      precision_.autocast_cache);
    auto x = batch.inputs;  // (B, C, H, W) or (B, F) float32, on device
    if (precision_.channels_last && x.dim() == 4) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    logits = model_->forward(x);  // (B, K) bf16/fp16 under autocast
  }
  // The loss in fp32, explicitly: LibTorch 1.13's CPU autocast would run log_softmax in bf16.
  loss = torch::cross_entropy_loss(logits.to(torch::kFloat32), batch.labels);  // ()
  if (precision_.scaler)
    precision_.scaler->scale(loss).backward();
  else
    loss.backward();
  torch::NoGradGuard no_grad;
  loss_sum.add_(loss.detach(), static_cast<double>(batch.labels.size(0)));
  correct.add_(logits.argmax(1).eq(batch.labels).sum());
}

std::unique_ptr<TrainStep> make_precision_train_step(const models::Classifier& model,
                                                     int64_t max_batch, const std::string& kind,
                                                     const StepPrecision& precision, int cpu_threads) {
  const bool plain = !precision.plan.autocast && !precision.scaler && !precision.channels_last;
  if (plain) return make_train_step(model, max_batch, kind, cpu_threads);
  if (kind != "auto" && kind != "autograd" && kind != "fused")
    throw Error("unknown step '" + kind + "': expected auto, autograd or fused");
  if (kind == "fused")
    throw Error("--step fused computes in fp32 only; it cannot be combined with --precision " +
                    precision::to_string(precision.plan.precision),
                "use --step auto (autograd under autocast) or --precision fp32");
  if (precision.plan.grad_scaling && !precision.scaler)
    throw Error("internal: fp16 step without a grad scaler");
  return std::make_unique<AmpAutogradStep>(model, precision);
}

void finish_step(FlatOptimizer& optimizer, precision::GradScaler* scaler, double clip_grad_norm,
                 bool on_device) {
  if (scaler) scaler->unscale_(optimizer.grads());
  if (clip_grad_norm > 0) precision::clip_grad_norm_(optimizer.grads(), clip_grad_norm);
  if (on_device)
    optimizer.step_on_device(scaler ? scaler->found_inf() : torch::Tensor());
  else if (!scaler || !scaler->found_inf_host())
    optimizer.step();
  if (scaler) scaler->update();
}

void apply_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
}

}  // namespace spritetorch::train
