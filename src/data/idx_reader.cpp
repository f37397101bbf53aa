#include "data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"

namespace spritetorch::data {

namespace {

// The payload is read in chunks of this size, so a header that lies about its size costs at most
// one chunk beyond what the file really holds.
constexpr size_t kChunk = size_t{1} << 20;
constexpr uint64_t kMaxElements = uint64_t{1} << 34;  // 16 GiB of uint8: far beyond any IDX set

// The file's bytes, gunzipped when it starts with the gzip magic. zlib's inflate verifies each
// member's CRC-32 and length trailer; a stream that ends before its trailer is an error (gzread
// would return the data and say nothing when the trailer is cut).
class Source {
 public:
  explicit Source(const std::string& path)
      : path_(path), file_(std::fopen(path.c_str(), "rb"), &std::fclose) {
    if (!file_) throw DataError(path, "a readable IDX file", "a file that cannot be opened");
    fill();
    gzip_ = avail_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gzip_ && inflateInit2(&z_, 15 + 16) != Z_OK) throw Error("zlib: inflateInit2 failed");
  }
  ~Source() {
    if (gzip_) inflateEnd(&z_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // Reads up to n bytes; fewer only at the end of the data.
  size_t read(uint8_t* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      if (avail_ == 0 && !fill()) {
        if (gzip_ && !member_done_)
          throw DataError(path_, "a complete gzip stream", "one cut short (truncated file)");
        break;
      }
      if (!gzip_) {
        const size_t k = std::min(n - done, avail_);
        std::memcpy(out + done, in_ + pos_, k);
        pos_ += k, avail_ -= k, done += k;
        continue;
      }
      if (member_done_) {  // another gzip member follows (concatenated .gz files are valid)
        if (inflateReset(&z_) != Z_OK) throw Error("zlib: inflateReset failed");
        member_done_ = false;
      }
      z_.next_in = in_ + pos_;
      z_.avail_in = static_cast<uInt>(avail_);
      z_.next_out = out + done;
      z_.avail_out = static_cast<uInt>(std::min<size_t>(n - done, 1u << 30));
      const uInt out_before = z_.avail_out;
      const int ret = inflate(&z_, Z_NO_FLUSH);
      done += out_before - z_.avail_out;
      pos_ += avail_ - z_.avail_in;
      avail_ = z_.avail_in;
      if (ret == Z_STREAM_END) {
        member_done_ = true;
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        throw DataError(path_, "a valid gzip stream",
                        std::string("a corrupt one (") + (z_.msg ? z_.msg : "zlib error") + ")");
      }
    }
    return done;
  }

 private:
  bool fill() {
    if (avail_ > 0) return true;
    pos_ = 0;
    avail_ = std::fread(in_, 1, sizeof in_, file_.get());
    if (std::ferror(file_.get())) throw DataError(path_, "a readable IDX file", "a read error");
    return avail_ > 0;
  }

  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
  z_stream z_{};
  bool gzip_ = false, member_done_ = false;
  uint8_t in_[1 << 16];
  size_t pos_ = 0, avail_ = 0;
};

std::string hex_byte(int b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[(b >> 4) & 15] + digits[b & 15];
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  Source file(path);
  unsigned char header[4];
  const size_t got = file.read(header, sizeof header);
  if (got != 4) throw DataError(path, "a 4-byte IDX header", std::to_string(got) + " bytes");
  if (header[0] != 0 || header[1] != 0)
    throw DataError(path, "IDX magic 0x0000", hex_byte(header[0]) + hex_byte(header[1]).substr(2),
                    "is this an MNIST-format file?");
  if (header[2] != 0x08) throw DataError(path, "element type 0x08 (uint8)", hex_byte(header[2]));
  const int ndim = header[3];
  if (ndim < 1 || ndim > kIdxMaxDims)
    throw DataError(path, "1 to " + std::to_string(kIdxMaxDims) + " dimensions",
                    std::to_string(ndim));

  std::vector<int64_t> dims(ndim);
  uint64_t elements = 1;
  for (int d = 0; d < ndim; ++d) {
    unsigned char be[4];
    if (file.read(be, 4) != 4)
      throw DataError(path, std::to_string(ndim) + " dimension sizes", "a truncated header");
    const uint64_t size = (uint64_t{be[0]} << 24) | (uint64_t{be[1]} << 16) |
                          (uint64_t{be[2]} << 8) | uint64_t{be[3]};
    if (size == 0)
      throw DataError(path, "non-zero dimensions", "dimension " + std::to_string(d) + " = 0");
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
    const size_t n = file.read(payload.data() + old, want);
    payload.resize(old + n);
    if (n < want) break;
  }
  if (payload.size() < elements)
    throw DataError(path, std::to_string(elements) + " data bytes",
                    std::to_string(payload.size()) + " (truncated file)");
  unsigned char extra;
  if (file.read(&extra, 1) > 0)  // also reads a .gz to its end: the trailer's CRC is checked
    throw DataError(path, std::to_string(elements) + " data bytes", "trailing bytes after them");

  auto out = torch::empty(dims, torch::kUInt8);
  std::memcpy(out.data_ptr<uint8_t>(), payload.data(), payload.size());
  return out;
}

}  // namespace spritetorch::data
