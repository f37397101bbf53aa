#include "data/idx_cache.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "common/atomic_file.h"
#include "common/crc32c.h"
#include "common/environment_switch.h"
#include "common/error.h"
#include "common/fnv1a.h"
#include "common/notes.h"
#include "data/idx_reader.h"

namespace spritetorch::data {

namespace {

namespace fs = std::filesystem;

// Cache file layout, little-endian: the fixed header, the source's path, the decoded bytes.
//   0 magic "SPRITETORCH-IDXC"   16 u32 version   20 u32 ndim   24 i64 dims[4]
//  56 u64 source size            64 i64 source mtime (ns)      72 u64 payload bytes
//  80 u32 path bytes             84 u32 CRC-32C of bytes 0-83, the path and the payload
// Version 1 used zlib's CRC-32 (~85 ms over Fashion-MNIST's 55 MB against ~10 ms for CRC-32C by
// the CPU's instruction); its files are ignored with a note and rewritten.
constexpr char kMagic[16] = {'S', 'P', 'R', 'I', 'T', 'E', 'T', 'O',
                             'R', 'C', 'H', '-', 'I', 'D', 'X', 'C'};
constexpr uint32_t kVersion = 2;
constexpr size_t kHeader = 88;
constexpr uint32_t kMaxPath = 4096;

template <typename T>
void put(unsigned char* at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    at[i] = static_cast<unsigned char>(uint64_t(value) >> (8 * i));
}
template <typename T>
T get(const unsigned char* at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{at[i]} << (8 * i);
  return static_cast<T>(v);
}

// A (dims) uint8 tensor on whole 2 MiB pages marked for transparent huge pages: the payload is read
// into fresh memory, and on 4 KiB pages that is one page fault per 4 KiB (13,400 for
// Fashion-MNIST), which under a virtual machine's costly faults was a tenth of a short run's
// start-up. Where the kernel gives no huge pages the advice is ignored and nothing else changes.
// Payloads under one huge page (the label files) take ordinary memory.
torch::Tensor tensor_on_huge_pages(const std::vector<int64_t>& dims, uint64_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes < kHugePage) return torch::empty(dims, torch::kUInt8);
  const size_t rounded = (static_cast<size_t>(bytes) + kHugePage - 1) / kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, rounded);
  if (memory == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE  // Linux's; other systems read onto the pages they give
  ::madvise(memory, rounded, MADV_HUGEPAGE);
#endif
  return torch::from_blob(
      memory, dims, [](void* p) { std::free(p); }, torch::kUInt8);
}

struct SourceKey {
  std::string path;  // absolute
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

SourceKey key_of(const std::string& source) {
  SourceKey key;
  key.path = fs::absolute(source).lexically_normal().string();
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0)
    throw DataError(source, "a readable IDX file", std::string(std::strerror(errno)));
  key.size = static_cast<uint64_t>(st.st_size);
  key.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return key;
}

bool starts_with_gzip_magic(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  unsigned char m[2];
  return f && std::fread(m, 1, 2, f.get()) == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

// What a lookup found: a tensor, nothing (no cache file: not worth a note), or why the file
// cannot be used.
struct Lookup {
  torch::Tensor tensor;
  std::string problem;
  bool replace = true;  // false: not ours to overwrite (a FIFO, a device, a folder)
};

Lookup look_up(const std::string& file, const SourceKey& key) {
  // Before fopen: opening a FIFO waits for a writer that never comes.
  struct stat kind {};
  if (::stat(file.c_str(), &kind) == 0 && !S_ISREG(kind.st_mode))
    return {{}, "not a regular file", /*replace=*/false};
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) {
    if (errno == ENOENT || errno == ENOTDIR) return {};  // no cache yet (the write will say why)
    return {{}, std::string("unreadable: ") + std::strerror(errno)};
  }
  struct stat st {};
  if (::fstat(::fileno(f.get()), &st) != 0) return {{}, "unreadable"};
  unsigned char head[kHeader];
  if (std::fread(head, 1, kHeader, f.get()) != kHeader) return {{}, "truncated header"};
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0) return {{}, "not a spritetorch cache file"};
  if (get<uint32_t>(head + 16) != kVersion) return {{}, "another format version"};
  const uint32_t ndim = get<uint32_t>(head + 20);
  if (ndim < 1 || ndim > kIdxMaxDims) return {{}, "bad dimension count"};
  std::vector<int64_t> dims(ndim);
  uint64_t elements = 1;
  for (uint32_t d = 0; d < ndim; ++d) {
    dims[d] = get<int64_t>(head + 24 + 8 * d);
    if (dims[d] <= 0 || dims[d] > (int64_t{1} << 32)) return {{}, "bad dimensions"};
    elements *= static_cast<uint64_t>(dims[d]);
    if (elements > (uint64_t{1} << 34)) return {{}, "bad dimensions"};
  }
  const uint64_t payload = get<uint64_t>(head + 72);
  const uint32_t path_bytes = get<uint32_t>(head + 80);
  if (payload != elements || path_bytes > kMaxPath) return {{}, "inconsistent header"};
  if (static_cast<uint64_t>(st.st_size) != kHeader + path_bytes + payload)
    return {{},
            "truncated or padded (" + std::to_string(st.st_size) + " bytes, header says " +
                std::to_string(kHeader + path_bytes + payload) + ")"};
  std::string path(path_bytes, '\0');
  if (std::fread(path.data(), 1, path_bytes, f.get()) != path_bytes) return {{}, "truncated"};
  if (path != key.path) return {{}, "holds another file (" + path + ")"};
  if (get<uint64_t>(head + 56) != key.size || get<int64_t>(head + 64) != key.mtime_ns)
    return {{}, "stale: the source's size or modification time changed"};
  auto tensor = tensor_on_huge_pages(dims, payload);
  auto* bytes = tensor.data_ptr<uint8_t>();
  if (std::fread(bytes, 1, payload, f.get()) != payload) return {{}, "truncated"};
  uint32_t crc = crc32c(head, 84);
  crc = crc32c(path.data(), path.size(), crc);
  crc = crc32c(bytes, payload, crc);
  if (crc != get<uint32_t>(head + 84)) return {{}, "checksum mismatch (corrupt)"};
  return {tensor, {}};
}

void store(const std::string& file, const SourceKey& key, const torch::Tensor& tensor) {
  const uint64_t payload = static_cast<uint64_t>(tensor.numel());
  std::string bytes(kHeader + key.path.size() + payload, '\0');
  auto* out = reinterpret_cast<unsigned char*>(bytes.data());
  std::memcpy(out, kMagic, sizeof kMagic);
  put<uint32_t>(out + 16, kVersion);
  put<uint32_t>(out + 20, static_cast<uint32_t>(tensor.dim()));
  for (int64_t d = 0; d < tensor.dim(); ++d) put<int64_t>(out + 24 + 8 * d, tensor.size(d));
  put<uint64_t>(out + 56, key.size);
  put<int64_t>(out + 64, key.mtime_ns);
  put<uint64_t>(out + 72, payload);
  put<uint32_t>(out + 80, static_cast<uint32_t>(key.path.size()));
  std::memcpy(out + kHeader, key.path.data(), key.path.size());
  std::memcpy(out + kHeader + key.path.size(), tensor.contiguous().data_ptr<uint8_t>(), payload);
  uint32_t crc = crc32c(out, 84);
  crc = crc32c(out + kHeader, key.path.size() + payload, crc);
  put<uint32_t>(out + 84, crc);
  std::error_code ec;
  fs::create_directories(fs::path(file).parent_path(), ec);
  if (ec)
    throw Error("cannot create " + fs::path(file).parent_path().string() + ": " + ec.message());
  write_file_atomically(file, bytes);
}

// The source a cache file records, or nothing when it is not one of ours (or unreadable).
std::optional<std::string> recorded_source(const std::string& file) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) return std::nullopt;
  unsigned char head[kHeader];
  if (std::fread(head, 1, kHeader, f.get()) != kHeader ||
      std::memcmp(head, kMagic, sizeof kMagic) != 0 || get<uint32_t>(head + 16) != kVersion)
    return std::nullopt;
  const uint32_t path_bytes = get<uint32_t>(head + 80);
  if (path_bytes == 0 || path_bytes > kMaxPath) return std::nullopt;
  std::string path(path_bytes, '\0');
  if (std::fread(path.data(), 1, path_bytes, f.get()) != path_bytes) return std::nullopt;
  return path;
}

// Cache files whose source is gone (a --data copy deleted, a folder renamed): each up to 47 MB no
// run can use again. Removed when an entry is written, the one time the cache grows; a file that
// is not ours, or whose source is only unreadable, is left alone.
void remove_orphans(const std::string& dir, const std::string& written) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path file = it->path();
    std::error_code kind;
    if (file.extension() != ".idxcache" || file == fs::path(written) ||
        !it->is_regular_file(kind))  // (a FIFO would block the read)
      continue;
    const auto source = recorded_source(file.string());
    struct stat st {};
    if (source && ::stat(source->c_str(), &st) != 0 && errno == ENOENT) {
      std::error_code ignored;
      fs::remove(file, ignored);
    }
  }
}

}  // namespace

bool dataset_cache_on() { return environment_switch("SPRITETORCH_CACHE", "no dataset cache", ""); }

IdxCache IdxCache::from_environment() {
  IdxCache cache;
  if (!dataset_cache_on()) return cache;
  // XDG: a relative XDG_CACHE_HOME is to be ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && xdg[0] == '/')
    cache.dir = (fs::path(xdg) / "spritetorch").string();
  else if (home && home[0] == '/')
    cache.dir = (fs::path(home) / ".cache" / "spritetorch").string();
  cache.note = [](const std::string& line) { spritetorch::note(line); };
  return cache;
}

std::string idx_cache_file(const std::string& source, const IdxCache& cache) {
  const std::string absolute = fs::absolute(source).lexically_normal().string();
  char hash[17];  // named after the source's path (the path itself is checked on read)
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(absolute)));
  return (fs::path(cache.dir) / (fs::path(absolute).filename().string() + "." + hash + ".idxcache"))
      .string();
}

torch::Tensor read_idx_cached(const std::string& path, const IdxCache& cache) {
  if (cache.dir.empty() || !starts_with_gzip_magic(path)) return read_idx(path);
  const SourceKey key = key_of(path);  // before decoding: a source changed meanwhile reads stale
  const std::string file = idx_cache_file(path, cache);
  auto note = [&](const std::string& line) {
    if (cache.note) cache.note(line);
  };
  const Lookup found = look_up(file, key);
  if (found.tensor.defined()) return found.tensor;
  if (!found.replace) {
    note("dataset cache: ignoring " + file + " (" + found.problem + "); running uncached");
    return read_idx(path);
  }
  if (!found.problem.empty())
    note("dataset cache: ignoring " + file + " (" + found.problem + "); decoding " + path +
         " and rewriting it");
  torch::Tensor tensor = read_idx(path);
  try {
    store(file, key, tensor);
    remove_orphans(cache.dir, file);
  } catch (const std::exception& e) {
    note("dataset cache: cannot write " + file + " (" + e.what() + "); running uncached");
  }
  return tensor;
}

}  // namespace spritetorch::data
