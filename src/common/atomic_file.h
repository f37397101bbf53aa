// Whole-file writes that a crash cannot tear: checkpoints, sprite sheets and exported tensor files
// all go through here, so it sits in common/ below every module that writes files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace spritetorch {

// Appends all of `bytes` to the open file `fd` (EINTR retried). On failure the file is cut back
// to `whole_bytes`, its size before this append, so that a record-per-write file (metrics lines,
// TensorBoard events) never ends in half a record; returns the write's errno (ENOSPC for a write
// of nothing), 0 when all was written.
int append_whole(int fd, const std::string& bytes, int64_t whole_bytes);

// The longest file name the file systems take (NAME_MAX on Linux).
constexpr size_t kMaxNameBytes = 255;

// What a write does when its file is there at the end of the work. Commands refuse an existing
// output before they start (check_new_output); kKeep holds to that at the write itself, where
// another process may have made the file meanwhile (two runs given the same --save).
enum class IfExists { kReplace, kKeep };
// kReplace with --overwrite, kKeep without.
inline IfExists if_exists(bool overwrite) {
  return overwrite ? IfExists::kReplace : IfExists::kKeep;
}

// Writes `bytes` to `path` atomically: a temporary file in the same folder, flushed and fsynced,
// then renamed over the target, so a crash leaves either the old file or the new one. Temporaries
// left by writers that died are removed. Throws Error naming the file on failure, and, with
// IfExists::kKeep, when the file exists (it is left as it is).
// A symlink stays a link: the file it leads to is the one replaced (a dangling link's target is
// made). A device, FIFO or socket (/dev/stdout, a named pipe) is written into as it is: renaming a
// file over it would replace the device with a file.
void write_file_atomically(const std::string& path, const std::string& bytes,
                           IfExists existing = IfExists::kReplace);

// Removes from `dir` the temporaries of writers that died (".<name>.tmp-<pid>", see
// write_file_atomically) whose target `name` `of_target` accepts: each save removes only its own
// file's, so the temporaries of names never written again (a periodic checkpoint's step) need this.
// A live writer's temporary, or one whose name was cut to fit, is left alone. Returns the count.
int remove_dead_writers_temporaries(const std::string& dir,
                                    const std::function<bool(const std::string& name)>& of_target);

// `path` with its symlinks followed to the file a write lands on, which need not exist yet (a
// dangling link gives where it points); `path` itself when it is no link.
std::string output_target(const std::string& path);

// True when `path` (links followed) is there and is neither a regular file nor a folder: a device,
// a FIFO or a socket, which a write goes into instead of replacing.
bool is_special_file(const std::string& path);

}  // namespace spritetorch
