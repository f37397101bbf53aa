// --strategy dp: LibTorch's DataParallel around a classifier, in one process. Each forward scatters
// the batch over `devices`, replicates the model onto each (ClassifierImpl::clone), runs the
// replicas in parallel and gathers the logits on devices[0]; backward reduce-adds the replicas'
// gradients into the wrapped model's own parameters, which the optimizer then steps as usual.
// Replicating every step costs a parameter broadcast per step; ddp (one process per GPU) does not,
// which is why PyTorch recommends ddp even on one machine (docs/distributed.md).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "models/classifier.h"

namespace spritetorch::train {

class DataParallelClassifierImpl : public models::ClassifierImpl {
 public:
  // devices: where the replicas run; inputs and the model are expected on devices[0].
  DataParallelClassifierImpl(models::Classifier inner, std::vector<torch::Device> devices);
  torch::Tensor forward(torch::Tensor x) override;  // (B, ...) on devices[0] -> (B, K) there
  const std::vector<torch::Device>& devices() const { return devices_; }

 private:
  // Deliberately not registered as a submodule: the wrapped model alone owns the parameters that
  // the optimizer, the checkpoints and the evaluator see.
  models::Classifier inner_;
  std::vector<torch::Device> devices_;
};

}  // namespace spritetorch::train
