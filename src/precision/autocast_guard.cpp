#include "precision/autocast_guard.h"

#include "common/compat.h"
#include "common/error.h"

namespace spritetorch::precision {

AutocastGuard::AutocastGuard(c10::DeviceType device_type, torch::ScalarType dtype, bool enabled,
                             bool cache_enabled)
    : device_type_(device_type) {
  if (!compat::autocast_supported(device_type))
    throw Error("autocast is not available for device type " + c10::DeviceTypeName(device_type),
                "use --precision fp32");
  previous_enabled_ = compat::autocast_enabled(device_type);
  previous_dtype_ = compat::autocast_dtype(device_type);
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::increment_nesting();
  compat::set_autocast_enabled(device_type, enabled);
  // A disabled guard leaves the dtype alone: LibTorch 1.13 refuses any CPU autocast dtype but
  // bf16, and a disabled scope has no use for one.
  if (enabled) compat::set_autocast_dtype(device_type, dtype);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastGuard::~AutocastGuard() {
  compat::set_autocast_enabled(device_type_, previous_enabled_);
  if (compat::autocast_dtype(device_type_) != previous_dtype_)
    compat::set_autocast_dtype(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
  // Python's autocast.__exit__ does the same: the last guard out drops the cached weight casts.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace spritetorch::precision
