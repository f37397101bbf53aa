#include "common/output_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/error.h"

namespace spritetorch {

void check_new_output(const std::string& path, bool overwrite, const std::string& flag) {
  std::error_code ec;
  // A device or FIFO (/dev/stdout, a named pipe) holds no data to lose: it is written into.
  if (overwrite || !std::filesystem::exists(path, ec) || is_special_file(path)) return;
  throw Error("refusing to overwrite " + path + " (given as " + flag + "): the file exists",
              "pass --overwrite to replace it, or choose another path");
}

void check_output_path(const std::string& path, bool overwrite, const std::string& flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("cannot write " + path + " (given as " + flag + "): it is a folder",
                "give a file name");
  if (is_special_file(path)) return;  // written into as it is (atomic_file.h)
  // A symlink's target is the file replaced, in its own folder.
  const std::filesystem::path target = output_target(path);
  const auto folder = target.parent_path();
  if (!folder.empty() && !std::filesystem::is_directory(folder, ec)) {
    // The nearest part of the path that is there: a file where a folder should be says so.
    auto there = folder;
    while (!there.empty() && !std::filesystem::exists(there, ec)) there = there.parent_path();
    if (!there.empty() && !std::filesystem::is_directory(there, ec))
      throw Error("cannot write " + path + " (given as " + flag + "): " + there.string() +
                      " is a file, not a folder",
                  "choose another path");
    throw Error("cannot write " + path + " (given as " + flag + "): the folder " + folder.string() +
                    " does not exist",
                "create it first, or choose another path");
  }
  // A name longer than a folder takes would fail only when written, after the work.
  const auto name = target.filename().string();
  const long name_max = ::pathconf(folder.empty() ? "." : folder.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && name.size() > static_cast<size_t>(name_max))
    throw Error("cannot write " + path + " (given as " + flag + "): its name is " +
                    std::to_string(name.size()) + " bytes, and the folder takes names of at most " +
                    std::to_string(name_max),
                "choose a shorter name");
  // Files are written through a temporary file in the same folder (atomic_file.h), so the folder
  // must take new files even where `path` exists and is writable.
  // A file is made there and removed: permission bits alone pass folders that take no files
  // (/proc, a read-only mount) for root.
  const auto dir = folder.empty() ? std::filesystem::path(".") : folder;
  const auto probe = dir / (".spritetorch-probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno != EEXIST)
    throw Error("cannot write " + path + " (given as " + flag + "): the folder " + dir.string() +
                    " is not writable (" + std::strerror(errno) + ")",
                "choose a folder you may write to");
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  check_new_output(path, overwrite, flag);
}

uint64_t free_bytes_for(const std::string& path) {
  const auto folder = std::filesystem::path(path).parent_path();
  struct statvfs fs {};
  if (::statvfs(folder.empty() ? "." : folder.c_str(), &fs) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_frsize);
}

void check_room_for(const std::string& path, uint64_t bytes, const std::string& flag) {
  const uint64_t free = free_bytes_for(path);
  if (free >= bytes) return;
  const auto folder = std::filesystem::path(path).parent_path();
  throw Error("no room for " + path + " (given as " + flag + "): it takes at least " +
                  byte_size_text(static_cast<double>(bytes)) + ", and " +
                  (folder.empty() ? "." : folder.string()) + " has " +
                  byte_size_text(static_cast<double>(free)) + " free",
              "free some space, or choose another path");
}

std::string rescue_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path folder = fs::temp_directory_path(ec);
  if (ec) folder = "/tmp";
  const fs::path name(path);
  // The stem cut so that the whole name fits with "spritetorch-", the pid, a count and the
  // extension.
  const std::string extension = name.extension().string().substr(0, 32);
  const std::string stem =
      name.stem().string().substr(0, kMaxNameBytes - 12 - 24 - extension.size());
  for (int n = 0;; ++n) {
    const fs::path candidate = folder / ("spritetorch-" + stem + "-" + std::to_string(::getpid()) +
                                         (n ? "-" + std::to_string(n) : "") + extension);
    if (!fs::exists(candidate, ec)) return candidate.string();
  }
}

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) {
    const bool same = fs::equivalent(a, b, ec);
    if (!ec) return same;
  }
  const auto full_a = fs::weakly_canonical(fs::absolute(a, ec), ec);
  const auto full_b = fs::weakly_canonical(fs::absolute(b, ec), ec);
  return full_a == full_b;
}

std::string file_name_part(const std::string& name) {
  std::string part;
  for (const char c : name) {
    const auto u = static_cast<unsigned char>(c);
    const bool keep = u >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '+';
    part += keep ? c : '_';
  }
  if (part.empty() || part[0] == '.') part.insert(part.begin(), '_');
  return part;
}

}  // namespace spritetorch
