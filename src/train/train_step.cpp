#include "train/train_step.h"

#include "common/error.h"

namespace spritetorch::train {

void AutogradStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  auto logits = model_->forward(batch.inputs);                   // (B, K)
  auto loss = torch::cross_entropy_loss(logits, batch.labels);   // mean over the batch
  loss.backward();
  torch::NoGradGuard no_grad;
  loss_sum.add_(loss.detach(), static_cast<double>(batch.labels.size(0)));
  correct.add_(logits.argmax(1).eq(batch.labels).sum());
}

// One shard's buffers: rows [begin, end) of each batch.
struct FusedMlpStep::Shard {
  std::vector<torch::Tensor> z;   // per layer: (rows, out) pre-activations, ReLU'd in place
  std::vector<torch::Tensor> dz;  // per layer: (rows, out) gradient w.r.t. z
  torch::Tensor log_probs;        // (rows, K)
  torch::Tensor minus_ones;       // (rows, 1) of -1, for subtracting one-hot labels
  std::vector<torch::Tensor> weight_grad, bias_grad;  // shard 0: the model's .grad views
  torch::Tensor grad_storage;     // shards > 0: their own gradient buffer
  torch::Tensor loss, correct;    // () this step's loss sum and correct count
  int64_t begin = 0, end = 0;
};

FusedMlpStep::FusedMlpStep(std::vector<torch::nn::Linear> layers, int64_t max_batch, int shards)
    : layers_(std::move(layers)), max_batch_(max_batch) {
  if (layers_.empty()) throw Error("fused MLP step: no layers");
  const auto options = layers_[0]->weight.options().requires_grad(false);
  for (auto& layer : layers_)
    if (!layer->weight.grad().defined() || !layer->bias.grad().defined())
      throw Error("fused MLP step: gradients must be allocated first (FlatOptimizer does it)");
  shards = std::max(1, std::min<int>(shards, static_cast<int>(max_batch)));
  if (shards > 1 && !layers_[0]->weight.is_cpu()) shards = 1;  // the pool is for CPU cores
  int64_t parameters = 0;
  for (auto& layer : layers_) parameters += layer->weight.numel() + layer->bias.numel();
  for (int s = 0; s < shards; ++s) {
    auto shard = std::make_unique<Shard>();
    const int64_t rows = (max_batch + shards - 1) / shards;
    for (auto& layer : layers_) {
      shard->z.push_back(torch::empty({rows, layer->weight.size(0)}, options));
      shard->dz.push_back(torch::empty({rows, layer->weight.size(0)}, options));
    }
    shard->log_probs = torch::empty({rows, layers_.back()->weight.size(0)}, options);
    shard->minus_ones = torch::full({rows, 1}, -1.0, options);
    shard->loss = torch::zeros({}, options);
    shard->correct = torch::zeros({}, options.dtype(torch::kInt64));
    if (s == 0) {
      for (auto& layer : layers_) {
        shard->weight_grad.push_back(layer->weight.grad());
        shard->bias_grad.push_back(layer->bias.grad());
      }
    } else {
      shard->grad_storage = torch::empty({parameters}, options);
      int64_t offset = 0;
      for (auto& layer : layers_) {
        const auto& w = layer->weight;
        shard->weight_grad.push_back(shard->grad_storage.narrow(0, offset, w.numel()).view(w.sizes()));
        offset += w.numel();
        shard->bias_grad.push_back(shard->grad_storage.narrow(0, offset, layer->bias.numel()));
        offset += layer->bias.numel();
      }
    }
    shards_.push_back(std::move(shard));
  }
  if (shards > 1) pool_ = std::make_unique<ShardPool>(shards);
}

FusedMlpStep::~FusedMlpStep() = default;

void FusedMlpStep::run_shard(Shard& shard, const torch::Tensor& x_all, const torch::Tensor& labels_all,
                             int64_t batch) {
  torch::NoGradGuard no_grad;  // grad mode is per thread: shards run on the pool's threads too
  const int64_t b = shard.end - shard.begin;
  const size_t count = layers_.size();
  if (b <= 0) {  // a short last batch can leave a shard without rows: it contributes zeros
    shard.loss.zero_();
    shard.correct.zero_();
    for (size_t l = 0; l < count; ++l) {
      shard.weight_grad[l].zero_();
      shard.bias_grad[l].zero_();
    }
    return;
  }
  const auto x = x_all.narrow(0, shard.begin, b);           // (b, in)
  const auto labels = labels_all.narrow(0, shard.begin, b);  // (b)

  // Forward: z_l = a_{l-1} W_l^T + b_l; a_l = relu(z_l), in place (z_l then holds a_l).
  std::vector<torch::Tensor> a(count);  // a[l]: activation leaving layer l, (b, out_l)
  for (size_t l = 0; l < count; ++l) {
    const auto& in = l == 0 ? x : a[l - 1];
    auto z = shard.z[l].narrow(0, 0, b);
    at::addmm_out(z, layers_[l]->bias, in, layers_[l]->weight.t());
    if (l + 1 < count) z.clamp_min_(0);
    a[l] = z;
  }
  const auto& logits = a.back();  // (b, K)
  auto log_probs = shard.log_probs.narrow(0, 0, b);
  at::_log_softmax_out(log_probs, logits, 1, false);
  const auto label_column = labels.view({b, 1});
  at::sum_out(shard.loss, log_probs.gather(1, label_column), at::IntArrayRef{0, 1});
  shard.loss.neg_();
  at::sum_out(shard.correct, logits.argmax(1).eq(labels), at::IntArrayRef{0});

  // Backward of the mean cross-entropy over the WHOLE batch: dz_L = (softmax - onehot) / batch,
  // so the shards' gradients add up to the full batch's.
  auto dz = shard.dz.back().narrow(0, 0, b);
  at::exp_out(dz, log_probs);
  dz.scatter_add_(1, label_column, shard.minus_ones.narrow(0, 0, b));
  dz.mul_(1.0 / static_cast<double>(batch));
  for (size_t l = count; l-- > 0;) {
    const auto& in = l == 0 ? x : a[l - 1];
    at::mm_out(shard.weight_grad[l], dz.t(), in);  // (out, in): overwritten, no zero_grad needed
    at::sum_out(shard.bias_grad[l], dz, {0});
    // One shard writes the model's gradients directly: they are final now, so a distributed
    // reducer may start on them while the earlier layers are differentiated.
    if (grad_ready_ && shards_.size() == 1) {
      grad_ready_(layers_[l]->weight);
      grad_ready_(layers_[l]->bias);
    }
    if (l == 0) break;
    auto dz_prev = shard.dz[l - 1].narrow(0, 0, b);
    at::mm_out(dz_prev, dz, layers_[l]->weight);                 // d a_{l-1}
    at::threshold_backward_out(dz_prev, dz_prev, a[l - 1], 0);  // through the ReLU
    dz = dz_prev;
  }
}

void FusedMlpStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  torch::NoGradGuard no_grad;
  const int64_t b = batch.labels.size(0);
  if (b > max_batch_) throw Error("fused MLP step: batch larger than its buffers");
  const auto x = batch.inputs.reshape({b, -1});  // (B, in)
  const int n = static_cast<int>(shards_.size());
  for (int s = 0; s < n; ++s) {
    shards_[s]->begin = b * s / n;
    shards_[s]->end = b * (s + 1) / n;
  }
  if (n == 1) {
    run_shard(*shards_[0], x, batch.labels, b);
  } else {
    pool_->run([&](int s) { run_shard(*shards_[s], x, batch.labels, b); });
    // Sum the other shards' gradients into shard 0's (the model's .grad views), last layer first,
    // reporting each layer as soon as its sum is complete (distributed reducer, grad_ready_).
    for (size_t l = layers_.size(); l-- > 0;) {
      for (int s = 1; s < n; ++s) {
        shards_[0]->weight_grad[l].add_(shards_[s]->weight_grad[l]);
        shards_[0]->bias_grad[l].add_(shards_[s]->bias_grad[l]);
      }
      if (grad_ready_) {
        grad_ready_(layers_[l]->weight);
        grad_ready_(layers_[l]->bias);
      }
    }
  }
  for (auto& shard : shards_) {
    loss_sum.add_(shard->loss);
    correct.add_(shard->correct);
  }
}

std::unique_ptr<TrainStep> make_train_step(const models::Classifier& model, int64_t max_batch,
                                           const std::string& kind, int shards) {
  if (kind != "auto" && kind != "autograd" && kind != "fused")
    throw Error("unknown step '" + kind + "': expected auto, autograd or fused");
  auto layers = model->relu_mlp_layers();
  if (kind == "fused" && layers.empty())
    throw Error("--step fused needs a ReLU MLP (ann, simplenn)", "use --step auto");
  if (kind != "autograd" && !layers.empty())
    return std::make_unique<FusedMlpStep>(layers, max_batch, shards);
  return std::make_unique<AutogradStep>(model);
}

}  // namespace spritetorch::train
