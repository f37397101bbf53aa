// A classifier's answer for each input: the most likely class and its softmax probability. What
// `spritetorch classify` prints; library users get the same numbers without the CLI.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "models/classifier.h"

namespace spritetorch::models {

struct Prediction {
  int64_t label = 0;
  std::string name;         // class_names[label], or the label's number where the names end
  double confidence = 0.0;  // softmax probability of `label`
};

// inputs: a float batch the model takes ((B, C, H, W) or (B, F), data::to_model_input's form) on
// the model's device; the model should be in eval mode. One Prediction per row, in inference mode.
std::vector<Prediction> predict(ClassifierImpl& model, const torch::Tensor& inputs,
                                const std::vector<std::string>& class_names);
// The same through any forward ((B, ...) -> (B, K) logits or log-probabilities), e.g. one that
// averages over test-time flips (train::checkpoint_forward).
std::vector<Prediction> predict(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                const torch::Tensor& inputs,
                                const std::vector<std::string>& class_names);

}  // namespace spritetorch::models
