#include "train/cpu_mlp_step.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/flush_subnormals.h"
#include "common/small_gemm.h"
#include "train/softmax_loss.h"

namespace spritetorch::train {

namespace {

// [begin, end) of part `t` when `n` items are split into `parts` nearly equal ranges.
struct Range {
  int begin, end;
  int size() const { return end - begin; }
};
Range split(int64_t n, int t, int parts) {
  return {static_cast<int>(n * t / parts), static_cast<int>(n * (t + 1) / parts)};
}
// The same on 16-float (64-byte) boundaries, so that no two threads write one cache line.
Range split_by_lines(int64_t n, int t, int parts) {
  const FloatRange r = shard_floats_by_lines(n, t, parts);
  return {static_cast<int>(r.begin), static_cast<int>(r.end)};
}

// Through the ReLU: grad = 0 where the activation is not positive (torch's threshold_backward).
void relu_backward(float* grad, const float* activation, int rows, int cols, int ld) {
  for (int r = 0; r < rows; ++r) {
    float* g = grad + static_cast<int64_t>(r) * ld;
    const float* a = activation + static_cast<int64_t>(r) * ld;
    for (int j = 0; j < cols; ++j) g[j] = a[j] > 0.0f ? g[j] : 0.0f;
  }
}

// bias_grad[j] = sum over rows of grad[r][j].
void column_sums(const float* grad, int rows, int cols, int ld, float* out) {
  for (int j = 0; j < cols; ++j) out[j] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* g = grad + static_cast<int64_t>(r) * ld;
    for (int j = 0; j < cols; ++j) out[j] += g[j];
  }
}

}  // namespace

// One Linear layer's parameters and this step's buffers. Shared buffers are (max_batch, out) with
// row stride `out`; threads write disjoint column ranges (layer 1) or row ranges (the others).
struct CpuMlpStep::Layer {
  int in = 0, out = 0;
  const float* weight = nullptr;  // (out, in): the module's parameter, re-read every step
  const float* bias = nullptr;    // (out)
  float* weight_grad = nullptr;   // (out, in): the module's .grad (thread 0's partial, layers >= 2)
  float* bias_grad = nullptr;     // (out)
  torch::Tensor activations;      // (max_batch, out): relu(z); the logits for the last layer
  torch::Tensor grad;             // (max_batch, out): dL/dz (layer 1: dL/da first, then dL/dz)
  torch::Tensor partials;         // (threads - 1, out * in + out): threads >= 1's partial gradients
  float* partial_weight(int t) { return partials.data_ptr<float>() + (t - 1) * (out * in + out); }
  float* partial_bias(int t) { return partial_weight(t) + out * in; }
};

namespace {
// >= 2 float32 CPU Linear layers with contiguous parameters.
bool layers_fit(const std::vector<torch::nn::Linear>& layers) {
  if (layers.size() < 2) return false;
  for (const auto& layer : layers)
    for (const auto& p : {layer->weight, layer->bias})
      if (!p.defined() || !p.is_cpu() || p.scalar_type() != torch::kFloat32 || !p.is_contiguous())
        return false;
  return true;
}
}  // namespace

bool CpuMlpStep::applies_to(const std::vector<torch::nn::Linear>& layers) {
  return layers_fit(layers) && gemm::best_kernel() != gemm::Kernel::loops;
}

CpuMlpStep::CpuMlpStep(std::vector<torch::nn::Linear> layers, int64_t max_batch, int threads,
                       gemm::Kernel kernel, MlpCompute compute)
    : modules_(std::move(layers)),
      max_batch_(max_batch),
      threads_(std::max(1, threads)),
      kernel_(kernel),
      compute_(compute) {
  if (!layers_fit(modules_)) throw Error("CPU MLP step: needs >= 2 float32 CPU Linear layers");
  if (!gemm::available(kernel_))
    throw Error(std::string("CPU MLP step: the ") + gemm::kernel_name(kernel_) +
                " kernel cannot run here");
  if (compute_ == MlpCompute::bf16 && !bf16::available())
    throw Error("CPU MLP step: bf16 needs a CPU with AVX512_BF16");
  if (max_batch_ <= 0 || max_batch_ > (1 << 30)) throw Error("CPU MLP step: bad batch size");
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  for (size_t l = 0; l < modules_.size(); ++l) {
    const auto& m = modules_[l];
    if (!m->weight.grad().defined() || !m->bias.grad().defined())
      throw Error("CPU MLP step: gradients must be allocated first (FlatOptimizer does it)");
    if (l > 0 && m->weight.size(1) != modules_[l - 1]->weight.size(0))
      throw Error("CPU MLP step: layer " + std::to_string(l + 1) + " does not take layer " +
                  std::to_string(l) + "'s outputs");
    auto layer = std::make_unique<Layer>();
    layer->out = static_cast<int>(m->weight.size(0));
    layer->in = static_cast<int>(m->weight.size(1));
    layer->activations = torch::empty({max_batch_, layer->out}, options);
    layer->grad = torch::empty({max_batch_, layer->out}, options);
    if (l > 0 && threads_ > 1)
      layer->partials =
          torch::empty({threads_ - 1, int64_t{layer->out} * layer->in + layer->out}, options);
    layers_.push_back(std::move(layer));
  }
  if (compute_ == MlpCompute::bf16) {
    const Layer& first = *layers_[0];
    const int64_t in_pairs = (first.in + 1) / 2, pair_rows = (max_batch_ + 1) / 2;
    x_bf16_.resize(threads_);
    x_pairs_.resize(threads_);
    w1_pairs_.resize(threads_);
    dz_pairs_.resize(threads_);
    for (int t = 0; t < threads_; ++t) {
      const int64_t units = split(first.out, t, threads_).size();
      x_bf16_[t].resize(max_batch_ * in_pairs * 2);
      x_pairs_[t].resize(pair_rows * first.in * 2);
      w1_pairs_[t].resize(in_pairs * units * 2);
      dz_pairs_[t].resize(pair_rows * units * 2);
    }
  }
  thread_x_.assign(threads_, nullptr);
  thread_loss_.assign(threads_, 0.0);
  thread_correct_.assign(threads_, 0);
  if (threads_ > 1) pool_ = std::make_shared<ShardPool>(threads_);
}

CpuMlpStep::~CpuMlpStep() = default;

// Phase 1: a_1[:, units of t] = relu(x W_1[units]^T + b_1[units]).
void CpuMlpStep::forward_first_layer(int t, const float* x, int batch) {
  Layer& first = *layers_[0];
  const Range units = split(first.out, t, threads_);
  if (units.size() == 0) return;
  float* a = first.activations.data_ptr<float>() + units.begin;
  if (compute_ == MlpCompute::bf16) {
    // W_1's rows of these units in pairs of columns, x in both layouts in one pass (rows for this
    // product, pairs of rows for phase 3's dW_1).
    const int in_even = first.in + (first.in & 1);
    bf16::pack_col_pairs(first.weight + int64_t{units.begin} * first.in, units.size(), first.in,
                         first.in, w1_pairs_[t].data());
    bf16::pack_row_pairs(x, batch, first.in, first.in, x_pairs_[t].data(), x_bf16_[t].data());
    bf16::nt_pairs(batch, units.size(), first.in, x_bf16_[t].data(), in_even, w1_pairs_[t].data(),
                   units.size(), a, first.out, first.bias + units.begin, /*relu=*/true);
    return;
  }
  gemm::nt(batch, units.size(), first.in, x, first.in,
           first.weight + int64_t{units.begin} * first.in, first.in, a, first.out,
           first.bias + units.begin, /*relu=*/true, kernel_);
}

// Phase 2: rows of t through layers 2..L, the loss, and back to dL/da_1 for those rows.
void CpuMlpStep::rows_forward_backward(int t, const int64_t* labels, int batch) {
  const Range rows = split(batch, t, threads_);
  const int count = static_cast<int>(layers_.size());
  auto weight_grad = [&](Layer& layer) {
    return t == 0 ? layer.weight_grad : layer.partial_weight(t);
  };
  auto bias_grad = [&](Layer& layer) { return t == 0 ? layer.bias_grad : layer.partial_bias(t); };
  thread_loss_[t] = 0.0;
  thread_correct_[t] = 0;
  if (rows.size() == 0) {  // fewer rows than threads: this thread's partial gradients are zero
    for (int l = 1; l < count; ++l) {
      Layer& layer = *layers_[l];
      std::fill_n(weight_grad(layer), int64_t{layer.out} * layer.in, 0.0f);
      std::fill_n(bias_grad(layer), layer.out, 0.0f);
    }
    return;
  }
  const int m = rows.size();
  auto at_row = [&](torch::Tensor& buffer, const Layer& layer) {
    return buffer.data_ptr<float>() + int64_t{rows.begin} * layer.out;
  };

  for (int l = 1; l < count; ++l) {
    Layer& prev = *layers_[l - 1];
    Layer& layer = *layers_[l];
    gemm::nt(m, layer.out, layer.in, at_row(prev.activations, prev), layer.in, layer.weight,
             layer.in, at_row(layer.activations, layer), layer.out, layer.bias,
             /*relu=*/l + 1 < count, kernel_);
  }

  // Mean cross-entropy over the WHOLE batch: dz_L = (softmax - onehot) / batch, so the rows'
  // contributions add up to the full batch's gradient.
  Layer& last = *layers_[count - 1];
  const SoftmaxLossSums sums =
      softmax_cross_entropy(at_row(last.activations, last), labels + rows.begin, m, last.out,
                            1.0f / static_cast<float>(batch), at_row(last.grad, last), kernel_);
  thread_loss_[t] = sums.loss;
  thread_correct_[t] = sums.correct;

  for (int l = count - 1; l >= 1; --l) {
    Layer& prev = *layers_[l - 1];
    Layer& layer = *layers_[l];
    const float* dz = at_row(layer.grad, layer);
    const float* a_prev = at_row(prev.activations, prev);
    // dW (out, in) = dz^T (out, m) a_prev (m, in); db = column sums of dz.
    gemm::nn(layer.out, layer.in, m, dz, 1, layer.out, a_prev, layer.in, weight_grad(layer),
             layer.in, kernel_);
    column_sums(dz, m, layer.out, layer.out, bias_grad(layer));
    // dL/da_prev (m, in) = dz (m, out) W (out, in); through the ReLU unless prev is layer 1,
    // whose columns phase 3 handles.
    float* d_prev = at_row(prev.grad, prev);
    gemm::nn(m, layer.in, layer.out, dz, layer.out, 1, layer.weight, layer.in, d_prev, layer.in,
             kernel_);
    if (l - 1 >= 1) relu_backward(d_prev, a_prev, m, prev.out, prev.out);
  }
}

// Phase 3: layer 1's gradients for the units of t, and t's share of the partial-gradient sums.
void CpuMlpStep::backward_first_layer(int t, const float* x, int batch) {
  Layer& first = *layers_[0];
  const Range units = split(first.out, t, threads_);
  if (units.size() > 0) {
    float* dz = first.grad.data_ptr<float>() + units.begin;
    relu_backward(dz, first.activations.data_ptr<float>() + units.begin, batch, units.size(),
                  first.out);
    // dW_1[units] (n, in) = dz[:, units]^T (n, B) x (B, in)
    float* dw = first.weight_grad + int64_t{units.begin} * first.in;
    if (compute_ == MlpCompute::bf16) {
      bf16::pack_row_pairs(dz, batch, units.size(), first.out, dz_pairs_[t].data());
      bf16::tn(units.size(), first.in, (batch + 1) / 2, dz_pairs_[t].data(), units.size(),
               x_pairs_[t].data(), first.in, dw, first.in);
    } else {
      gemm::nn(units.size(), first.in, batch, dz, 1, first.out, x, first.in, dw, first.in, kernel_);
    }
    column_sums(dz, batch, units.size(), first.out, first.bias_grad + units.begin);
  }
  for (size_t l = 1; l < layers_.size(); ++l) {
    Layer& layer = *layers_[l];
    const int64_t weights = int64_t{layer.out} * layer.in;
    const Range w = split_by_lines(weights, t, threads_);
    const Range b = split_by_lines(layer.out, t, threads_);
    for (int s = 1; s < threads_; ++s) {
      const float* pw = layer.partial_weight(s);
      const float* pb = layer.partial_bias(s);
      for (int i = w.begin; i < w.end; ++i) layer.weight_grad[i] += pw[i];
      for (int i = b.begin; i < b.end; ++i) layer.bias_grad[i] += pb[i];
    }
  }
}

ParameterShares CpuMlpStep::update_shares() const {
  if (!pool_) return {};
  ParameterShares shares(threads_);
  for (int t = 0; t < threads_; ++t) {
    const Range units = split(layers_[0]->out, t, threads_);
    const int64_t in = layers_[0]->in;
    shares[t].push_back({modules_[0]->weight, units.begin * in, units.end * in});
    shares[t].push_back({modules_[0]->bias, units.begin, units.end});
    for (size_t l = 1; l < layers_.size(); ++l) {
      const Layer& layer = *layers_[l];
      const Range w = split_by_lines(int64_t{layer.out} * layer.in, t, threads_);
      const Range b = split_by_lines(layer.out, t, threads_);
      shares[t].push_back({modules_[l]->weight, w.begin, w.end});
      shares[t].push_back({modules_[l]->bias, b.begin, b.end});
    }
  }
  return shares;
}

void CpuMlpStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  torch::NoGradGuard no_grad;
  const int64_t b = batch.labels.size(0);
  if (b > max_batch_)
    throw Error("CPU MLP step: batch of " + std::to_string(b) + " is larger than its buffers (" +
                std::to_string(max_batch_) + ")");
  Layer& first = *layers_[0];
  // x: (B, in) float32, contiguous. The loaders' batches are already, and are read in place: a
  // reshape and its checks cost a few us of dispatch a step, while the step's other thread waits.
  const torch::Tensor& in = batch.inputs;
  const bool in_place = in.defined() && in.is_cpu() && in.scalar_type() == torch::kFloat32 &&
                        in.dim() >= 1 && in.size(0) == b && in.is_contiguous() &&
                        in.numel() == b * first.in;
  const auto x = in_place ? in : in.reshape({b, -1}).contiguous();
  if (!in_place && (!x.is_cpu() || x.scalar_type() != torch::kFloat32 || x.size(1) != first.in))
    throw Error("CPU MLP step: expected float32 CPU inputs of " + std::to_string(first.in) +
                " features, got " + std::string(c10::toString(x.scalar_type())) + " on " +
                x.device().str() + " with " + std::to_string(x.size(1)));
  const torch::Tensor& y = batch.labels;
  const auto labels = y.is_cpu() && y.scalar_type() == torch::kInt64 && y.is_contiguous()
                          ? y
                          : y.to(torch::kCPU).to(torch::kInt64).contiguous();
  const int64_t classes = layers_.back()->out;
  const int64_t* label = labels.data_ptr<int64_t>();
  for (int64_t r = 0; r < b; ++r)
    if (label[r] < 0 || label[r] >= classes)
      throw Error("label " + std::to_string(label[r]) + " in batch row " + std::to_string(r) +
                  " is outside 0.." + std::to_string(classes - 1));

  if (b == 0) {  // nothing to learn from: zero gradients, nothing added to the sums
    for (auto& m : modules_) {
      m->weight.mutable_grad().zero_();
      m->bias.mutable_grad().zero_();
    }
    return;
  }
  // Parameters are re-read every step: the flat optimizer or a checkpoint load may re-point them.
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = *layers_[l];
    auto& m = modules_[l];
    layer.weight = m->weight.data_ptr<float>();
    layer.bias = m->bias.data_ptr<float>();
    layer.weight_grad = m->weight.mutable_grad().data_ptr<float>();
    layer.bias_grad = m->bias.mutable_grad().data_ptr<float>();
  }
  const float* xp = x.data_ptr<float>();
  // Each thread's own copy of x where the loader made them and they still copy x (a batch whose
  // inputs were replaced, by augmentation say, has stale ones): the same values, read from the
  // core that wrote them.
  const auto& copies = batch.thread_inputs;
  bool own_copies = in_place && static_cast<int>(copies.size()) == threads_ &&
                    copies[0].defined() && copies[0].is_same(in);
  for (int t = 1; own_copies && t < threads_; ++t) {
    const auto& c = copies[t];
    own_copies = c.defined() && c.is_cpu() && c.scalar_type() == torch::kFloat32 &&
                 c.is_contiguous() && c.numel() == in.numel();
  }
  for (int t = 0; t < threads_; ++t) thread_x_[t] = own_copies ? copies[t].data_ptr<float>() : xp;
  const int rows = static_cast<int>(b);
  // Subnormals flushed on every thread (common/flush_subnormals.h): a confident model's softmax
  // puts probabilities below FLT_MIN into dz, and the products carry them on.
  if (threads_ == 1) {
    const FlushSubnormals flush;
    forward_first_layer(0, thread_x_[0], rows);
    rows_forward_backward(0, label, rows);
    backward_first_layer(0, thread_x_[0], rows);
  } else {
    pool_->run([&](int t) {
      const FlushSubnormals flush;
      forward_first_layer(t, thread_x_[t], rows);
    });
    pool_->run([&](int t) {
      const FlushSubnormals flush;
      rows_forward_backward(t, label, rows);
    });
    pool_->run([&](int t) {
      const FlushSubnormals flush;
      backward_first_layer(t, thread_x_[t], rows);
    });
  }
  // All gradients are final now; a distributed reducer may start, last layer first.
  if (grad_ready_)
    for (size_t l = modules_.size(); l-- > 0;) {
      grad_ready_(modules_[l]->weight);
      grad_ready_(modules_[l]->bias);
    }
  double loss = 0.0;
  int64_t right = 0;
  for (int t = 0; t < threads_; ++t) {
    loss += thread_loss_[t];
    right += thread_correct_[t];
  }
  // The trainer's CPU scalars, added to in place: add_() costs ~2 us of dispatch each.
  if (loss_sum.is_cpu() && loss_sum.scalar_type() == torch::kFloat32 && loss_sum.numel() == 1)
    *loss_sum.data_ptr<float>() += static_cast<float>(loss);
  else
    loss_sum.add_(loss);
  if (correct.is_cpu() && correct.scalar_type() == torch::kInt64 && correct.numel() == 1)
    *correct.data_ptr<int64_t>() += right;
  else
    correct.add_(right);
}

}  // namespace spritetorch::train
