#include "train/cuda_graph_step.h"

#include "common/error.h"
#include "common/timer.h"
#include "train/amp_step.h"

#if SPRITETORCH_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace spritetorch::train {

std::optional<Error> cuda_graphs_unavailable(const torch::Device& device,
                                             const std::string& data_path) {
  if (!device.is_cuda())
    return Error("--cuda-graphs needs a CUDA device; this run is on " + device.str(),
                 "drop --cuda-graphs (CUDA graphs remove GPU kernel-launch overhead; the CPU and "
                 "MPS have no equivalent)");
  if (!SPRITETORCH_WITH_CUDA)
    return Error("--cuda-graphs: this spritetorch was built against a LibTorch without CUDA",
                 "rebuild against a CUDA LibTorch");
  if (data_path != "resident")
    return Error(
        "--cuda-graphs needs the resident data path (fixed batch shapes already on the "
        "device); this run streams its data (" +
            data_path + ")",
        "use the resident loader or drop --cuda-graphs");
  return std::nullopt;
}

void check_cuda_graphs(const torch::Device& device, const std::string& data_path) {
  if (auto why = cuda_graphs_unavailable(device, data_path)) throw *why;
}

#if SPRITETORCH_WITH_CUDA

struct CudaGraphStep::Impl {
  TrainStep& step;
  FlatOptimizer& optimizer;
  precision::GradScaler* scaler;
  double clip_grad_norm;
  int64_t batch_size;
  torch::Device device;
  c10::cuda::CUDAStream side_stream;
  at::cuda::CUDAGraph graph;
  int warmed_up = 0;
  bool captured = false;
  torch::Tensor inputs, labels;  // static: (batch_size, ...) float32 / (batch_size) int64
  torch::Tensor loss, correct;   // static: () float32 / () int64, this step's sums

  Impl(TrainStep& s, FlatOptimizer& o, precision::GradScaler* sc, double clip, int64_t b,
       torch::Device d)
      : step(s),
        optimizer(o),
        scaler(sc),
        clip_grad_norm(clip),
        batch_size(b),
        device(d),
        side_stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}

  // The work captured in the graph: everything reads and writes static tensors only.
  void body() {
    loss.zero_();
    correct.zero_();
    if (!step.overwrites_grads()) optimizer.zero_grad();
    step.run(data::Batch{inputs, labels}, loss, correct);
    finish_step(optimizer, scaler, clip_grad_norm, /*on_device=*/true);
  }
};

CudaGraphStep::CudaGraphStep(TrainStep& step, FlatOptimizer& optimizer,
                             precision::GradScaler* scaler, double clip_grad_norm,
                             int64_t batch_size, torch::Device device) {
  check_cuda_graphs(device, "resident");
  impl_ = std::make_unique<Impl>(step, optimizer, scaler, clip_grad_norm, batch_size, device);
}

CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::captured() const { return impl_->captured; }

void CudaGraphStep::run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) {
  Impl& m = *impl_;
  if (batch.labels.size(0) != m.batch_size) {
    // An epoch's partial last batch: the same step, eagerly (on the current stream, after any
    // replay queued there).
    if (!m.step.overwrites_grads()) m.optimizer.zero_grad();
    m.step.run(batch, loss_sum, correct);
    finish_step(m.optimizer, m.scaler, m.clip_grad_norm, /*on_device=*/true);
    return;
  }
  if (!m.inputs.defined()) {
    m.inputs = torch::empty_like(batch.inputs);
    m.labels = torch::empty_like(batch.labels);
    m.loss = torch::zeros({}, batch.inputs.options().dtype(torch::kFloat32));
    m.correct = torch::zeros({}, batch.labels.options().dtype(torch::kInt64));
  }
  m.inputs.copy_(batch.inputs);
  m.labels.copy_(batch.labels);

  if (!m.captured) {
    // Warm-up and capture run on the side stream (capture is not allowed on the default stream);
    // full synchronisations around them are fine for these few steps.
    synchronize(m.device);
    {
      c10::cuda::CUDAStreamGuard on_side(m.side_stream);
      if (m.warmed_up < kWarmupSteps) {
        m.body();
        ++m.warmed_up;
      } else {
        m.graph.capture_begin();
        m.body();
        m.graph.capture_end();
        m.captured = true;
      }
    }
    synchronize(m.device);
    if (m.captured) m.graph.replay();  // capturing records the step without running it
  } else {
    m.graph.replay();
  }
  loss_sum.add_(m.loss);
  correct.add_(m.correct);
}

#else  // CPU-only LibTorch: check_cuda_graphs always throws first.

struct CudaGraphStep::Impl {};

CudaGraphStep::CudaGraphStep(TrainStep&, FlatOptimizer&, precision::GradScaler*, double, int64_t,
                             torch::Device device) {
  check_cuda_graphs(device, "resident");
  throw Error("--cuda-graphs: this spritetorch was built without CUDA");
}

CudaGraphStep::~CudaGraphStep() = default;
bool CudaGraphStep::captured() const { return false; }
void CudaGraphStep::run(const data::Batch&, torch::Tensor&, torch::Tensor&) {
  throw Error("--cuda-graphs: this spritetorch was built without CUDA");
}

#endif

}  // namespace spritetorch::train
