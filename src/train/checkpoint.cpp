#include "train/checkpoint.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/json_text.h"

namespace spritetorch::train {

namespace {

constexpr char kMagic[16] = {'S', 'P', 'R', 'I', 'T', 'E', 'T', 'O',
                             'R', 'C', 'H', '-', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderSize = 16 + 4 + 8 + 4;

template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename T>
T get_le(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    value |= static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

uint32_t crc_of(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {  // crc32 takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

constexpr int kMaxDims = 8;
constexpr uint64_t kMaxDimSize = uint64_t{1} << 40, kMaxExtent = uint64_t{1} << 48;

bool storable(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Byte:
    case c10::ScalarType::Char:
    case c10::ScalarType::Short:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Half:
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Bool:
    case c10::ScalarType::BFloat16:
      return true;
    default:
      return false;
  }
}

void put_tensor(std::string& out, const std::string& name, const torch::Tensor& tensor) {
  const torch::Tensor t = tensor.detach().cpu().contiguous();
  if (!storable(t.scalar_type()))
    throw Error("cannot save tensor '" + name + "' of dtype " + c10::toString(t.scalar_type()) +
                " in a checkpoint");
  if (name.size() > 0xffff || t.dim() > kMaxDims)
    throw Error("cannot save tensor '" + name + "': name or rank too large for a checkpoint");
  put_le<uint16_t>(out, static_cast<uint16_t>(name.size()));
  out += name;
  out.push_back(static_cast<char>(static_cast<int8_t>(t.scalar_type())));
  out.push_back(static_cast<char>(t.dim()));
  for (int64_t size : t.sizes()) put_le<uint64_t>(out, static_cast<uint64_t>(size));
  // x86-64 and arm64 are little-endian: the bytes in memory are the file's.
  if (t.nbytes() > 0) out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

// Reads the payload front to back; every read is checked against the bytes left first.
class PayloadReader {
 public:
  PayloadReader(const char* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}
  template <typename T>
  T get(const std::string& what) {
    return get_le<T>(take(sizeof(T), what));
  }
  const char* take(uint64_t n, const std::string& what) {
    if (n > size_ - pos_)
      throw DataError(path_, what + " (" + std::to_string(n) + " bytes)",
                      std::to_string(size_ - pos_) + " bytes left in the payload");
    const char* p = data_ + pos_;
    pos_ += static_cast<size_t>(n);
    return p;
  }
  size_t left() const { return size_ - pos_; }

 private:
  const char* data_;
  size_t size_, pos_ = 0;
  const std::string& path_;
};

torch::Tensor get_tensor(PayloadReader& in, const std::string& name, const std::string& path) {
  const auto dtype_code = in.get<uint8_t>("the dtype of '" + name + "'");
  if (dtype_code >= static_cast<int>(c10::ScalarType::NumOptions) ||
      !storable(static_cast<c10::ScalarType>(dtype_code)))
    throw DataError(path, "a tensor dtype code for '" + name + "'", std::to_string(dtype_code));
  const auto dtype = static_cast<c10::ScalarType>(dtype_code);
  const auto ndim = in.get<uint8_t>("the rank of '" + name + "'");
  if (ndim > kMaxDims)
    throw DataError(path, "at most " + std::to_string(kMaxDims) + " dimensions for '" + name + "'",
                    std::to_string(ndim));
  std::vector<int64_t> sizes(ndim);
  // The product of the non-zero sizes stays below 2^48 (LibTorch multiplies all sizes, zeros
  // last, in int64), and the bytes they need are checked against the payload before allocating.
  uint64_t extent = 1, numel = 1;
  for (auto& size : sizes) {
    const auto s = in.get<uint64_t>("the sizes of '" + name + "'");
    if (s > kMaxDimSize || (s > 0 && extent > kMaxExtent / s))
      throw DataError(path, "a tensor '" + name + "' of fewer than 2^48 elements",
                      "a dimension of size " + std::to_string(s));
    if (s > 0) extent *= s;
    numel *= s;
    size = static_cast<int64_t>(s);
  }
  const uint64_t bytes = numel * c10::elementSize(dtype);              // < 2^51
  const char* src = in.take(bytes, "the elements of '" + name + "'");  // checked before allocating
  auto t = torch::empty(sizes, torch::TensorOptions().dtype(dtype));
  if (bytes > 0) std::memcpy(t.data_ptr(), src, static_cast<size_t>(bytes));
  return t;
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint, IfExists existing) {
  std::string payload;
  const std::string meta = json_text(checkpoint.meta);
  put_le<uint32_t>(payload, static_cast<uint32_t>(meta.size()));
  payload += meta;
  put_le<uint32_t>(payload,
                   static_cast<uint32_t>(checkpoint.model.size() + checkpoint.optimizer.size() +
                                         checkpoint.run.size() + checkpoint.task.size()));
  for (const auto& [name, tensor] : checkpoint.model) put_tensor(payload, "model." + name, tensor);
  for (const auto& [name, tensor] : checkpoint.optimizer)
    put_tensor(payload, "optimizer." + name, tensor);
  for (const auto& [name, tensor] : checkpoint.run) put_tensor(payload, "run." + name, tensor);
  for (const auto& [name, tensor] : checkpoint.task) put_tensor(payload, "task." + name, tensor);

  std::string file(kMagic, sizeof kMagic);
  put_le<uint32_t>(file, kCheckpointVersion);
  put_le<uint64_t>(file, payload.size());
  put_le<uint32_t>(file, crc_of(payload.data(), payload.size()));
  file += payload;
  write_file_atomically(path, file, existing);
}

namespace {

// A folder opens as a stream on Linux and fails only when read, with libstdc++'s raw message.
void refuse_folder(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError(path, "a checkpoint file", "a folder",
                    "checkpoints are files written by `spritetorch train --save PATH`");
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path) {
  refuse_folder(path);
  check_input_file(path, "a checkpoint file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "a readable checkpoint file", "a file that cannot be opened");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return load_checkpoint_bytes(bytes, path);
}

std::optional<nlohmann::json> peek_checkpoint_meta(const std::string& path) {
  refuse_folder(path);
  std::ifstream in(path, std::ios::binary);
  char head[kHeaderSize + 4];
  if (!in.read(head, sizeof head) || std::memcmp(head, kMagic, sizeof kMagic) != 0 ||
      get_le<uint32_t>(head + 16) != kCheckpointVersion)
    return std::nullopt;
  const auto length = get_le<uint64_t>(head + 20);
  const auto meta_size = get_le<uint32_t>(head + kHeaderSize);
  if (meta_size > length || meta_size > (64u << 20)) return std::nullopt;  // not this file's
  std::string meta(meta_size, '\0');
  if (!in.read(meta.data(), meta_size)) return std::nullopt;
  auto parsed = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  return parsed;
}

Checkpoint load_checkpoint_bytes(const std::string& bytes, const std::string& path) {
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw DataError(path, "a spritetorch checkpoint (magic SPRITETORCH-CKPT)",
                    bytes.size() < 16 ? std::to_string(bytes.size()) + " bytes" : "other content",
                    "checkpoints are written by `spritetorch train --save PATH`");
  const auto version = get_le<uint32_t>(bytes.data() + 16);
  if (version != kCheckpointVersion)
    throw DataError(
        path, "format version " + std::to_string(kCheckpointVersion),
        "version " + std::to_string(version),
        version > kCheckpointVersion
            ? "a newer spritetorch wrote it: upgrade"
            : "version 1 (a LibTorch archive, from before the first release) is not read: "
              "its reader is unsafe on untrusted files; retrain");
  const auto length = get_le<uint64_t>(bytes.data() + 20);
  const auto crc = get_le<uint32_t>(bytes.data() + 28);
  if (length != bytes.size() - kHeaderSize)
    throw DataError(path, std::to_string(length) + " payload bytes",
                    std::to_string(bytes.size() - kHeaderSize) + " (truncated or padded file)");
  const char* payload = bytes.data() + kHeaderSize;
  if (crc_of(payload, length) != crc)
    throw DataError(path, "a payload matching its CRC-32", "a different checksum (corrupt file)");

  Checkpoint out;
  PayloadReader in(payload, length, path);
  const auto meta_size = in.get<uint32_t>("the metadata length");
  const char* meta = in.take(meta_size, "the metadata");
  try {
    out.meta = nlohmann::json::parse(meta, meta + meta_size);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path, "JSON metadata", std::string("invalid JSON (") + e.what() + ")");
  }
  if (!out.meta.is_object())
    throw DataError(path, "a JSON object as metadata",
                    std::string("a JSON ") + out.meta.type_name());
  const auto count = in.get<uint32_t>("the tensor count");
  for (uint32_t i = 0; i < count; ++i) {
    const auto name_size = in.get<uint16_t>("the length of tensor name " + std::to_string(i));
    const std::string name(in.take(name_size, "tensor name " + std::to_string(i)), name_size);
    std::map<std::string, torch::Tensor>* target = nullptr;
    std::string key;
    for (auto [prefix, map] :
         {std::pair{"model.", &out.model}, std::pair{"optimizer.", &out.optimizer},
          std::pair{"run.", &out.run}, std::pair{"task.", &out.task}}) {
      if (name.rfind(prefix, 0) == 0) {
        target = map;
        key = name.substr(std::strlen(prefix));
      }
    }
    if (!target || key.empty())
      throw DataError(path, "tensor names model.*, optimizer.*, run.* or task.*", "'" + name + "'");
    if (target->count(key)) throw DataError(path, "unique tensor names", "'" + name + "' twice");
    (*target)[key] = get_tensor(in, name, path);
  }
  if (in.left() != 0)
    throw DataError(path, std::to_string(count) + " tensors filling the payload",
                    std::to_string(in.left()) + " bytes after them");
  return out;
}

}  // namespace spritetorch::train
