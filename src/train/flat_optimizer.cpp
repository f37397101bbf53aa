#include "train/flat_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/notes.h"
#include "train/adam_kernels.h"
#include "train/sgd_kernel.h"

namespace spritetorch::train {

namespace {

// aten::_fused_adam_ / _fused_adamw_, overload "tensor_lr" (PyTorch 2.2 on): the whole Adam(W)
// update in one multi-tensor kernel that reads the lr, the step count and found_inf on the device,
// as torch.optim.Adam(fused=True) runs it, where the tensor-op form takes some twenty kernels.
// Looked up by name at run time, so the same source builds against LibTorch 1.13, which has no
// such operator; taken only for float32 buffers on CUDA, where the operator has a kernel and its
// arguments are the ones step_on_device() passes, in that order.
std::optional<c10::OperatorHandle> find_fused_adam(const std::string& kind,
                                                   const torch::Tensor& values) {
  if (kind == "sgd" || !values.is_cuda() || values.scalar_type() != torch::kFloat32) return {};
  const auto op = c10::Dispatcher::singleton().findSchema(
      {kind == "adamw" ? "aten::_fused_adamw_" : "aten::_fused_adam_", "tensor_lr"});
  if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CUDA)) return {};
  static const std::vector<std::string> kArguments = {
      "self",        "grads",   "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs",
      "state_steps", "lr",      "beta1",    "beta2",       "weight_decay",
      "eps",         "amsgrad", "maximize", "grad_scale",  "found_inf"};
  const auto& arguments = op->schema().arguments();
  if (arguments.size() != kArguments.size()) return {};
  for (size_t i = 0; i < arguments.size(); ++i)
    if (arguments[i].name() != kArguments[i]) return {};
  return *op;
}

}  // namespace

// The kernel gives each tensor of its lists its own thread blocks, one per 65,536 elements, so one
// flat buffer of the seed MLP's 109k parameters ran on 2 blocks of the H200's 132 SMs and its
// graphed step took 0.165 ms against the tensor ops' 0.159; over 36 views, 0.130 (8 views: 0.139;
// docs/benchmarks.md). One view per 1,024 elements (smaller ones would add blocks with little work
// each), at most 36: the most tensors the kernel takes in one launch for Adam's four lists.
std::vector<torch::Tensor> fused_adam_views(const torch::Tensor& flat) {
  const int64_t n = flat.numel();
  const int64_t pieces = std::clamp<int64_t>((n + 1023) / 1024, 1, 36);
  const int64_t size = (n + pieces - 1) / pieces;
  std::vector<torch::Tensor> views;
  for (int64_t begin = 0; begin < n; begin += size)
    views.push_back(flat.narrow(0, begin, std::min(size, n - begin)));
  return views;
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> kNames = {"adam", "adamw", "sgd"};
  return kNames;
}

double default_weight_decay(const std::string& kind) { return kind == "adamw" ? 0.01 : 0.0; }

void check_optimizer_options(const OptimizerOptions& options) {
  const auto& kinds = optimizer_names();
  if (std::find(kinds.begin(), kinds.end(), options.kind) == kinds.end())
    throw Error("unknown optimizer '" + options.kind + "': expected adam, adamw or sgd");
  // The update runs in float: a value beyond float's range would become infinity at the first
  // step, and the run would diverge with a message about the loss rather than the option.
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  if (!(options.lr > 0 && options.lr <= kFloatMax))
    throw Error("--lr must be a number > 0 and at most 3.4e38 (float's range), got " +
                c10::str(options.lr));
  if (!(options.weight_decay >= 0 && options.weight_decay <= kFloatMax))
    throw Error("--weight-decay must be a number >= 0 and at most 3.4e38 (float's range), got " +
                c10::str(options.weight_decay));
}

FlatOptimizer::FlatOptimizer(const std::vector<torch::Tensor>& parameters, OptimizerOptions options)
    : options_(std::move(options)) {
  check_optimizer_options(options_);
  if (parameters.empty()) throw Error("the model has no parameters to optimise");

  int64_t total = 0;
  for (const auto& p : parameters) {
    if (p.scalar_type() != parameters[0].scalar_type() || p.device() != parameters[0].device())
      throw Error("flat optimizer: all parameters must share one dtype and device");
    total += p.numel();
  }
  const auto opts = parameters[0].options().requires_grad(false);
  values_ = torch::empty({total}, opts);
  grads_ = torch::zeros({total}, opts);
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto p : parameters) {
    const int64_t n = p.numel();
    // A dense parameter in another memory format (channels_last conv weights) keeps its strides.
    const bool dense = p.is_non_overlapping_and_dense();
    auto as_param = [&](const torch::Tensor& flat) {
      auto chunk = flat.narrow(0, offset, n);
      return dense ? chunk.as_strided(p.sizes(), p.strides()) : chunk.view(p.sizes());
    };
    auto value_view = as_param(values_);
    value_view.copy_(p);
    p.set_data(value_view);
    // Autograd accumulates into a defined .grad in place, so backward writes straight into grads_.
    p.mutable_grad() = as_param(grads_);
    offset += n;
  }
  exp_avg_ = torch::zeros({total}, opts);
  if (options_.kind != "sgd") exp_avg_sq_ = torch::zeros({total}, opts);
}

void FlatOptimizer::step() {
  torch::NoGradGuard no_grad;
  if (step_t_.defined()) {  // back from step_on_device(): one read to resume counting on the host
    steps_ = steps_taken();
    step_t_ = torch::Tensor();
  }
  ++steps_;
  if (options_.kind != "sgd")
    adam_step();
  else
    sgd_step();
}

int64_t FlatOptimizer::steps_taken() const {
  return step_t_.defined() ? static_cast<int64_t>(step_t_.item<double>()) : steps_;
}

void FlatOptimizer::set_lr(double lr) {
  if (lr_t_.defined() && lr != options_.lr) {
    torch::NoGradGuard no_grad;
    lr_t_.fill_(lr);
  }
  options_.lr = lr;
}

void FlatOptimizer::step_on_device(const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  if (!step_t_.defined()) {
    step_t_ = torch::full({}, static_cast<double>(steps_), values_.options());
    fused_adam_ = find_fused_adam(options_.kind, values_);
    // The kernel's tensor lists, made once: views of the four buffers, then the step count once
    // per view (the same tensor; the kernel only reads it). A step would otherwise cut 144 views.
    fused_lists_.clear();
    if (fused_adam_) {
      for (const auto& buffer : {values_, grads_, exp_avg_, exp_avg_sq_})
        fused_lists_.push_back(fused_adam_views(buffer));
      fused_lists_.emplace_back(fused_lists_.front().size(), step_t_);
    }
  }
  if (!lr_t_.defined()) lr_t_ = torch::full({}, options_.lr, values_.options());
  if (fused_adam_) {
    // The kernel reads the incremented count for its bias corrections and, where found_inf is 1,
    // changes nothing; the count then goes back (torch.optim.Adam's fused path does the same).
    step_t_.add_(1.0);
    torch::jit::Stack stack;
    for (size_t i = 0; i < 4; ++i) stack.emplace_back(c10::List<at::Tensor>(fused_lists_[i]));
    stack.emplace_back(c10::List<at::Tensor>());                 // max_exp_avg_sqs: no amsgrad
    stack.emplace_back(c10::List<at::Tensor>(fused_lists_[4]));  // state_steps
    stack.emplace_back(lr_t_);
    for (const double scalar :
         {options_.beta1, options_.beta2, options_.weight_decay, options_.eps})
      stack.emplace_back(scalar);
    stack.emplace_back(false);  // amsgrad
    stack.emplace_back(false);  // maximize
    stack.emplace_back();       // grad_scale: the scaler has unscaled the gradients already
    stack.emplace_back(found_inf.defined() ? c10::IValue(found_inf.reshape({1})) : c10::IValue());
    try {
      fused_adam_->callBoxed(&stack);
      if (found_inf.defined()) step_t_.sub_(found_inf.reshape({}));
      return;
    } catch (const c10::Error& e) {
      // A kernel that refuses these buffers (its checks run before it launches, so nothing
      // changed): the tensor-op form below, from now on. The first step_on_device() runs eagerly
      // (CUDA graphs capture a later one), so a refusal never happens inside a capture.
      step_t_.sub_(1.0);
      fused_adam_.reset();
      fused_lists_.clear();
      note("PyTorch's fused Adam kernel refused the optimizer's buffers (" +
           first_line(e.what_without_backtrace()) + "); the step runs as tensor ops");
    }
  }
  // keep: () 1 = take the step, 0 = skip it. Multiplying every change by keep skips without a
  // branch.
  torch::Tensor keep;
  if (found_inf.defined()) {
    keep = found_inf.reshape({}).eq(0).to(values_.scalar_type());
    grads_.nan_to_num_(0.0, 0.0, 0.0);  // a skipped step's inf/NaN must not reach the moments
  } else {
    keep = torch::ones({}, values_.options());
  }
  step_t_.add_(keep);
  const double wd = options_.weight_decay;
  // adam, sgd: L2 weight decay enters the gradient; adamw: decoupled, p *= 1 - keep lr wd.
  const bool l2 = wd != 0.0 && options_.kind != "adamw";
  const torch::Tensor grads = l2 ? grads_.add(values_, wd) : grads_;
  // The lr is read from lr_t_, never from options_.lr: a captured graph keeps following set_lr().
  if (wd != 0.0 && !l2) values_.mul_(1.0 - keep * lr_t_ * wd);
  if (options_.kind != "sgd") {
    const double b1 = options_.beta1, b2 = options_.beta2;
    // m += keep (1 - b1) (g - m);  v += keep (1 - b2) (g^2 - v)   (torch.optim.Adam's lerp form)
    exp_avg_.lerp_(grads, keep * (1.0 - b1));
    exp_avg_sq_.lerp_(grads.square(), keep * (1.0 - b2));
    // Bias corrections from the device step count; clamped so a skipped first step divides by
    // something nonzero (its update is multiplied by keep = 0 anyway).
    auto bias1 = (1.0 - torch::pow(b1, step_t_)).clamp_min_(1e-30);
    auto bias2_sqrt = (1.0 - torch::pow(b2, step_t_)).sqrt_().clamp_min_(1e-30);
    auto denom = (exp_avg_sq_.sqrt() / bias2_sqrt).add_(options_.eps);
    auto step_size = -(keep * lr_t_) / bias1;  // ()
    values_.addcmul_(exp_avg_ / denom, step_size);
    return;
  }
  if (options_.momentum != 0.0) {
    // buf = momentum * buf + g (buf starts at zero, so the first step gives buf = g as in PyTorch);
    // skipped: buf unchanged. buf * (1 - keep (1 - momentum)) + keep * g does both.
    exp_avg_.mul_(1.0 - keep * (1.0 - options_.momentum)).addcmul_(grads, keep);
    values_.addcmul_(exp_avg_, keep * lr_t_, -1.0);
  } else {
    values_.addcmul_(grads, keep * lr_t_, -1.0);
  }
}

void FlatOptimizer::over_threads(const std::function<void(int64_t, int64_t)>& update) const {
  const int64_t n = values_.numel();
  if (!pool_ || pool_->size() == 1) return update(0, n);
  const int parts = pool_->size();
  pool_->run([&](int t) {
    if (!ranges_.empty()) {
      for (const auto& [begin, end] : ranges_[t]) update(begin, end);
      return;
    }
    const FloatRange range = shard_floats_by_lines(n, t, parts);
    update(range.begin, range.end);
  });
}

bool FlatOptimizer::use_thread_shares(const ParameterShares& shares) {
  ranges_.clear();
  if (!pool_ || static_cast<int>(shares.size()) != pool_->size() || !values_.is_cpu() ||
      values_.scalar_type() != torch::kFloat32)
    return false;
  const float* base = values_.data_ptr<float>();
  const int64_t n = values_.numel();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(shares.size());
  std::vector<std::pair<int64_t, int64_t>> all;
  for (size_t t = 0; t < shares.size(); ++t)
    for (const auto& share : shares[t]) {
      const auto& p = share.parameter;
      if (!p.defined() || !p.is_cpu() || p.scalar_type() != torch::kFloat32 || !p.is_contiguous() ||
          share.begin < 0 || share.begin > share.end || share.end > p.numel())
        return false;
      // Where the parameter's view starts in the buffer, compared as addresses: a tensor outside
      // it is a different allocation, which pointer arithmetic may not reach.
      const auto at = reinterpret_cast<std::uintptr_t>(p.data_ptr<float>());
      const auto from = reinterpret_cast<std::uintptr_t>(base);
      if (at < from || (at - from) % sizeof(float) != 0) return false;
      const auto offset = static_cast<int64_t>((at - from) / sizeof(float));
      if (offset + p.numel() > n) return false;
      if (share.begin == share.end) continue;
      ranges[t].emplace_back(offset + share.begin, offset + share.end);
      all.emplace_back(offset + share.begin, offset + share.end);
    }
  // Every element exactly once: sorted, the ranges must tile [0, n).
  std::sort(all.begin(), all.end());
  int64_t covered = 0;
  for (const auto& [begin, end] : all) {
    if (begin != covered) return false;
    covered = end;
  }
  if (covered != n) return false;
  ranges_ = std::move(ranges);
  return true;
}

void FlatOptimizer::adam_step() {
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(steps_)));
  const double step_size = options_.lr / bias1;
  const bool adamw = options_.kind == "adamw";
  const double wd = options_.weight_decay;

  if (values_.is_cpu() && values_.scalar_type() == torch::kFloat32) {
    AdamScalars k;
    k.b1 = static_cast<float>(b1);
    k.b2 = static_cast<float>(b2);
    k.one_minus_b1 = static_cast<float>(1.0 - b1);
    k.one_minus_b2 = static_cast<float>(1.0 - b2);
    k.inv_bias2_sqrt = static_cast<float>(1.0 / bias2_sqrt);
    k.eps = static_cast<float>(options_.eps);
    k.neg_step = static_cast<float>(-step_size);
    k.l2 = adamw ? 0.0f : static_cast<float>(wd);
    k.decay = adamw ? static_cast<float>(1.0 - options_.lr * wd) : 1.0f;
    float* p = values_.data_ptr<float>();
    const float* g = grads_.data_ptr<float>();
    float* m = exp_avg_.data_ptr<float>();
    float* v = exp_avg_sq_.data_ptr<float>();
    over_threads([&](int64_t begin, int64_t end) { adam_update(p, g, m, v, begin, end, k); });
    return;
  }
  // Any other device: five whole-buffer kernels, the same arithmetic.
  const torch::Tensor grads = wd != 0.0 && !adamw ? grads_.add(values_, wd) : grads_;
  if (wd != 0.0 && adamw) values_.mul_(1.0 - options_.lr * wd);
  exp_avg_.mul_(b1).add_(grads, 1.0 - b1);
  exp_avg_sq_.mul_(b2).addcmul_(grads, grads, 1.0 - b2);
  auto denom = (exp_avg_sq_.sqrt() / bias2_sqrt).add_(options_.eps);
  values_.addcdiv_(exp_avg_, denom, -step_size);
}

void FlatOptimizer::sgd_step() {
  const double wd = options_.weight_decay;
  if (values_.is_cpu() && values_.scalar_type() == torch::kFloat32) {
    const SgdScalars k{static_cast<float>(options_.lr), static_cast<float>(options_.momentum),
                       static_cast<float>(wd), steps_ == 1};
    float* p = values_.data_ptr<float>();
    const float* g = grads_.data_ptr<float>();
    float* buf = options_.momentum != 0.0 ? exp_avg_.data_ptr<float>() : nullptr;
    over_threads([&](int64_t begin, int64_t end) { sgd_update(p, g, buf, begin, end, k); });
    return;
  }
  // Any other device: whole-buffer ops, the same arithmetic.
  const torch::Tensor grads = wd != 0.0 ? grads_.add(values_, wd) : grads_;  // L2, as PyTorch's SGD
  if (options_.momentum == 0.0) {
    values_.add_(grads, -options_.lr);
    return;
  }
  // PyTorch's SGD: the buffer starts as the first gradient, then buf = momentum * buf + grad.
  if (steps_ == 1)
    exp_avg_.copy_(grads);
  else
    exp_avg_.mul_(options_.momentum).add_(grads);
  values_.add_(exp_avg_, -options_.lr);
}

std::map<std::string, torch::Tensor> FlatOptimizer::state() const {
  std::map<std::string, torch::Tensor> out;
  out["step"] = torch::tensor({steps_taken()}, torch::kInt64);
  out["exp_avg"] = exp_avg_.cpu();
  if (exp_avg_sq_.defined()) out["exp_avg_sq"] = exp_avg_sq_.cpu();
  return out;
}

void FlatOptimizer::load_state(const std::map<std::string, torch::Tensor>& state) {
  auto take = [&](const std::string& key, torch::Tensor& into) {
    auto it = state.find(key);
    if (it == state.end()) throw Error("optimizer state lacks '" + key + "'");
    if (it->second.numel() != into.numel())
      throw Error("optimizer state '" + key + "' has " + std::to_string(it->second.numel()) +
                  " values; this model needs " + std::to_string(into.numel()));
    torch::NoGradGuard no_grad;
    into.copy_(it->second.view(into.sizes()));
  };
  auto step_it = state.find("step");
  if (step_it == state.end() || step_it->second.numel() != 1)
    throw Error("optimizer state lacks 'step'");
  steps_ = step_it->second.item<int64_t>();
  if (step_t_.defined()) step_t_.fill_(static_cast<double>(steps_));
  take("exp_avg", exp_avg_);
  if (exp_avg_sq_.defined()) take("exp_avg_sq", exp_avg_sq_);
}

}  // namespace spritetorch::train
