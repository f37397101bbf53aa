#include "common/timer.h"

#if SPRITETORCH_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace spritetorch {

void synchronize(const torch::Device& device) {
#if SPRITETORCH_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::device_synchronize();
  }
#else
  (void)device;
#endif
  // MPS: LibTorch 1.13 exposes no C++ synchronise; a .cpu() copy of a result is the barrier there.
}

}  // namespace spritetorch
