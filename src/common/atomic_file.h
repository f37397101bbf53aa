// Whole-file writes that a crash cannot tear: checkpoints, sprite sheets and exported tensor files
// all go through here, so it sits in common/ below every module that writes files.
#pragma once

#include <cstdint>
#include <string>

namespace spritetorch {

// Appends all of `bytes` to the open file `fd` (EINTR retried). On failure the file is cut back
// to `whole_bytes`, its size before this append, so that a record-per-write file (metrics lines,
// TensorBoard events) never ends in half a record; returns the write's errno (ENOSPC for a write
// of nothing), 0 when all was written.
int append_whole(int fd, const std::string& bytes, int64_t whole_bytes);

// Writes `bytes` to `path` atomically: a temporary file in the same folder, flushed and fsynced,
// then renamed over the target, so a crash leaves either the old file or the new one. Temporaries
// left by writers that died are removed. Throws Error naming the file on failure.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace spritetorch
