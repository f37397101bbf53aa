// try_in_child_process: a reader that crashes in the child is a DataError in the parent; one that
// throws or returns leaves the verdict to the caller; one that hangs is given up on.
#include "common/crash_guard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "test_util.h"

namespace spritetorch {
namespace {

using testing::error_of;

TEST(CrashGuard, AReaderThatCrashesIsADataErrorNamingTheFileAndTheSignal) {
  const std::string message = error_of(
      [] { try_in_child_process([] { std::abort(); }, "net.pt", "a TorchScript module"); });
  EXPECT_NE(message.find("net.pt: expected a TorchScript module, found a file whose reading "
                         "crashed the reader (signal " +
                         std::to_string(SIGABRT) + ", in a child process)"),
            std::string::npos)
      << message;
}

TEST(CrashGuard, AReaderThatThrowsOrReturnsLeavesTheVerdictToTheCaller) {
  EXPECT_EQ(error_of([] {
              try_in_child_process([] { throw std::runtime_error("bad"); }, "f", "a file");
            }),
            "");
  EXPECT_EQ(error_of([] { try_in_child_process([] {}, "f", "a file"); }), "");
}

TEST(CrashGuard, AReaderThatHangsIsGivenUpOn) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of([] {
              try_in_child_process([] { std::this_thread::sleep_for(std::chrono::seconds(30)); },
                                   "f", "a file", /*give_up_s=*/0.2);
            }),
            "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace spritetorch
