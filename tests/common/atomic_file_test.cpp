// Atomic whole-file writes (common/atomic_file.h); the torn-write test under a real SIGKILL is in
// tests/reliability/faults_test.cpp.
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/error.h"
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

// Without --overwrite (kKeep) a file that another process made while this one worked is left as it
// is, and the write says so; no temporary is left. Through a link too; kReplace replaces.
TEST(AtomicFile, KeepingAnExistingFileRefusesTheWriteAndLeavesTheFile) {
  ScratchDir dir;
  const std::string out = dir.file("out.pt");
  write_file_atomically(out, "mine", IfExists::kKeep);  // new: written
  try {
    write_file_atomically(out, "theirs", IfExists::kKeep);
    ADD_FAILURE() << "an existing file was replaced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another process made it"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--overwrite"), std::string::npos);
  }
  std::filesystem::create_symlink("out.pt", dir.file("link.pt"));
  EXPECT_THROW(write_file_atomically(dir.file("link.pt"), "theirs", IfExists::kKeep), Error);
  std::ifstream in(out);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "mine");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            2);  // out.pt and link.pt: no temporary left
  write_file_atomically(out, "replaced", IfExists::kReplace);
  std::ifstream again(out);
  again >> text;
  EXPECT_EQ(text, "replaced");
}

// A link stays a link and its target gets the bytes (a dangling one's target is made); a FIFO is
// written into, not replaced by a file: --overwrite of /dev/stdout or a named pipe.
TEST(AtomicFile, ALinkStaysALinkAndAFifoIsWrittenIntoNotReplaced) {
  namespace fs = std::filesystem;
  ScratchDir dir;
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  write_file_atomically(dir.file("real.bin"), "old");
  fs::create_symlink("real.bin", dir.file("link.bin"));
  write_file_atomically(dir.file("link.bin"), "new");
  EXPECT_TRUE(fs::is_symlink(dir.file("link.bin")));
  EXPECT_EQ(read(dir.file("real.bin")), "new");
  fs::create_directory(dir.file("sub"));
  fs::create_symlink("sub/made.bin", dir.file("dangling.bin"));
  EXPECT_EQ(output_target(dir.file("dangling.bin")), dir.file("sub/made.bin"));
  write_file_atomically(dir.file("dangling.bin"), "made");
  EXPECT_TRUE(fs::is_symlink(dir.file("dangling.bin")));
  EXPECT_EQ(read(dir.file("sub/made.bin")), "made");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.file("sub")), fs::directory_iterator()), 1);

  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(is_special_file(fifo));
  EXPECT_FALSE(is_special_file(dir.file("real.bin")));
  EXPECT_FALSE(is_special_file(dir.path()));
  const pid_t reader = ::fork();
  if (reader == 0) {  // the pipe's reader: exits 0 when it read exactly the bytes
    std::ifstream in(fifo);
    const std::string got(std::istreambuf_iterator<char>(in), {});
    ::_exit(got == "through the pipe" ? 0 : 1);
  }
  ASSERT_GT(reader, 0);
  write_file_atomically(fifo, "through the pipe");
  int status = 0;
  ::waitpid(reader, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(fs::status(fifo).type(), fs::file_type::fifo);
}

// A save killed mid-write leaves ".<name>.tmp-<pid>"; the next save of that file clears the ones
// whose writer is gone, and leaves a live writer's alone.
TEST(AtomicFile, NextWriteRemovesTemporariesOfDeadWriters) {
  ScratchDir dir;
  const pid_t child = testing::pid_of_a_finished_process();
  ASSERT_GT(child, 0);
  const std::string dead = dir.file(".out.bin.tmp-" + std::to_string(child));
  const std::string live = dir.file(".out.bin.tmp-" + std::to_string(::getppid()));
  const std::string other = dir.file(".other.bin.tmp-" + std::to_string(child));
  for (const auto& f : {dead, live, other}) std::ofstream(f) << "half a checkpoint";
  write_file_atomically(dir.file("out.bin"), "whole");
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(live)) << "a running writer's file must stay";
  EXPECT_TRUE(std::filesystem::exists(other)) << "only the saved file's temporaries are touched";
}

// Two threads of one process writing one file at once each have a temporary of their own: every
// write succeeds, the file is one of them whole, and no temporary is left.
TEST(AtomicFile, TwoThreadsWritingOneFileAtOnceBothSucceed) {
  ScratchDir dir;
  const std::string path = dir.file("cache.bin");
  const std::string a(64 * 1024, 'a'), b(64 * 1024, 'b');
  std::atomic<int> failures{0};
  const auto writer = [&](const std::string& bytes) {
    for (int i = 0; i < 100; ++i) try {
        write_file_atomically(path, bytes);
      } catch (const Error&) {
        ++failures;
      }
  };
  std::thread first(writer, a), second(writer, b);
  first.join();
  second.join();
  EXPECT_EQ(failures.load(), 0);
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(text == a || text == b);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

// A name near the longest a folder takes (255 bytes) is written: its temporary's name is cut to
// fit, and the temporaries a dead writer left under that cut name are still removed.
TEST(AtomicFile, ANameNearTheLongestAFolderTakesIsWritten) {
  ScratchDir dir;
  const std::string name = std::string(250, 'a') + ".pt";
  const pid_t child = testing::pid_of_a_finished_process();
  ASSERT_GT(child, 0);
  const std::string dead = dir.file("." + std::string(234, 'a') + ".tmp-" + std::to_string(child));
  std::ofstream(dead) << "half";
  ASSERT_TRUE(std::filesystem::exists(dead));
  write_file_atomically(dir.file(name), "whole");
  std::ifstream in(dir.file(name));
  std::string text;
  in >> text;
  EXPECT_EQ(text, "whole");
  EXPECT_FALSE(std::filesystem::exists(dead));
}

}  // namespace
}  // namespace spritetorch
