// The training run: data, device, model and optimizer composed, the epoch loop, evaluation,
// checkpoints. The library prints nothing: progress reaches the caller through a TrainObserver.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "models/classifier.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluator.h"

namespace spritetorch::train {

using Settings = std::vector<std::pair<std::string, std::string>>;

struct StepLog {
  int64_t epoch = 0, step = 0, steps = 0;  // 1-based epoch and step within it
  double running_loss = 0;                 // mean loss since the last log
};

struct EpochReport {
  int64_t epoch = 0, epochs = 0;  // 1-based
  double loss = 0;                // mean training loss over the epoch's samples
  double accuracy = 0;            // training accuracy over the epoch (model in train mode)
  double seconds = 0;
  double images_per_second = 0;
  int64_t samples = 0;
};

struct TrainReport {
  std::string device;  // display name, e.g. "cpu (AMD EPYC 7B13)"
  Settings settings;
  int64_t start_epoch = 0;  // epochs already done by a resumed checkpoint
  std::vector<EpochReport> epochs;
  double train_seconds = 0;  // the epoch loop only, device-synchronised
  EvalReport test;
  std::vector<std::string> class_names;
  bool main_rank = true;  // false on ranks other than 0 of a ddp run: no test report, no checkpoint
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const std::string& /*device*/, const Settings& /*settings*/) {}
  virtual void on_log(const StepLog& /*log*/) {}
  virtual void on_epoch(const EpochReport& /*report*/) {}
};

struct Datasets {
  data::Dataset train, test;
};
// The config's dataset, with train_limit / test_limit applied.
Datasets load_datasets(const TrainConfig& config);

TrainReport train(const TrainConfig& config, TrainObserver* observer = nullptr);
// The same on datasets already in memory (config.dataset and the limits are then not used);
// `spritetorch bench` loads once and trains many times.
TrainReport train(const TrainConfig& config, const Datasets& data, TrainObserver* observer = nullptr);

// Model state as name -> tensor (parameters and buffers), and back. load_model_state checks every
// name and shape and names `source` in its errors.
std::map<std::string, torch::Tensor> model_state(const torch::nn::Module& model);
void load_model_state(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& state,
                      const std::string& source);
// Builds the model a checkpoint describes and loads its weights, on `device`.
models::Classifier model_from_checkpoint(const Checkpoint& checkpoint, const std::string& source,
                                         torch::Device device);

}  // namespace spritetorch::train
