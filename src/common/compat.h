// The one place where LibTorch versions differ (Debian's 1.13 CPU build vs pip/unpacked 2.x).
// Everything else in spritetorch calls these and never tests TORCH_VERSION_* itself.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <variant>

#define SPRITETORCH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||              \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace spritetorch::compat {

// size_t in 1.13, a small signed type in 2.x.
inline int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

// torch/mps.h arrived in 2.1; at::hasMPS() exists in both and is false off Apple builds.
inline bool mps_available() { return at::hasMPS(); }

inline std::string torch_version() { return TORCH_VERSION; }

// --- autocast (precision/autocast_guard.h) -------------------------------------------------------
// 1.13 to 2.3: one pair of functions per backend (set_enabled / set_cpu_enabled, the "gpu" and
// "cpu" dtype). 2.4 added device-typed functions and deprecated the old ones (a warning, so an
// error under -Werror), hence the split at 2.4. Only CPU and CUDA are offered: MPS autocast exists
// only in newer releases and is not wired up here.
inline bool autocast_supported(c10::DeviceType type) {
  return type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA;
}

inline bool autocast_enabled(c10::DeviceType type) {
#if SPRITETORCH_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                       : at::autocast::is_cpu_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType type, bool enabled) {
#if SPRITETORCH_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == c10::DeviceType::CUDA)
    at::autocast::set_enabled(enabled);
  else
    at::autocast::set_cpu_enabled(enabled);
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType type) {
#if SPRITETORCH_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType type, at::ScalarType dtype) {
#if SPRITETORCH_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CUDA)
    at::autocast::set_autocast_gpu_dtype(dtype);
  else
    at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

// --- fused AMP kernels (precision/grad_scaler.h) -------------------------------------------------
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ have CUDA kernels in every
// release we build against; CPU kernels arrived in 2.3. Elsewhere the scaler uses plain tensor ops.
inline bool fused_amp_kernels(const torch::Device& device) {
  if (device.is_cuda()) return true;
#if SPRITETORCH_TORCH_AT_LEAST(2, 3)
  if (device.is_cpu()) return true;
#endif
  return false;
}

// --- CBLAS (common/blas.h) -----------------------------------------------------------------------
// Debian's LibTorch 1.13 links the system libblas.so.3 (OpenBLAS after scripts/setup), whose
// cblas_sgemm the CPU MLP step calls. pip and unpacked LibTorch 2.x builds carry MKL inside
// libtorch_cpu without exporting it; there the step falls back to FusedMlpStep. The tests use this
// to tell a missing symbol that is expected from a broken Debian setup.
inline bool cblas_expected() { return !SPRITETORCH_TORCH_AT_LEAST(2, 0); }

// --- module options' variants (conv padding, padding_mode) ---------------------------------------
// 1.13's options hold a c10::variant with its own c10::get_if / c10::holds_alternative; 2.x holds
// a std::variant, and c10's functions are gone. With std's in scope an unqualified call finds std's
// for a std::variant and, by argument-dependent lookup, c10's for a c10::variant, whichever release
// this is (no version number to get wrong).
template <typename T, typename Variant>
const T* variant_get_if(const Variant& value) {
  using std::get_if;
  return get_if<T>(&value);
}

template <typename T, typename Variant>
bool variant_holds(const Variant& value) {
  using std::holds_alternative;
  return holds_alternative<T>(value);
}

}  // namespace spritetorch::compat
