#include "common/input_file.h"

#include <filesystem>

#include "common/error.h"

namespace spritetorch {

void check_input_file(const std::string& path, const std::string& expected) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  switch (status.type()) {
    case fs::file_type::regular:
    case fs::file_type::fifo:
      return;
    case fs::file_type::not_found:
      throw DataError(path, expected, "no such file");
    case fs::file_type::directory:
      throw DataError(path, expected, "a folder");
    case fs::file_type::character:
    case fs::file_type::block:
      throw DataError(path, expected, "a device, not a file");
    case fs::file_type::socket:
      throw DataError(path, expected, "a socket, not a file");
    default:
      if (ec) throw DataError(path, expected, "a path that cannot be read (" + ec.message() + ")");
      throw DataError(path, expected, "something that is not a file");
  }
}

}  // namespace spritetorch
