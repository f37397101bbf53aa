// The test binary's main: GoogleTest's, except that a run whose every case was skipped (a suite of
// GPU tests on a CPU machine, say) exits 77, which ctest reports as skipped (SKIP_RETURN_CODE in
// cmake/SpritetorchTestSuites.cmake) rather than passed.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const auto& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0) return 77;
  return result;
}
