#include "train/evaluator.h"

#include <algorithm>

#include <limits>

#include "device/device.h"
#include "models/eval_mode.h"

namespace spritetorch::train {

std::function<torch::Tensor(const torch::Tensor&)> rows_over_pool(
    std::function<torch::Tensor(const torch::Tensor&)> forward, std::shared_ptr<ShardPool> pool) {
  if (!pool || pool->size() < 2) return forward;
  return [forward = std::move(forward), pool = std::move(pool)](const torch::Tensor& x) {
    const int shards = pool->size();
    // The same shards whether the thread governor left one thread or all (ShardPool runs them on
    // the threads it has): a LibTorch Linear's rows come out of a call of 500 rows other than out
    // of one of 1,000 in their last bits, and a run's results must not depend on the cores it got.
    if (!x.device().is_cpu() || x.dim() == 0 || x.size(0) < 128) return forward(x);
    const int64_t rows = x.size(0);
    std::vector<torch::Tensor> parts(static_cast<size_t>(shards));  // (rows of shard s, K)
    pool->run([&](int s) {
      c10::InferenceMode inference;
      parts[static_cast<size_t>(s)] =
          forward(x.slice(0, rows * s / shards, rows * (s + 1) / shards));
    });
    return torch::cat(parts);
  };
}

EvalReport evaluate(models::ClassifierImpl& model, data::Loader& loader, int64_t classes,
                    bool keep_predictions) {
  return evaluate([&model](const torch::Tensor& x) { return model.forward(x); }, model, loader,
                  classes, keep_predictions);
}

int64_t evaluation_batch(const torch::Device& device, CpuWork work, int64_t train_batch) {
  if (device.is_cpu() && work == CpuWork::kConvolutions) return 256;
  return std::max<int64_t>(train_batch, 1000);
}

EvalReport evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                    torch::nn::Module& model, data::Loader& loader, int64_t classes,
                    bool keep_predictions) {
  // The module's mode put back however the evaluation ends: a forward that throws (a user's
  // model) leaves the caller's module as it was.
  models::EvalModeScope eval_mode(model);
  const torch::Device device = loader.device();
  const auto on_device = torch::TensorOptions().device(device);

  EvalReport report;
  {
    c10::InferenceMode inference;
    auto loss_sum = torch::zeros({}, on_device.dtype(torch::kFloat64));
    auto confusion = torch::zeros({classes * classes}, on_device.dtype(torch::kInt64));
    loader.start_epoch(0);
    data::Batch batch;
    bool checked = false;
    std::vector<torch::Tensor> predictions;  // (B) int64 per batch, on the device
    while (loader.next(batch)) {
      if (!checked) {
        const auto params = model.parameters();
        if (!params.empty())
          device::expect_on_device(batch.inputs, params[0].device(), "the evaluation batch",
                                   "the model");
        checked = true;
      }
      auto logits = forward(batch.inputs).to(torch::kFloat32);  // (B, K)
      loss_sum += torch::cross_entropy_loss(logits, batch.labels, {}, at::Reduction::Sum)
                      .to(torch::kFloat64);
      auto predicted = logits.argmax(1);
      if (keep_predictions) predictions.push_back(predicted);
      confusion += torch::bincount(batch.labels * classes + predicted, {}, classes * classes);
    }
    report.confusion = confusion.view({classes, classes}).cpu();
    if (keep_predictions)
      report.predictions =
          predictions.empty() ? torch::zeros({0}, torch::kInt64) : torch::cat(predictions).cpu();
    report.samples = report.confusion.sum().item<int64_t>();
    report.loss =
        report.samples ? loss_sum.item<double>() / static_cast<double>(report.samples) : 0.0;
  }
  const auto correct = report.confusion.diagonal();
  const auto per_class = report.confusion.sum(1);
  report.accuracy = report.samples ? static_cast<double>(correct.sum().item<int64_t>()) /
                                         static_cast<double>(report.samples)
                                   : 0.0;
  for (int64_t k = 0; k < classes; ++k) {
    const int64_t n = per_class[k].item<int64_t>();
    report.per_class_accuracy.push_back(n ? static_cast<double>(correct[k].item<int64_t>()) /
                                                static_cast<double>(n)
                                          : std::numeric_limits<double>::quiet_NaN());
  }
  return report;
}

}  // namespace spritetorch::train
