#include "train/train_step.h"

#include <algorithm>
#include <optional>

#include "common/compat.h"
#include "common/error.h"
#include "precision/autocast_guard.h"
#include "precision/grad_scaler.h"
#include "train/cpu_mlp_step.h"

namespace spritetorch::train {

AutogradStep::AutogradStep(LossFn loss, StepPrecision precision, bool needs_correct)
    : loss_(std::move(loss)), precision_(std::move(precision)), needs_correct_(needs_correct) {
  if (precision_.plan.grad_scaling && !precision_.scaler)
    throw Error("internal: fp16 step without a grad scaler");
}

bool AutogradStep::set_micro_batches(int64_t count) {
  if (count < 1) throw Error("--micro-batches must be at least 1, got " + std::to_string(count));
  micro_batches_ = count;
  return true;
}

void AutogradStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  const int64_t n = batch.inputs.size(0);
  if (micro_batches_ == 1 || n <= 1) return run_chunk(batch, 1.0, loss_sum, correct);
  const int64_t chunk = (n + micro_batches_ - 1) / micro_batches_;  // ceil: at most the count
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t size = std::min(chunk, n - begin);
    run_chunk({batch.inputs.narrow(0, begin, size), batch.labels.narrow(0, begin, size)},
              static_cast<double>(size) / static_cast<double>(n), loss_sum, correct);
  }
}

void AutogradStep::run_chunk(const data::Batch& batch, double weight, torch::Tensor& loss_sum,
                             torch::Tensor& correct) {
  const auto& plan = precision_.plan;
  StepLoss out;
  {
    // Disabled guard for fp32 (channels_last or scaling alone): the same code path either way.
    precision::AutocastGuard autocast(plan.device_type, plan.compute_dtype, plan.autocast,
                                      precision_.autocast_cache);
    if (precision_.channels_last && batch.inputs.dim() == 4) {
      data::Batch channels_last{batch.inputs.contiguous(torch::MemoryFormat::ChannelsLast),
                                batch.labels};
      out = loss_(channels_last);
    } else {
      out = loss_(batch);
    }
  }
  // A task's own training_step: what the Trainer needs of its result, said in words (LibTorch's
  // would be "grad can be implicitly created only for scalar outputs" and the like). Host-side
  // checks only: no sync.
  if (!out.loss.defined() || out.loss.numel() != 1 || !out.loss.requires_grad() ||
      !out.loss.is_floating_point())
    throw Error(
        "the task's training_step returned " +
            (out.loss.defined()
                 ? "a loss of shape " + c10::str(out.loss.sizes()) + " (" +
                       c10::toString(out.loss.scalar_type()) +
                       (out.loss.requires_grad() ? "" : ", not connected to the parameters") + ")"
                 : std::string("no loss")) +
            "; the Trainer needs one floating-point number that depends on the parameters",
        "return the batch's mean loss, computed from the module's outputs without detach()");
  if (needs_correct_ && !out.correct.defined())
    throw Error(
        "the task's training_step returned no `correct`, but its traits() say it has an accuracy "
        "(TaskTraits::has_accuracy, true by default)",
        "count the batch's correct predictions in `correct`, or return traits() with "
        "has_accuracy = false");
  if (out.correct.defined() && c10::isFloatingType(out.correct.scalar_type()))
    throw Error("the task's training_step returned a floating-point `correct`",
                "count the correct predictions as an integer tensor (or leave it undefined, with "
                "TaskTraits::has_accuracy = false)");
  // A chunk's mean loss, weighted by its share of the batch: the gradients add up to the batch's.
  const torch::Tensor weighted = weight == 1.0 ? out.loss : out.loss * weight;
  if (precision_.scaler)
    precision_.scaler->scale(weighted).backward();
  else
    weighted.backward();
  torch::NoGradGuard no_grad;
  loss_sum.add_(out.loss.detach(), static_cast<double>(batch.inputs.size(0)));
  if (out.correct.defined()) correct.add_(out.correct);
}

LossFn classifier_loss(ForwardFn forward, double label_smoothing) {
  return [forward = std::move(forward), label_smoothing](const data::Batch& batch) {
    StepLoss out;
    auto logits = forward(batch.inputs);  // (B, K); bf16/fp16 under autocast
    {
      // Only inside an autocast scope: a guard costs a cache clear per step otherwise.
      const auto type = batch.inputs.device().type();
      std::optional<precision::AutocastGuard> fp32;
      if (compat::autocast_supported(type) && compat::autocast_enabled(type))
        fp32.emplace(type, torch::kFloat32, /*enabled=*/false);
      out.loss = torch::cross_entropy_loss(logits.to(torch::kFloat32), batch.labels, {},
                                           at::Reduction::Mean, -100, label_smoothing);  // ()
    }
    torch::NoGradGuard no_grad;
    out.correct = logits.argmax(1).eq(batch.labels).sum();
    return out;
  };
}

LossFn classifier_loss(const models::Classifier& model, double label_smoothing) {
  return classifier_loss([model](const torch::Tensor& x) { return model->forward(x); },
                         label_smoothing);
}

FusedMlpStep::FusedMlpStep(std::vector<torch::nn::Linear> layers, int64_t max_batch)
    : layers_(std::move(layers)), max_batch_(max_batch) {
  if (layers_.empty()) throw Error("fused MLP step: no layers");
  const auto options = layers_[0]->weight.options().requires_grad(false);
  for (auto& layer : layers_) {
    if (!layer->weight.grad().defined() || !layer->bias.grad().defined())
      throw Error("fused MLP step: gradients must be allocated first (FlatOptimizer does it)");
    z_.push_back(torch::empty({max_batch, layer->weight.size(0)}, options));
    dz_.push_back(torch::empty({max_batch, layer->weight.size(0)}, options));
  }
  log_probs_ = torch::empty({max_batch, layers_.back()->weight.size(0)}, options);
  minus_ones_ = torch::full({max_batch, 1}, -1.0, options);
  loss_ = torch::zeros({}, options);
  correct_ = torch::zeros({}, options.dtype(torch::kInt64));
}

void FusedMlpStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  torch::NoGradGuard no_grad;
  const int64_t b = batch.labels.size(0);
  if (b > max_batch_) throw Error("fused MLP step: batch larger than its buffers");
  const size_t count = layers_.size();
  if (b == 0) {  // nothing to learn from: zero gradients, nothing added to the sums
    for (auto& layer : layers_) {
      layer->weight.mutable_grad().zero_();
      layer->bias.mutable_grad().zero_();
    }
    return;
  }
  const auto x = batch.inputs.reshape({b, -1});  // (B, in)
  const auto& labels = batch.labels;             // (B)

  // Forward: z_l = a_{l-1} W_l^T + b_l; a_l = relu(z_l), in place (z_l then holds a_l).
  std::vector<torch::Tensor> a(count);  // a[l]: activation leaving layer l, (B, out_l)
  for (size_t l = 0; l < count; ++l) {
    const auto& in = l == 0 ? x : a[l - 1];
    auto z = z_[l].narrow(0, 0, b);
    at::addmm_out(z, layers_[l]->bias, in, layers_[l]->weight.t());
    if (l + 1 < count) z.clamp_min_(0);
    a[l] = z;
  }
  const auto& logits = a.back();  // (B, K)
  auto log_probs = log_probs_.narrow(0, 0, b);
  at::_log_softmax_out(log_probs, logits, 1, false);
  const auto label_column = labels.view({b, 1});
  at::sum_out(loss_, log_probs.gather(1, label_column), at::IntArrayRef{0, 1});
  loss_sum.sub_(loss_);
  at::sum_out(correct_, logits.argmax(1).eq(labels), at::IntArrayRef{0});
  correct.add_(correct_);

  // Backward of the mean cross-entropy: dz_L = (softmax - onehot) / B.
  auto dz = dz_.back().narrow(0, 0, b);
  at::exp_out(dz, log_probs);
  dz.scatter_add_(1, label_column, minus_ones_.narrow(0, 0, b));
  dz.mul_(1.0 / static_cast<double>(b));
  for (size_t l = count; l-- > 0;) {
    const auto& in = l == 0 ? x : a[l - 1];
    at::mm_out(layers_[l]->weight.mutable_grad(), dz.t(), in);  // (out, in): overwritten
    at::sum_out(layers_[l]->bias.mutable_grad(), dz, {0});
    // This layer's gradients are final: a distributed reducer may start on them while the
    // earlier layers are differentiated.
    if (grad_ready_) {
      grad_ready_(layers_[l]->weight);
      grad_ready_(layers_[l]->bias);
    }
    if (l == 0) break;
    auto dz_prev = dz_[l - 1].narrow(0, 0, b);
    at::mm_out(dz_prev, dz, layers_[l]->weight);                // d a_{l-1}
    at::threshold_backward_out(dz_prev, dz_prev, a[l - 1], 0);  // through the ReLU
    dz = dz_prev;
  }
}

std::unique_ptr<TrainStep> make_train_step(const models::Classifier& model, int64_t max_batch,
                                           StepKind kind, int cpu_threads) {
  auto layers = model->relu_mlp_layers();
  if (kind == StepKind::kFused && layers.empty())
    throw Error("--step fused needs a ReLU MLP (ann, simplenn)", "use --step auto");
  if (kind != StepKind::kAutograd && !layers.empty()) {
    if (CpuMlpStep::applies_to(layers))
      return std::make_unique<CpuMlpStep>(layers, max_batch, cpu_threads);
    return std::make_unique<FusedMlpStep>(layers, max_batch);
  }
  return std::make_unique<AutogradStep>(classifier_loss(model));
}

}  // namespace spritetorch::train
