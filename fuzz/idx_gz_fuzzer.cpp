// Fuzzes the IDX reader behind a valid gzip stream: the input is the uncompressed IDX content,
// gzip-compressed before reading, so mutations explore IDX headers through the .gz code path
// (idx_fuzzer covers corrupt and truncated gzip streams themselves).
#include <zlib.h>

#include <vector>

#include "data/idx_reader.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static spritetorch::fuzz::MemFile file;
  // gzip = 10-byte header + deflate + 8-byte trailer; deflateBound covers the deflate part.
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::vector<uint8_t> gz(deflateBound(&z, size) + 32);
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = gz.data();
  z.avail_out = static_cast<uInt>(gz.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  gz.resize(z.total_out);
  deflateEnd(&z);
  file.assign(gz.data(), gz.size());
  return spritetorch::fuzz::expect_clean([&] { spritetorch::data::read_idx(file.path()); });
}
