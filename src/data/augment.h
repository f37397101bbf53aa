// On-device augmentation of a whole batch at once: every sample gets its own random choice, drawn
// on the batch's device, and no loop runs over samples.
#pragma once

#include <torch/torch.h>

#include <string>

namespace spritetorch::data {

struct AugmentOptions {
  bool flip = false;  // horizontal mirror with probability 1/2
  int shift = 0;      // translate by up to +-shift pixels in x and y, filling with zeros
  int cutout = 0;     // zero one cutout x cutout square per sample, centred anywhere in the image

  bool enabled() const { return flip || shift > 0 || cutout > 0; }
  std::string describe() const;
};

// "none", or any of "flip", "shift" (amount 2) or "shift:N", and "cutout:N", joined by commas:
// "flip,shift:2,cutout:8".
AugmentOptions parse_augment(const std::string& text);

// x: (B, C, H, W) float, any device; returns a new batch of the same shape. Uses LibTorch's default
// generator for x's device, so a seeded run is reproducible. Flip, then shift, then cutout, each
// drawing its random numbers only when enabled, so adding one leaves the others' draws unchanged.
torch::Tensor augment_batch(const torch::Tensor& x, const AugmentOptions& options);

}  // namespace spritetorch::data
