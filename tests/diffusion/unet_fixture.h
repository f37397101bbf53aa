// A small UNet (base 16, attention, scale-shift norms) in which every weight gets a gradient, for
// tests that compare two computations of the UNet's gradients.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "diffusion/unet.h"

namespace spritetorch::testing {

inline diffusion::UNet unet_whose_every_weight_learns(int64_t classes, uint64_t seed) {
  diffusion::UNetOptions options;
  options.base = 16;
  options.classes = classes;
  options.attention = true;
  options.scale_shift = true;
  torch::manual_seed(seed);
  diffusion::UNet net(options);
  // The UNet starts with a zero output convolution (and zero attention projections), which would
  // send no gradient back into the blocks: random ones make every gradient count.
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters())
    if (p.dim() == 4 && p.abs().max().item<float>() == 0) p.normal_(0, 0.1);
  return net;
}

}  // namespace spritetorch::testing
