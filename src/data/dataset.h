// An in-memory labelled dataset: the one shape every reader produces and every loader consumes.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace spritetorch::data {

struct Dataset {
  // inputs: (N, C, H, W) uint8 images (scaled to [0, 1] when batched, like torchvision's ToTensor)
  //         or (N, F) float32 features (used as they are). On the CPU unless a loader moved it.
  torch::Tensor inputs;
  torch::Tensor labels;  // (N) int64 class indices in [0, classes)
  std::vector<std::string> class_names;
  std::string name;  // "fashion-mnist/train", "dummy", ...

  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
  int64_t num_classes() const { return static_cast<int64_t>(class_names.size()); }
  // The first `count` samples (all when count >= size()); shares storage.
  Dataset head(int64_t count) const;
  // `count` samples stratified by class (all when count >= size()), in the set's order: with
  // count >= the classes present, one of each and the rest shared in proportion to what each class
  // has beyond that one (largest remainders); with fewer, one sample of `count` classes at even
  // steps over them. A class's samples are taken at even steps over it. So a sprite split (ordered
  // by class, however unbalanced) keeps every class, where head() would keep the first one or two.
  // Deterministic. A copy.
  Dataset spread(int64_t count) const;
};

// Converts a batch of stored inputs to what a model takes: uint8 -> float32 / 255; float as is.
// Runs on whatever device `stored` is on.
torch::Tensor to_model_input(const torch::Tensor& stored);

}  // namespace spritetorch::data
