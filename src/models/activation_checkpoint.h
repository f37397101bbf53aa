// Activation checkpointing for any module: LibTorch's C++ API has no torch.utils.checkpoint
// (pytorch/pytorch#52744). A checkpointed segment keeps only its inputs in the forward pass, not
// the intermediate tensors autograd would save, and runs again in backward to differentiate them:
// less memory held from forward to backward, one more forward of the segment per step.
//
//   x = models::checkpointed(*stage1, [&](const torch::Tensor& in) { return stage1(in); }, x);
//   x = models::checkpointed_sequential(body, /*segments=*/4, x);   // a torch::nn::Sequential
//
// The gradients are those of the plain forward; so are the module's buffers after a step:
//  - the recomputation runs under the autocast state and (by default) the random-number state of
//    the forward, so a dropout mask or a bf16 cast comes out the same;
//  - the module's buffers (BatchNorm's running statistics) are put back after the recomputation,
//    so they are updated once a step, not twice (torch.utils.checkpoint updates them twice);
//  - the module's parameters are inputs of the recording node, so their gradients reach the
//    optimizer and ddp's hooks as in a plain forward, even when no input requires a gradient.
// Without grad mode (evaluation, sampling) the segment runs plainly. Not supported: double
// backward (create_graph), and a segment that changes its inputs in place.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace spritetorch::models {

struct CheckpointOptions {
  // Run the recomputation from the forward's CPU generator state (and that of each CUDA device
  // an input is on), as torch.utils.checkpoint's preserve_rng_state. A segment that draws no
  // random numbers can turn it off to save the copies. Under a CUDA graph capture the CUDA
  // generators' states cannot be read: the segment must draw no random numbers on the GPU.
  bool preserve_rng = true;
};

// What a segment computes: tensors in, tensors out (outputs of integer type get no gradient).
using Segment = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// segment(inputs), checkpointed. `module` is the one whose parameters the segment reads and
// whose buffers it may update (a Sequential of several, a whole model: all of its parameters and
// buffers count). The segment runs again in backward, so whatever it captures by reference
// (the module included) must outlive the backward.
std::vector<torch::Tensor> checkpointed(torch::nn::Module& module, Segment segment,
                                        const std::vector<torch::Tensor>& inputs,
                                        const CheckpointOptions& options = {});

// The one-tensor form: segment(x), checkpointed.
torch::Tensor checkpointed(torch::nn::Module& module,
                           std::function<torch::Tensor(const torch::Tensor&)> segment,
                           const torch::Tensor& x, const CheckpointOptions& options = {});

// torch.utils.checkpoint.checkpoint_sequential: the Sequential's modules (each one tensor in, one
// out) in `segments` runs of consecutive modules, as even as the count allows, each checkpointed
// but the last (whose activations backward needs first, so keeping them costs nothing extra).
// Throws spritetorch::Error unless 1 <= segments <= seq->size().
torch::Tensor checkpointed_sequential(torch::nn::Sequential& seq, int64_t segments,
                                      const torch::Tensor& x,
                                      const CheckpointOptions& options = {});

}  // namespace spritetorch::models
