#include "distributed/grad_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "common/error.h"

namespace spritetorch::distributed {

GradReducer::GradReducer(std::shared_ptr<Communicator> comm, std::vector<torch::Tensor> parameters,
                         torch::Tensor flat_grads, ReducerOptions options)
    : comm_(std::move(comm)),
      parameters_(std::move(parameters)),
      flat_grads_(std::move(flat_grads)),
      options_(options) {
  if (!comm_) throw Error("gradient reducer: no communicator");
  if (!(options_.bucket_mb > 0))
    throw Error("--bucket-mb must be positive, got " + std::to_string(options_.bucket_mb));
  if (!flat_grads_.defined() || flat_grads_.dim() != 1 || !flat_grads_.is_contiguous())
    throw Error("gradient reducer: the gradients must live in one flat contiguous buffer");

  // Offsets of each parameter's gradient in the flat buffer, checked against the real views.
  const auto* base = static_cast<const char*>(flat_grads_.data_ptr());
  const int64_t element = static_cast<int64_t>(flat_grads_.element_size());
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& grad = parameters_[i].grad();
    if (!grad.defined() || static_cast<const char*>(grad.data_ptr()) - base != offset * element)
      throw Error("gradient reducer: parameter " + std::to_string(i) +
                  "'s gradient is not the flat buffer's slice at offset " + std::to_string(offset));
    offsets.push_back(offset);
    index_of_[parameters_[i].unsafeGetTensorImpl()] = i;
    offset += parameters_[i].numel();
  }
  if (offset != flat_grads_.numel())
    throw Error("gradient reducer: the parameters cover " + std::to_string(offset) + " of the " +
                std::to_string(flat_grads_.numel()) + " gradient values");

  // Buckets from the last parameter backwards; each a contiguous range of parameters.
  const int64_t capacity =
      std::max<int64_t>(1, static_cast<int64_t>(options_.bucket_mb * 1024 * 1024) / element);
  bucket_of_param_.assign(parameters_.size(), 0);
  size_t end = parameters_.size();
  while (end > 0) {
    size_t first = end;
    int64_t numel = 0;
    while (first > 0 && (numel == 0 || numel + parameters_[first - 1].numel() <= capacity)) {
      --first;
      numel += parameters_[first].numel();
    }
    Bucket b;
    b.first_param = first;
    b.end_param = end;
    b.offset = offsets[first];
    b.numel = numel;
    for (size_t i = first; i < end; ++i) bucket_of_param_[i] = buckets_.size();
    buckets_.push_back(b);
    end = first;
  }
  param_ready_.assign(parameters_.size(), false);
  pending_in_bucket_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    pending_in_bucket_[b] = static_cast<int64_t>(buckets_[b].end_param - buckets_[b].first_param);
}

GradReducer::~GradReducer() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
  // Collectives still in flight (an exception unwound the step) must end before their buffer does.
  for (auto& op : in_flight_) {
    try {
      op->wait();
    } catch (...) {
    }
  }
}

void GradReducer::install_autograd_hooks() {
  if (!options_.overlap || !hooks_.empty()) return;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    // The AccumulateGrad node is held weakly by the parameter; holding it here keeps the hook
    // alive across steps (DDP's reducer does the same).
    auto node = torch::autograd::impl::grad_accumulator(parameters_[i]);
    if (!node)
      throw Error("gradient reducer: parameter " + std::to_string(i) + " needs no gradient");
    const uintptr_t key =
        node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              mark_ready_index(i);
              return outputs;
            }));
    hooks_.emplace_back(std::move(node), key);
  }
}

void GradReducer::mark_ready(const torch::Tensor& parameter) {
  if (!options_.overlap) return;
  auto it = index_of_.find(parameter.unsafeGetTensorImpl());
  if (it != index_of_.end()) mark_ready_index(it->second);
}

void GradReducer::mark_ready_index(size_t index) {
  if (!options_.overlap) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (param_ready_[index]) return;
  param_ready_[index] = true;
  if (--pending_in_bucket_[bucket_of_param_[index]] == 0) launch_ready_buckets();
}

void GradReducer::launch_ready_buckets() {
  torch::NoGradGuard no_grad;
  const double world = static_cast<double>(comm_->world_size());
  while (next_launch_ < buckets_.size() && pending_in_bucket_[next_launch_] == 0) {
    const Bucket& b = buckets_[next_launch_];
    auto slice = flat_grads_.narrow(0, b.offset, b.numel);  // (numel) view of the flat buffer
    slice.div_(world);  // sum of the averages = the average over ranks
    in_flight_.push_back(comm_->allreduce_sum_async(slice));
    ++next_launch_;
    ++launched_early_;
  }
}

void GradReducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  last_launched_early_ = launched_early_;
  // Whatever backward did not complete (unused parameters, or overlap off): launch in order now.
  for (auto& pending : pending_in_bucket_) pending = 0;
  launch_ready_buckets();
  std::vector<std::unique_ptr<PendingOp>> ops;
  ops.swap(in_flight_);
  // Reset first, so an exception below leaves the reducer ready for nothing but destruction.
  next_launch_ = 0;
  launched_early_ = 0;
  std::fill(param_ready_.begin(), param_ready_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b)
    pending_in_bucket_[b] = static_cast<int64_t>(buckets_[b].end_param - buckets_[b].first_param);
  for (auto& op : ops) op->wait();
}

}  // namespace spritetorch::distributed
