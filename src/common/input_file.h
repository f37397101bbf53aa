// Every file a command reads whole (checkpoints, PNGs, safetensors, label files) is checked to be
// a file first: /dev/zero or a folder would otherwise be read until memory runs out, or fail with
// a message about something else.
#pragma once

#include <string>

namespace spritetorch {

// Throws DataError naming `path`, `expected` and what is there instead: nothing, a folder, or a
// device or socket. Regular files pass, and pipes (`classify /dev/stdin < x.png`): a pipe ends when
// its writer does.
void check_input_file(const std::string& path, const std::string& expected);

}  // namespace spritetorch
