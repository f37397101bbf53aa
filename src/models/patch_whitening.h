// A first convolution that whitens image patches, fixed before training (`--first-conv
// whitened`): the filters are the principal directions of the training images' k x k patches,
// each scaled by 1 / sqrt(its variance + eps), and each beside its negative so that the ReLU after
// the norm keeps both signs. The layer is frozen: the rest of the net learns on decorrelated,
// equally scaled inputs from the first step. This is airbench's whitening initialisation (Keller
// Jordan's CIFAR-10 speed runs) for our BatchNorm CNNs; docs/benchmarks.md has what it buys.
#pragma once

#include <torch/torch.h>

#include <string>

namespace spritetorch::models {

// The training images whose patches the filters come from: the first kWhiteningImages of the set
// (no random draw: the same filters for every seed, in Python as here).
constexpr int64_t kWhiteningImages = 5000;
constexpr double kWhiteningEps = 5e-4;  // added to each variance (images scaled to 0-1)

// (out, C, k, k) float32 filters whitening the k x k patches of `images` as a convolution with
// `padding` and `stride` sees them. images: (N, C, H, W) on any device (the products are summed
// there; the result is on the CPU), float32 or uint8 as stored (scaled as data::to_model_input
// scales the trainer's batches). Row i < out/2 is the
// direction of the i-th largest variance v_i divided by sqrt(v_i + eps), its largest component
// positive; row out/2 + i is its negative. With more than D = C k^2 pairs the directions repeat in
// order (row i takes direction i mod D): after the norm each copy gets a scale and shift of its
// own, so a ReLU cuts the same direction at other levels. Throws Error unless out is even.
torch::Tensor patch_whitening_filters(const torch::Tensor& images, int64_t out, int64_t kernel,
                                      int64_t padding = -1, int64_t stride = 1,
                                      double eps = kWhiteningEps);

// The module's first Conv2d (in registration order) set to patch_whitening_filters of `images`
// (uint8 or float32 (N, C, H, W), as stored: converted as the trainer's batches are), its bias to
// zero, both frozen (requires_grad false). The patches' products are summed on `device` (the
// training device: on CUDA they take milliseconds), the module may be anywhere. Throws Error naming
// `model` when there is no such convolution or it cannot be whitened (non-square kernel, groups,
// dilation, too many channels). Returns a description for the settings table.
std::string whiten_first_conv(torch::nn::Module& module, const torch::Tensor& images,
                              const std::string& model, torch::Device device = torch::kCPU);
// Only the freezing (a resumed run: its checkpoint holds the filters).
void freeze_first_conv(torch::nn::Module& module, const std::string& model);

}  // namespace spritetorch::models
