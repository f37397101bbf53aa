// A cache of decoded IDX files, so a .gz dataset is inflated once per machine, not once per run
// (~0.3 s of every Fashion-MNIST run's start-up: docs/benchmarks.md).
//
// One cache file per source, named after the source's absolute path, holding the source's path,
// size and modification time, the tensor's dimensions, the decoded bytes and a CRC-32 over all of
// it. A cache file that is unreadable, corrupt, truncated or stale (the source's size or mtime
// changed) is ignored with a note and rewritten; one that cannot be written costs a note, never
// the run. Writes are atomic (common/atomic_file.h), so concurrent runs (ddp ranks) cannot tear it.
//
// Where: $XDG_CACHE_HOME/spritetorch, else $HOME/.cache/spritetorch. SPRITETORCH_CACHE=0 turns it
// off (1 or unset: on).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

namespace spritetorch::data {

struct IdxCache {
  std::string dir;  // where cache files go; empty: no cache, read_idx_cached is read_idx
  // Receives one line per cache file ignored or not written (why, and what happens instead).
  std::function<void(const std::string&)> note;

  // The cache the environment asks for, notes going to stderr. Throws Error (naming the variable)
  // when SPRITETORCH_CACHE is neither 0 nor 1.
  static IdxCache from_environment();
};

// SPRITETORCH_CACHE read alone (unset or 1: on, 0: off, else Error), so the CLI can check it with
// the other machine variables before a run creates anything.
bool dataset_cache_on();

// read_idx(path) through the cache: gzip sources are served from it when a valid entry for the
// source's current path, size and mtime exists, else decoded and stored. Plain files are read
// directly (decoding them costs no more than reading a cache file would). Errors in the source
// itself throw exactly as read_idx does.
torch::Tensor read_idx_cached(const std::string& path, const IdxCache& cache);

// The cache file that holds `source` (absolute path of the source inside cache.dir).
std::string idx_cache_file(const std::string& source, const IdxCache& cache);

}  // namespace spritetorch::data
