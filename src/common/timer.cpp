#include "common/timer.h"

#include <cmath>
#include <cstdio>

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

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_duration(double seconds, bool keep_tenths) {
  // (beyond ~3e14 h, long long hours overflow)
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e15) return "?";
  const bool tenths = keep_tenths && std::fabs(seconds - std::round(seconds)) > 1e-9;
  const auto whole = static_cast<long long>(tenths ? seconds : std::round(seconds));
  const long long h = whole / 3600, m = whole / 60 % 60;
  const double s =
      tenths ? seconds - static_cast<double>(whole - whole % 60) : static_cast<double>(whole % 60);
  char buffer[48];
  if (h > 0)
    std::snprintf(buffer, sizeof buffer, tenths ? "%lld:%02lld:%04.1f" : "%lld:%02lld:%02.0f", h, m,
                  s);
  else
    std::snprintf(buffer, sizeof buffer, tenths ? "%lld:%04.1f" : "%lld:%02.0f", whole / 60, s);
  return buffer;
}

}  // namespace spritetorch
