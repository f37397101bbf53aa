// Errors that reach the user. Each says what went wrong and, where we know it, what to do about it.
// The CLI turns an Error into "error: <what>\nhint: <hint>" and exit code 2 (an IncompleteRun: 1);
// anything else is a bug (exit 1).
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace spritetorch {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {})
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// A file that is not what it claims to be. The message always names the file, what was expected
// and what was found.
class DataError : public Error {
 public:
  DataError(const std::string& file, const std::string& expected, const std::string& found,
            std::string hint = {})
      : Error(file + ": expected " + expected + ", found " + found, std::move(hint)) {}
};

// Work that was done but could not be delivered where asked (a --save that a full disk refused
// after training: the weights are kept elsewhere and the message says where). Not bad input: the
// CLI exits 1, as for a run that could not be completed.
class IncompleteRun : public Error {
 public:
  using Error::Error;
};

// The first line of an exception's text: LibTorch's messages go on with a backtrace or the
// operator's context, which a one-line error does not carry.
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Whether LibTorch's error text is a failed host allocation ("can't allocate memory: you tried to
// allocate N bytes", "DefaultCPUAllocator: not enough memory"): input that asked for too much,
// told as out of memory, not a bug of ours.
inline bool is_host_allocation_failure(const std::string& message) {
  return message.find("not enough memory") != std::string::npos ||
         message.find("to allocate") != std::string::npos;
}

// What to do about a write that failed with `message` (an error naming the file and strerror's
// reason), as the first words of a hint: a file-size limit (ulimit -f: "File too large") or a
// folder that takes no files is not helped by freeing space.
inline std::string make_room_hint(const std::string& message) {
  if (message.find(std::strerror(EFBIG)) != std::string::npos)
    return "raise the file-size limit (ulimit -f), or write to a file system that allows the size";
  if (message.find(std::strerror(EACCES)) != std::string::npos ||
      message.find(std::strerror(EROFS)) != std::string::npos)
    return "make the folder writable";
  if (message.find(std::strerror(ENAMETOOLONG)) != std::string::npos)
    return "choose a shorter name";
  return "free some space";
}

}  // namespace spritetorch
