#include "models/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/compat.h"
#include "common/error.h"
#include "precision/autocast_guard.h"

#if SPRITETORCH_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace spritetorch::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr c10::DeviceType kAutocastTypes[] = {c10::DeviceType::CPU, c10::DeviceType::CUDA};

// A generator's state, read and written under its lock.
torch::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}
void set_generator_state(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

bool capturing_cuda_graph() {
#if SPRITETORCH_WITH_CUDA
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

// What the forward knew and the backward needs besides the saved inputs: the segment, the tensors
// it reads (parameters) and updates (buffers), and the state it ran under.
struct SegmentRecord : torch::CustomClassHolder {
  Segment segment;
  std::vector<torch::Tensor> params;   // as given to apply(): their gradients come back from there
  std::vector<torch::Tensor> buffers;  // put back after the recomputation
  bool autocast_on[2] = {false, false};  // per kAutocastTypes
  torch::ScalarType autocast_dtype[2] = {torch::kFloat32, torch::kFloat32};
  bool preserve_rng = true;
  torch::Tensor cpu_rng;                                          // defined when preserve_rng
  std::vector<std::pair<torch::Device, torch::Tensor>> cuda_rng;  // per CUDA device of the inputs
};

// The generators' states of the forward, for the recomputation; the current ones put back after.
class ForkedRng {
 public:
  explicit ForkedRng(const SegmentRecord& record) {
    if (!record.preserve_rng) return;
    auto cpu = at::detail::getDefaultCPUGenerator();
    restore_.emplace_back(cpu, generator_state(cpu));
    set_generator_state(cpu, record.cpu_rng);
    for (const auto& [device, state] : record.cuda_rng) {
      auto gen = at::globalContext().defaultGenerator(device);
      restore_.emplace_back(gen, generator_state(gen));
      set_generator_state(gen, state);
    }
  }
  ~ForkedRng() {
    for (auto& [gen, state] : restore_) set_generator_state(gen, state);
  }
  ForkedRng(const ForkedRng&) = delete;
  ForkedRng& operator=(const ForkedRng&) = delete;

 private:
  std::vector<std::pair<at::Generator, torch::Tensor>> restore_;
};

// The buffers' values before the recomputation, written back after it (also when it throws). As
// BatchNorm updates its running statistics, without a new version: a backward node outside the
// segment that saved a buffer (a BatchNorm before it) must find it at the version it saved.
class KeptBuffers {
 public:
  explicit KeptBuffers(const std::vector<torch::Tensor>& buffers) : buffers_(buffers) {
    torch::NoGradGuard no_grad;
    for (const auto& b : buffers_) values_.push_back(b.clone());
  }
  ~KeptBuffers() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].variable_data().copy_(values_[i]);
  }
  KeptBuffers(const KeptBuffers&) = delete;
  KeptBuffers& operator=(const KeptBuffers&) = delete;

 private:
  const std::vector<torch::Tensor>& buffers_;
  std::vector<torch::Tensor> values_;
};

struct ActivationCheckpoint : torch::autograd::Function<ActivationCheckpoint> {
  // Runs without grad (Function::apply): autograd records this node, not the segment's ops.
  // params are inputs only so that their gradients come back through backward.
  static variable_list forward(AutogradContext* ctx,
                               const c10::intrusive_ptr<SegmentRecord>& record,
                               torch::TensorList inputs, torch::TensorList /*params*/) {
    ctx->set_materialize_grads(false);  // an output nobody differentiates gets no gradient
    for (size_t i = 0; i < 2; ++i) {
      record->autocast_on[i] = compat::autocast_enabled(kAutocastTypes[i]);
      record->autocast_dtype[i] = compat::autocast_dtype(kAutocastTypes[i]);
    }
    if (record->preserve_rng) {
      record->cpu_rng = generator_state(at::detail::getDefaultCPUGenerator());
      // Under a CUDA graph capture the generators' states are not readable (see the header).
      if (!capturing_cuda_graph())
        for (const auto& x : inputs) {
          if (!x.is_cuda()) continue;
          const bool seen = std::any_of(record->cuda_rng.begin(), record->cuda_rng.end(),
                                        [&](const auto& kept) { return kept.first == x.device(); });
          if (!seen)
            record->cuda_rng.emplace_back(
                x.device(), generator_state(at::globalContext().defaultGenerator(x.device())));
        }
    }
    const std::vector<torch::Tensor> in(inputs.begin(), inputs.end());
    ctx->save_for_backward(in);
    ctx->saved_data["record"] = c10::IValue::make_capsule(record);
    auto out = record->segment(in);
    for (auto& y : out) {
      if (!y.defined())
        throw Error("a checkpointed segment returned an undefined tensor",
                    "return only the tensors it computes");
      // An input passed straight through would alias it: give it a tensor of its own.
      for (const auto& x : in)
        if (y.unsafeGetTensorImpl() == x.unsafeGetTensorImpl()) y = y.clone();
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // Grad mode is on in backward only when it builds a graph of its own (create_graph).
    if (torch::GradMode::is_enabled())
      throw Error("a checkpointed segment cannot be differentiated twice (create_graph)",
                  "run the segment without activation checkpointing");
    const auto record =
        c10::static_intrusive_pointer_cast<SegmentRecord>(ctx->saved_data["record"].toCapsule());
    std::vector<torch::Tensor> inputs;
    for (const auto& saved : ctx->get_saved_variables())
      inputs.push_back(saved.detach().requires_grad_(saved.requires_grad()));

    // Buffers updated once a step, by the forward: put back after the recomputation.
    KeptBuffers kept(record->buffers);
    std::vector<torch::Tensor> out;
    {
      ForkedRng rng(*record);
      // The forward's autocast state (the backward may run on another thread, or outside it).
      std::vector<std::unique_ptr<precision::AutocastGuard>> autocast;
      for (size_t i = 0; i < 2; ++i)
        if (record->autocast_on[i] || compat::autocast_enabled(kAutocastTypes[i]))
          autocast.push_back(std::make_unique<precision::AutocastGuard>(
              kAutocastTypes[i], record->autocast_dtype[i], record->autocast_on[i]));
      torch::AutoGradMode grad_on(true);
      out = record->segment(inputs);
    }
    if (out.size() != grad_out.size())
      throw Error("a checkpointed segment returned " + std::to_string(out.size()) +
                  " tensors when run again in backward, " + std::to_string(grad_out.size()) +
                  " in the forward");

    // Differentiate the outputs that got a gradient with respect to whatever needs one.
    std::vector<torch::Tensor> of, given;
    for (size_t i = 0; i < out.size(); ++i)
      if (grad_out[i].defined() && out[i].requires_grad()) {
        of.push_back(out[i]);
        given.push_back(grad_out[i]);
      }
    std::vector<torch::Tensor> wrt;
    std::vector<size_t> where;  // position in [inputs..., params...]
    auto consider = [&](const torch::Tensor& t, size_t position) {
      if (!t.requires_grad()) return;
      wrt.push_back(t);
      where.push_back(position);
    };
    for (size_t i = 0; i < inputs.size(); ++i) consider(inputs[i], i);
    for (size_t i = 0; i < record->params.size(); ++i)
      consider(record->params[i], inputs.size() + i);
    std::vector<torch::Tensor> grads(inputs.size() + record->params.size());
    if (!of.empty() && !wrt.empty()) {
      const auto g = torch::autograd::grad(of, wrt, given, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t i = 0; i < g.size(); ++i) grads[where[i]] = g[i];
    }
    variable_list result = {torch::Tensor()};  // the record
    result.insert(result.end(), grads.begin(), grads.end());
    return result;
  }
};

std::vector<torch::Tensor> run_checkpointed(Segment segment,
                                            const std::vector<torch::Tensor>& inputs,
                                            std::vector<torch::Tensor> params,
                                            std::vector<torch::Tensor> buffers,
                                            const CheckpointOptions& options) {
  if (!torch::GradMode::is_enabled()) return segment(inputs);  // nothing to differentiate
  auto record = c10::make_intrusive<SegmentRecord>();
  record->segment = std::move(segment);
  record->params = std::move(params);
  record->buffers = std::move(buffers);
  record->preserve_rng = options.preserve_rng;
  return ActivationCheckpoint::apply(record, torch::TensorList(inputs),
                                     torch::TensorList(record->params));
}

}  // namespace

std::vector<torch::Tensor> checkpointed(torch::nn::Module& module, Segment segment,
                                        const std::vector<torch::Tensor>& inputs,
                                        const CheckpointOptions& options) {
  return run_checkpointed(std::move(segment), inputs, module.parameters(), module.buffers(),
                          options);
}

torch::Tensor checkpointed(torch::nn::Module& module,
                           std::function<torch::Tensor(const torch::Tensor&)> segment,
                           const torch::Tensor& x, const CheckpointOptions& options) {
  auto many = [one = std::move(segment)](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{one(in[0])};
  };
  return checkpointed(module, many, {x}, options).at(0);
}

torch::Tensor checkpointed_sequential(torch::nn::Sequential& seq, int64_t segments,
                                      const torch::Tensor& x, const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(seq->size());
  if (segments < 1 || segments > n)
    throw Error("checkpointed_sequential: " + std::to_string(segments) +
                " segments of a Sequential of " + std::to_string(n) + " modules; expected 1 to " +
                std::to_string(n));
  // Modules [begin, end) of the Sequential; a copy of its holder keeps them for the backward.
  auto run = [impl = seq.ptr()](int64_t begin, int64_t end, torch::Tensor h) {
    for (auto it = impl->begin() + begin; it != impl->begin() + end; ++it)
      h = it->forward(std::move(h));
    return h;
  };
  torch::Tensor y = x;
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < segments; ++s) {
    const int64_t end = n * (s + 1) / segments;  // as even as the count allows
    std::vector<torch::Tensor> params, buffers;
    for (auto it = seq->begin() + begin; it != seq->begin() + end; ++it) {
      for (const auto& p : it->ptr()->parameters()) params.push_back(p);
      for (const auto& b : it->ptr()->buffers()) buffers.push_back(b);
    }
    auto segment = [run, begin, end](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{run(begin, end, in[0])};
    };
    y = run_checkpointed(segment, {y}, std::move(params), std::move(buffers), options).at(0);
    begin = end;
  }
  return run(begin, n, y);  // the last segment plainly: backward needs its activations first
}

}  // namespace spritetorch::models
