#include "diffusion/cuda_graph_sampler.h"

#include <algorithm>

#include "common/error.h"
#include "common/timer.h"
#include "diffusion/generator.h"

#if SPRITETORCH_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace spritetorch::diffusion {

std::optional<std::string> graph_sampling_unavailable(const torch::Device& device,
                                                      const SampleOptions& options) {
  if (!options.cuda_graphs) return "--no-cuda-graphs";
  if (options.sampler == "ddpm")
    return "the " + options.sampler + " sampler draws noise on the host at every step";
  if (options.sampler == "ddim" && options.eta != 0)
    return "DDIM with eta > 0 draws noise on the host at every step (--eta 0: deterministic)";
  if (!device.is_cuda()) return "not a CUDA device";
  if (!SPRITETORCH_WITH_CUDA) return "this spritetorch was built without CUDA";
  return std::nullopt;
}

bool graph_sampling_applies(const torch::Device& device, const SampleOptions& options,
                            int64_t count) {
  return !graph_sampling_unavailable(device, options) &&
         count >= 2 * std::max<int64_t>(options.batch, 1);
}

#if SPRITETORCH_WITH_CUDA

struct CudaGraphSampler::Impl {
  BatchSampler body;
  torch::Device device;
  c10::cuda::CUDAStream side_stream;
  at::cuda::CUDAGraph graph;
  bool warmed_up = false, captured = false;
  torch::Tensor x_in, c_in, out;  // static: the graph's input noise and labels, and its x_0

  Impl(BatchSampler b, torch::Device d)
      : body(std::move(b)),
        device(d),
        side_stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}
};

CudaGraphSampler::CudaGraphSampler(BatchSampler body, torch::Device device) {
  if (!device.is_cuda()) throw Error("internal: CudaGraphSampler on " + device.str());
  impl_ = std::make_unique<Impl>(std::move(body), device);
}

CudaGraphSampler::~CudaGraphSampler() = default;

bool CudaGraphSampler::captured() const { return impl_->captured; }

torch::Tensor CudaGraphSampler::run(const torch::Tensor& x_T, const torch::Tensor& c) {
  Impl& m = *impl_;
  if (m.warmed_up && !x_T.sizes().equals(m.x_in.sizes()))
    return m.body(x_T, c);  // another batch size: eagerly
  if (m.captured) {
    m.x_in.copy_(x_T);
    m.c_in.copy_(c);
    m.graph.replay();
    return m.out.clone();
  }
  synchronize(m.device);
  torch::Tensor result;
  {
    c10::cuda::CUDAStreamGuard on_side(m.side_stream);
    if (!m.warmed_up) {  // the warm-up is this batch's sampling, kept
      result = m.body(x_T, c);
      m.x_in = torch::empty_like(x_T);
      m.c_in = torch::empty_like(c);
      m.warmed_up = true;
    } else {
      m.x_in.copy_(x_T);
      m.c_in.copy_(c);
      m.graph.capture_begin();
      m.out = m.body(m.x_in, m.c_in);
      m.graph.capture_end();
      m.captured = true;
    }
  }
  synchronize(m.device);
  if (!m.captured) return result;
  m.graph.replay();  // capturing records the work without running it
  return m.out.clone();
}

#else  // CPU-only LibTorch: graph_sampling_unavailable() always says why first.

struct CudaGraphSampler::Impl {};
CudaGraphSampler::CudaGraphSampler(BatchSampler, torch::Device) {
  throw Error("CUDA graph sampling: this spritetorch was built without CUDA");
}
CudaGraphSampler::~CudaGraphSampler() = default;
bool CudaGraphSampler::captured() const { return false; }
torch::Tensor CudaGraphSampler::run(const torch::Tensor&, const torch::Tensor&) {
  throw Error("CUDA graph sampling: this spritetorch was built without CUDA");
}

#endif

}  // namespace spritetorch::diffusion
