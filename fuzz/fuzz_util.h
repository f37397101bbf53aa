// Shared pieces of the libFuzzer targets (fuzz/*_fuzzer.cpp).
//
// The contract every reader must keep, whatever the bytes: return normally or throw
// spritetorch::Error (the CLI's clean exit 2). Anything else -- a crash, a sanitizer report,
// another exception type, a hang, an allocation beyond libFuzzer's -rss_limit_mb -- is a finding.
//
// A reader that takes a path plugs in with three lines (a new file fuzz/<name>_fuzzer.cpp):
//
//   #include "fuzz_util.h"
//   #include "io/png.h"
//   SPRITETORCH_FUZZ_PATH_READER(spritetorch::io::read_png(path))
//
// then seeds in fuzz/corpus/<name>_fuzzer/ (a few small valid files, one per feature). CMake picks
// the file up (fuzz/CMakeLists.txt globs *_fuzzer.cpp) and scripts/fuzz runs it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "common/error.h"

namespace spritetorch::fuzz {

// One in-memory file (memfd) whose contents are replaced by each input; path() names it for readers
// that open files by name (/proc/self/fd/N). No disk traffic, no clean-up between inputs.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("spritetorch-fuzz", 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& path() const { return path_; }
  void assign(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0) std::abort();
    while (size > 0) {
      const ssize_t n = ::write(fd_, data, size);
      if (n <= 0) std::abort();
      data += n;
      size -= static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  std::string path_;
};

// Runs `body`; spritetorch::Error is the expected outcome for bad input, everything else aborts
// with the exception's text so that libFuzzer saves the input.
template <typename Body>
int expect_clean(Body&& body) {
  try {
    body();
  } catch (const spritetorch::Error&) {
    // a clear error: what hostile input must get
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: escaped exception %s (not spritetorch::Error): %s\n",
                 typeid(e).name(), e.what());
    std::abort();
  }
  return 0;
}

}  // namespace spritetorch::fuzz

// Defines the fuzz entry point for a reader called on a file path: `call` sees `path`.
#define SPRITETORCH_FUZZ_PATH_READER(call)                                  \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    static spritetorch::fuzz::MemFile file;                                 \
    file.assign(data, size);                                                \
    const std::string& path = file.path();                                  \
    return spritetorch::fuzz::expect_clean([&] { (void)(call); });          \
  }
