#include "train/data_parallel.h"

#include "common/error.h"

#if SPRITETORCH_WITH_CUDA
// Only usable with CUDA headers (it includes ATen/cuda): CPU-only LibTorch packages lack them.
#include <torch/nn/parallel/data_parallel.h>
#endif

namespace spritetorch::train {

DataParallelClassifierImpl::DataParallelClassifierImpl(models::Classifier inner,
                                                       std::vector<torch::Device> devices)
    : inner_(std::move(inner)), devices_(std::move(devices)) {
  if (devices_.empty()) throw Error("DataParallel needs at least one device");
}

torch::Tensor DataParallelClassifierImpl::forward(torch::Tensor x) {
  inner_->train(is_training());  // the wrapper's mode decides, as for a registered submodule
#if SPRITETORCH_WITH_CUDA
  return torch::nn::parallel::data_parallel(inner_, std::move(x), devices_, devices_.front());
#else
  // What data_parallel itself does for one device; more than one needs CUDA's scatter/gather.
  if (devices_.size() != 1)
    throw Error("DataParallel over several devices needs a CUDA build of spritetorch");
  return inner_->forward(std::move(x).to(devices_.front()));
#endif
}

}  // namespace spritetorch::train
