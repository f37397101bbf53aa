#include "train/amp_step.h"

#include "common/bf16_gemm.h"
#include "common/error.h"
#include "train/cpu_mlp_step.h"

namespace spritetorch::train {

std::unique_ptr<TrainStep> make_precision_train_step(const models::Classifier& model,
                                                     int64_t max_batch, StepKind kind,
                                                     const StepPrecision& precision,
                                                     int cpu_threads) {
  const bool plain = !precision.plan.autocast && !precision.scaler && !precision.channels_last;
  // A conv net runs channels_last, not plain, even in fp32: make_train_step's refusal of --step
  // fused for it names the reason, the precision does not.
  if (plain || (kind == StepKind::kFused && model->relu_mlp_layers().empty()))
    return make_train_step(model, max_batch, kind, cpu_threads);
  // bf16 on a CPU with AVX512_BF16: the fused step with layer 1 in bf16 (cpu_mlp_step.h), 1.09x
  // the fused fp32 step's speed on Zen 5, where autocast's autograd step is half its speed.
  const auto layers = model->relu_mlp_layers();
  const bool bf16_fused = precision.plan.autocast &&
                          precision.plan.compute_dtype == torch::kBFloat16 && !precision.scaler &&
                          !precision.channels_last && !layers.empty() && bf16::available() &&
                          CpuMlpStep::applies_to(layers);
  if (kind != StepKind::kAutograd && bf16_fused)
    return std::make_unique<CpuMlpStep>(layers, max_batch, cpu_threads, gemm::best_kernel(),
                                        MlpCompute::bf16);
  if (kind == StepKind::kFused)
    throw Error(
        "--step fused computes in fp32, or in bf16 on a CPU with AVX512_BF16; it cannot be "
        "combined with --precision " +
            precision::to_string(precision.plan.precision) + " here",
        "use --step auto (autograd under autocast) or --precision fp32");
  return std::make_unique<AutogradStep>(classifier_loss(model), precision);
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

void apply_contiguous(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.dim() == 4 && !p.is_contiguous()) p.set_data(p.contiguous());
}

}  // namespace spritetorch::train
