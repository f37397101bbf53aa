// Evaluation of a classifier: loss, accuracy, per-class accuracy and the confusion matrix, all
// accumulated on the device and read back once at the end.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "common/cpu_threads.h"
#include "common/shard_pool.h"
#include "data/loader.h"
#include "models/classifier.h"

namespace spritetorch::train {

struct EvalReport {
  double loss = 0;           // mean loss over the samples (cross-entropy for classifiers)
  double accuracy = 0;       // share of samples whose argmax is the label
  bool has_accuracy = true;  // false for tasks with no classes to be right about (generators)
  int64_t samples = 0;
  std::vector<double> per_class_accuracy;  // (K); NaN for a class with no samples
  torch::Tensor confusion;    // (K, K) int64 on the CPU: row = true, column = predicted
  torch::Tensor predictions;  // (N) int64 on the CPU, loader order; keep_predictions only
};

// Runs under inference mode with the model in eval mode; restores train mode if it was on.
// keep_predictions: also return every predicted class (read back once, at the end).
EvalReport evaluate(models::ClassifierImpl& model, data::Loader& loader, int64_t classes,
                    bool keep_predictions = false);
// The same for any module: forward maps (B, ...) float32 inputs to (B, K) logits.
EvalReport evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                    torch::nn::Module& module, data::Loader& loader, int64_t classes,
                    bool keep_predictions = false);

// The batch an evaluation takes by default (`eval`, a run's test evaluations): 256 for a conv net
// on the CPU, whose activations at 1,000 samples (fastcnn: ~50 MB a layer) leave the caches and
// fault in fresh pages (`eval` of fastcnn on 10,000 images: 0.78 s beyond start-up at 1,000
// against 0.35 s at 256, 2-vCPU Zen 5, docs/benchmarks.md); else the larger of `train_batch` and
// 1,000 (an MLP's products, a GPU).
int64_t evaluation_batch(const torch::Device& device, CpuWork work, int64_t train_batch = 0);

// `forward` over the CPU threads of `pool`: a batch's rows are cut into the pool's shards and each
// thread runs `forward` on its own (under inference mode, which is per thread). The fused MLP step
// trains on one LibTorch and one BLAS thread per pool thread, so its evaluation would otherwise
// run on one core. Rows are independent in evaluation (BatchNorm uses its running statistics), so
// each row's logits are those of one call up to float rounding (OpenBLAS may round a product's row
// differently in a call of fewer rows); batches of fewer than 128 rows and inputs off the CPU call
// `forward` as it is. A pool the thread governor has left fewer threads runs the same shards on
// them, so the logits, like the step's results, do not depend on the cores the run got.
std::function<torch::Tensor(const torch::Tensor&)> rows_over_pool(
    std::function<torch::Tensor(const torch::Tensor&)> forward, std::shared_ptr<ShardPool> pool);

}  // namespace spritetorch::train
