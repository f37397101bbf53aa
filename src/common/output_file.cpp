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

void check_output_path(const std::string& path, bool overwrite, const std::string& flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("cannot write " + path + " (given as " + flag + "): it is a folder",
                "give a file name");
  const auto folder = std::filesystem::path(path).parent_path();
  if (!folder.empty() && !std::filesystem::is_directory(folder, ec))
    throw Error("cannot write " + path + " (given as " + flag + "): the folder " + folder.string() +
                    " does not exist",
                "create it first, or choose another path");
  check_new_output(path, overwrite, flag);
}

}  // namespace spritetorch
