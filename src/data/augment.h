// On-device augmentation of a whole batch at once: every sample gets its own random choice, drawn
// on the batch's device, and no loop runs over samples.
#pragma once

#include <torch/torch.h>

#include <string>

namespace spritetorch::data {

struct AugmentOptions {
  bool flip = false;  // horizontal mirror with probability 1/2
  int shift = 0;      // translate by up to +-shift pixels in x and y, filling with zeros

  bool enabled() const { return flip || shift > 0; }
  std::string describe() const;
};

// "none", "flip", "shift", "flip,shift" (shift amount 2), "shift:N", "flip,shift:N".
AugmentOptions parse_augment(const std::string& text);

// x: (B, C, H, W) float, any device; returns a new batch of the same shape. Uses LibTorch's default
// generator for x's device, so a seeded run is reproducible.
torch::Tensor augment_batch(const torch::Tensor& x, const AugmentOptions& options);

}  // namespace spritetorch::data
