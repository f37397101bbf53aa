// The output rules every command shares (common/output_file.h).
#include "common/output_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/atomic_file.h"
#include "common/error.h"
#include "test_util.h"

namespace spritetorch {
namespace {

using spritetorch::testing::ScratchDir;

TEST(OutputFile, SameFileSeesThroughSpellingsAndLinksWhetherTheFileExistsOrNot) {
  ScratchDir dir;
  const std::string a = dir.file("a.safetensors");
  EXPECT_TRUE(same_file(a, dir.file("./a.safetensors")));  // neither exists yet
  EXPECT_TRUE(same_file(a, dir.file("sub/../a.safetensors")));
  EXPECT_FALSE(same_file(a, dir.file("b.safetensors")));
  std::ofstream(a) << "x";
  std::filesystem::create_symlink(a, dir.file("link.safetensors"));
  EXPECT_TRUE(same_file(a, dir.file("link.safetensors")));
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  EXPECT_TRUE(same_file("a.safetensors", a));
  EXPECT_FALSE(same_file("b.safetensors", a));
  std::filesystem::current_path(cwd);
}

using spritetorch::testing::error_of;

// Room is measured on the file system the output goes to: what it has passes, more than any disk
// has is refused before any work, naming the path, the size and what is free; a rescue path is
// in the temp folder, keeps the name's stem and extension, and is not taken.
TEST(OutputFile, AnOutputThatCannotFitIsRefusedAndARescuePathIsFree) {
  ScratchDir dir;
  const std::string target = dir.file("model.pt");
  const uint64_t free = free_bytes_for(target);
  ASSERT_GT(free, 0u);
  EXPECT_NO_THROW(check_room_for(target, 1, "--save"));
  const std::string message = error_of([&] { check_room_for(target, UINT64_MAX / 2, "--save"); });
  EXPECT_NE(message.find("no room for " + target + " (given as --save): it takes at least"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("free"), std::string::npos) << message;
  const std::string rescue = rescue_path(target);
  const auto path = std::filesystem::path(rescue);
  EXPECT_EQ(path.parent_path(), std::filesystem::temp_directory_path());
  EXPECT_EQ(path.extension(), ".pt");
  EXPECT_EQ(path.filename().string().rfind("spritetorch-model-", 0), 0u) << rescue;
  EXPECT_FALSE(std::filesystem::exists(path));
  std::ofstream(rescue) << "x";  // taken now: the next one is another name
  EXPECT_NE(rescue_path(target), rescue);
  std::filesystem::remove(path);
}

// A folder that takes no new files fails at the check, before any work, naming the target; a
// write that fails anyway names the target too, not the temporary file it goes through.
TEST(OutputFile, AFolderThatTakesNoNewFilesIsRefusedBeforeAnyWork) {
  ScratchDir dir;
  const std::string ro = dir.file("ro"), target = dir.file("ro/x.png");
  std::filesystem::create_directory(ro);
  ::chmod(ro.c_str(), 0555);
  const std::string wanted = "cannot write " + target + " (given as --out): the folder " + ro +
                             " is not writable (Permission denied)";
  auto checks = [&] {
    return error_of([&] { check_output_path(target, false, "--out"); }) == wanted &&
           error_of([&] { write_file_atomically(target, "x"); }) ==
               "cannot write " + target + ": Permission denied";
  };
  if (::geteuid() != 0) {
    EXPECT_TRUE(checks());
    return;
  }
  // root may write anywhere: the checks run as nobody in a child.
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(::setuid(65534) == 0 && checks() ? 0 : 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "as nobody: " << error_of([&] { check_output_path(target, false, "--out"); });
}

// Permission bits pass /proc for root, yet it takes no files: the check makes one to find out.
TEST(OutputFile, AFolderWhosePermissionsSayWritableButTakesNoFilesIsRefused) {
  if (!std::filesystem::is_directory("/proc/self")) GTEST_SKIP() << "no /proc here";
  const std::string message = error_of([] { check_output_path("/proc/x.pt", false, "--save"); });
  EXPECT_NE(message.find("cannot write /proc/x.pt (given as --save): the folder /proc is not "
                         "writable ("),
            std::string::npos)
      << message;
  ScratchDir dir;  // a folder that takes files passes, and keeps no probe behind
  check_output_path(dir.file("x.pt"), false, "--save");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// A device or FIFO is no file to lose (/dev/stdout, /dev/null): taken without --overwrite, even in
// a folder that takes no new files; a link to a file that is there still needs --overwrite.
TEST(OutputFile, ADeviceIsWrittenIntoWithoutOverwriteAndALinkedFileIsStillProtected) {
  if (std::filesystem::exists("/dev/null")) {
    check_output_path("/dev/null", false, "--out");
    check_new_output("/dev/null", false, "--out");
  }
  ScratchDir dir;
  std::ofstream(dir.file("kept.png")) << "x";
  std::filesystem::create_symlink(dir.file("kept.png"), dir.file("link.png"));
  EXPECT_EQ(error_of([&] { check_output_path(dir.file("link.png"), false, "--out"); }),
            "refusing to overwrite " + dir.file("link.png") + " (given as --out): the file exists");
  check_output_path(dir.file("link.png"), true, "--out");
  // A name longer than the folder takes is refused at the check, not after the work; one near the
  // limit passes (its temporary file's name is cut to fit: atomic_file.cpp).
  const std::string too_long = dir.file(std::string(300, 'a') + ".pt");
  EXPECT_NE(error_of([&] {
              check_output_path(too_long, false, "--save");
            }).find("its name is 303 bytes, and the folder takes names of at most 255"),
            std::string::npos);
  check_output_path(dir.file(std::string(252, 'a') + ".pt"), false, "--save");
  EXPECT_LE(std::filesystem::path(rescue_path(dir.file(std::string(252, 'a') + ".pt")))
                .filename()
                .string()
                .size(),
            255u);
}

// Class names from a user's labels file become sprite file names (generate --out-dir): none may
// leave the folder, hide the file or be empty; ordinary and UTF-8 names stay as they are.
TEST(OutputFile, FileNamePartKeepsEveryNameInsideItsFolder) {
  EXPECT_EQ(file_name_part("robot"), "robot");
  EXPECT_EQ(file_name_part("long-sword_2.v+1"), "long-sword_2.v+1");
  EXPECT_EQ(file_name_part("\xc3\xa9p\xc3\xa9\x65"), "\xc3\xa9p\xc3\xa9\x65");  // "épée"
  EXPECT_EQ(file_name_part("../evil"), "_.._evil");
  EXPECT_EQ(file_name_part(".."), "_..");
  EXPECT_EQ(file_name_part(".hidden"), "_.hidden");
  EXPECT_EQ(file_name_part("a/b\\c d\n"), "a_b_c_d_");
  EXPECT_EQ(file_name_part(std::string("x\0y", 3)), "x_y");
  EXPECT_EQ(file_name_part(""), "_");
  ScratchDir dir;
  for (const std::string name : {"../evil", "..", "/etc/passwd", "a/../../b"}) {
    const std::filesystem::path file = dir.file(file_name_part(name) + "_0000.png");
    EXPECT_EQ(std::filesystem::weakly_canonical(file).parent_path(),
              std::filesystem::weakly_canonical(dir.path()))
        << name;
  }
}

}  // namespace
}  // namespace spritetorch
