#include "common/malloc_tuning.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace spritetorch {
namespace {

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZER_MALLOC 1
#endif
#endif

TEST(MallocTuning, TunesGlibcUnlessTheUserAlreadyDid) {
#if defined(__GLIBC__) && !defined(SANITIZER_MALLOC)
  ASSERT_EQ(setenv("MALLOC_MMAP_THRESHOLD_", "131072", 1), 0);
  EXPECT_FALSE(keep_freed_memory_for_reuse()) << "the user's setting wins";
  ASSERT_EQ(unsetenv("MALLOC_MMAP_THRESHOLD_"), 0);
  EXPECT_TRUE(keep_freed_memory_for_reuse());
#else
  EXPECT_FALSE(keep_freed_memory_for_reuse());
#endif
}

}  // namespace
}  // namespace spritetorch
