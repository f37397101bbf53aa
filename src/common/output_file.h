// The overwrite rule for every file a command writes (checkpoints, sprite sheets, reports,
// metrics): an existing file is never replaced unless the user passed --overwrite. Commands call
// check_new_output for each output path before doing any work, so a refusal costs nothing.
// (A training run's own periodic checkpoints are the exception: train/run_state.h.)
#pragma once

#include <cstdint>
#include <string>

namespace spritetorch {

// Throws Error naming `path` and `flag` when `path` exists and !overwrite.
void check_new_output(const std::string& path, bool overwrite, const std::string& flag);

// check_new_output, and the folder `path` goes into must exist and be writable: a sheet or report
// written after minutes of work must not fail then for a typo in its folder.
void check_output_path(const std::string& path, bool overwrite, const std::string& flag);

// Bytes an unprivileged writer may still put into the file system holding `path`'s folder;
// UINT64_MAX when that cannot be told.
uint64_t free_bytes_for(const std::string& path);
// Throws Error when the file system of `path` (given as `flag`) has fewer than `bytes` free: a
// file written after hours of work must not be refused then for want of room.
void check_room_for(const std::string& path, uint64_t bytes, const std::string& flag);
// A place for an output that could not be written where asked: "<temp folder>/spritetorch-
// <name>-<pid><extension>", a name no file has yet.
std::string rescue_path(const std::string& path);

// True when `a` and `b` name the same file, whether it exists yet or not (through links, "..",
// "./" or a relative and an absolute path): an output must not replace an input or another output
// of the same command.
bool same_file(const std::string& a, const std::string& b);

// `name` (a class name from the user's data, say) made safe as one part of a file name: every
// byte but ASCII letters, digits, '-', '_', '.' and '+' becomes '_', and a leading '.' gets a '_'
// before it, so "../x" cannot leave the folder nor make a hidden file; empty gives "_". Bytes of
// 0x80 and up (UTF-8) are kept: they are never '/' nor NUL.
std::string file_name_part(const std::string& name);

}  // namespace spritetorch
