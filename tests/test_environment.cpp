// Set before any test runs: every test process, and every `spritetorch` process a test starts,
// keeps its dataset cache (data/idx_cache.h) in the build tree, never in the user's home.
#include <cstdlib>

namespace {
const bool kCacheInBuildTree = [] {
  ::setenv("XDG_CACHE_HOME", SPRITETORCH_TEST_CACHE_HOME, 1);
  return true;
}();
}  // namespace
