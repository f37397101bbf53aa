// Whole-file writes that a crash cannot tear: checkpoints, sprite sheets and exported tensor files
// all go through here, so it sits in common/ below every module that writes files.
#pragma once

#include <string>

namespace spritetorch {

// Writes `bytes` to `path` atomically: a temporary file in the same folder, flushed and fsynced,
// then renamed over the target, so a crash leaves either the old file or the new one. Temporaries
// left by writers that died are removed. Throws Error naming the file on failure.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace spritetorch
