// Sampling as a CUDA graph: one batch's whole reverse process (DDIM's 25 guided UNet passes and
// their updates: some 2,000 kernels) captured once and replayed for every later batch of the same
// size, so a batch costs one graph launch. The first batch runs eagerly on a side stream and is
// kept (it is the warm-up that cuDNN's algorithm search and the allocator need before a capture),
// the second is captured and replayed, the rest are replayed; a batch of another size (the last,
// partial one) runs eagerly. The starting noise is copied into the graph's input buffer outside
// the graph, so a seed gives the same sprites graphed or not, up to float rounding.
//
// Only deterministic sampling is captured (DDIM with eta 0, and DPM-Solver++(2M)): the noise of
// DDIM with eta > 0 (the default) and of DDPM is drawn on the host per step, which a graph cannot
// replay.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace spritetorch::diffusion {

struct SampleOptions;

// One batch's eager sampler: x_T (B, C, S, S) float32 and c (B) int64 on the device -> x_0.
using BatchSampler = std::function<torch::Tensor(const torch::Tensor& x_T, const torch::Tensor& c)>;

// Why sampling with `options` on `device` is not captured (nullopt: it is).
std::optional<std::string> graph_sampling_unavailable(const torch::Device& device,
                                                      const SampleOptions& options);
// Whether sample() draws `count` sprites through a graph: where available, and only from two
// batches of options.batch on (the first batch is the graph's warm-up).
bool graph_sampling_applies(const torch::Device& device, const SampleOptions& options,
                            int64_t count);

class CudaGraphSampler {
 public:
  // body must stay valid while this object lives. Throws spritetorch::Error in a build without
  // CUDA or for a device that is not CUDA.
  CudaGraphSampler(BatchSampler body, torch::Device device);
  ~CudaGraphSampler();
  // x_0 for this batch: eager, captured-and-replayed or replayed (see above). A fresh tensor.
  torch::Tensor run(const torch::Tensor& x_T, const torch::Tensor& c);
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spritetorch::diffusion
