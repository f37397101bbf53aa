#include "data/idx_reader.h"

#include <zlib.h>

#include <memory>
#include <vector>

#include "common/error.h"

namespace spritetorch::data {

namespace {

constexpr int kMaxDims = 4;
// The payload is read in chunks of this size, so a header that lies about its size costs at most
// one chunk beyond what the file really holds.
constexpr size_t kChunk = size_t{1} << 20;
constexpr uint64_t kMaxElements = uint64_t{1} << 34;  // 16 GiB of uint8: far beyond any IDX set

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

std::string hex_byte(int b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[(b >> 4) & 15] + digits[b & 15];
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  // gzread reads plain files transparently, so one code path serves .gz and unpacked files.
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) throw DataError(path, "a readable IDX file", "a file that cannot be opened");

  unsigned char header[4];
  int got = gzread(file.get(), header, sizeof header);
  if (got < 0) throw DataError(path, "gzip or IDX data", "a corrupt gzip stream");
  if (got != 4) throw DataError(path, "a 4-byte IDX header", std::to_string(got) + " bytes");
  if (header[0] != 0 || header[1] != 0)
    throw DataError(path, "IDX magic 0x0000", hex_byte(header[0]) + hex_byte(header[1]).substr(2),
                    "is this an MNIST-format file?");
  if (header[2] != 0x08)
    throw DataError(path, "element type 0x08 (uint8)", hex_byte(header[2]));
  const int ndim = header[3];
  if (ndim < 1 || ndim > kMaxDims)
    throw DataError(path, "1 to " + std::to_string(kMaxDims) + " dimensions", std::to_string(ndim));

  std::vector<int64_t> dims(ndim);
  uint64_t elements = 1;
  for (int d = 0; d < ndim; ++d) {
    unsigned char be[4];
    if (gzread(file.get(), be, 4) != 4)
      throw DataError(path, std::to_string(ndim) + " dimension sizes", "a truncated header");
    const uint64_t size = (uint64_t{be[0]} << 24) | (uint64_t{be[1]} << 16) |
                          (uint64_t{be[2]} << 8) | uint64_t{be[3]};
    if (size == 0) throw DataError(path, "non-zero dimensions", "dimension " + std::to_string(d) + " = 0");
    elements *= size;  // each factor < 2^32 and the running product is capped below: no overflow
    if (elements > kMaxElements)
      throw DataError(path, "at most " + std::to_string(kMaxElements) + " elements",
                      "a header claiming more");
    dims[d] = static_cast<int64_t>(size);
  }

  std::vector<uint8_t> payload;
  while (payload.size() < elements) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, elements - payload.size()));
    const size_t old = payload.size();
    payload.resize(old + want);
    const int n = gzread(file.get(), payload.data() + old, static_cast<unsigned>(want));
    if (n < 0) throw DataError(path, "gzip or IDX data", "a corrupt gzip stream");
    payload.resize(old + static_cast<size_t>(n));
    if (static_cast<size_t>(n) < want) break;
  }
  if (payload.size() < elements)
    throw DataError(path, std::to_string(elements) + " data bytes",
                    std::to_string(payload.size()) + " (truncated file)");
  unsigned char extra;
  const int tail = gzread(file.get(), &extra, 1);
  if (tail > 0)
    throw DataError(path, std::to_string(elements) + " data bytes", "trailing bytes after them");
  // A .gz whose data is complete but whose trailer (CRC-32, length) is cut or wrong shows up only
  // here, as a read error at the end.
  int status = Z_OK;
  const char* message = gzerror(file.get(), &status);
  if (tail < 0 || (status != Z_OK && status != Z_STREAM_END))
    throw DataError(path, "a complete gzip stream with a matching CRC-32",
                    std::string("a truncated or corrupt one (") + message + ")");

  auto out = torch::empty(dims, torch::kUInt8);
  std::memcpy(out.data_ptr<uint8_t>(), payload.data(), payload.size());
  return out;
}

}  // namespace spritetorch::data
