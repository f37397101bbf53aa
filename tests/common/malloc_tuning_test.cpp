#include "common/malloc_tuning.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "test_util.h"

namespace spritetorch {
namespace {

TEST(MallocTuning, TunesGlibcUnlessTheUserAlreadyDid) {
#if defined(__GLIBC__) && !defined(SPRITETORCH_TEST_ASAN)
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
