// The one place where LibTorch versions differ (Debian's 1.13 CPU build vs pip/unpacked 2.x).
// Everything else in spritetorch calls these and never tests TORCH_VERSION_* itself.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#define SPRITETORCH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||              \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace spritetorch::compat {

// size_t in 1.13, a small signed type in 2.x.
inline int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

// torch/mps.h arrived in 2.1; at::hasMPS() exists in both and is false off Apple builds.
inline bool mps_available() { return at::hasMPS(); }

inline std::string torch_version() { return TORCH_VERSION; }

}  // namespace spritetorch::compat
