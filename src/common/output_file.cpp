#include "common/output_file.h"

#include <filesystem>

#include "common/error.h"

namespace spritetorch {

void check_new_output(const std::string& path, bool overwrite, const std::string& flag) {
  std::error_code ec;
  if (overwrite || !std::filesystem::exists(path, ec)) return;
  throw Error("refusing to overwrite " + path + " (given as " + flag + "): the file exists",
              "pass --overwrite to replace it, or choose another path");
}

}  // namespace spritetorch
