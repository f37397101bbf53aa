// Atomic whole-file writes (common/atomic_file.h); the torn-write test under a real SIGKILL is in
// tests/reliability/faults_test.cpp.
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "test_util.h"

namespace spritetorch {
namespace {

using spritetorch::testing::ScratchDir;

TEST(AtomicFile, WriteLeavesNoTemporaryFiles) {
  ScratchDir dir;
  write_file_atomically(dir.file("out.bin"), "first");
  write_file_atomically(dir.file("out.bin"), "second");
  std::ifstream in(dir.file("out.bin"));
  std::string text;
  in >> text;
  EXPECT_EQ(text, "second");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
}

// A save killed mid-write leaves ".<name>.tmp-<pid>"; the next save of that file clears the ones
// whose writer is gone, and leaves a live writer's alone.
TEST(AtomicFile, NextWriteRemovesTemporariesOfDeadWriters) {
  ScratchDir dir;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // reaped: this pid names no process now
  const std::string dead = dir.file(".out.bin.tmp-" + std::to_string(child));
  const std::string live = dir.file(".out.bin.tmp-" + std::to_string(::getppid()));
  const std::string other = dir.file(".other.bin.tmp-" + std::to_string(child));
  for (const auto& f : {dead, live, other}) std::ofstream(f) << "half a checkpoint";
  write_file_atomically(dir.file("out.bin"), "whole");
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(live)) << "a running writer's file must stay";
  EXPECT_TRUE(std::filesystem::exists(other)) << "only the saved file's temporaries are touched";
}

}  // namespace
}  // namespace spritetorch
