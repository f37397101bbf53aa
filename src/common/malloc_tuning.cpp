#include "common/malloc_tuning.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// AddressSanitizer replaces malloc: glibc's thresholds do not apply there.
#if defined(__SANITIZE_ADDRESS__)
#define SPRITETORCH_OWN_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPRITETORCH_OWN_MALLOC 1
#endif
#endif

namespace spritetorch {

bool keep_freed_memory_for_reuse() {
#if defined(__GLIBC__) && !defined(SPRITETORCH_OWN_MALLOC)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return false;
  constexpr int kMmapThreshold = 256 << 20, kTrimThreshold = 512 << 20;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

int64_t heap_in_use_bytes() {
#if defined(__GLIBC__) && !defined(SPRITETORCH_OWN_MALLOC)
#if __GLIBC_PREREQ(2, 33)
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
#endif
#endif
  return -1;
}

}  // namespace spritetorch
