#include "resume_command.h"

namespace spritetorch::cli {

namespace {

// POSIX shell quoting: bare when safe, else '...' with ' written as '\''.
std::string quote(const std::string& arg) {
  const bool safe = !arg.empty() && arg.find_first_not_of(
                                        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./:=+,@%") == std::string::npos;
  if (safe) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string resume_command(int argc, char** argv, const std::string& checkpoint) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (arg.rfind("--resume=", 0) == 0) continue;
    out += (out.empty() ? "" : " ") + quote(arg);
  }
  return out + " --resume " + quote(checkpoint);
}

}  // namespace spritetorch::cli
