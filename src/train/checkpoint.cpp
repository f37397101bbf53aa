#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace spritetorch::train {

namespace {

constexpr char kMagic[16] = {'S', 'P', 'R', 'I', 'T', 'E', 'T', 'O',
                             'R', 'C', 'H', '-', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderSize = 16 + 4 + 8 + 4;

template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
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

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  throw Error(what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp-" +
                                  std::to_string(::getpid())))
                              .string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw_errno("cannot create", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_errno("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw_errno("cannot flush", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw_errno("cannot rename into place", path);
  }
  // The rename itself must reach the disk too.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  torch::serialize::OutputArchive archive;
  archive.write("meta", c10::IValue(checkpoint.meta.dump()));
  for (const auto& [name, tensor] : checkpoint.model) archive.write("model." + name, tensor.cpu());
  for (const auto& [name, tensor] : checkpoint.optimizer)
    archive.write("optimizer." + name, tensor.cpu());
  for (const auto& [name, tensor] : checkpoint.run) archive.write("run." + name, tensor.cpu());
  std::string payload;
  archive.save_to([&payload](const void* data, size_t size) {
    payload.append(static_cast<const char*>(data), size);
    return size;
  });

  std::string file(kMagic, sizeof kMagic);
  put_le<uint32_t>(file, kCheckpointVersion);
  put_le<uint64_t>(file, payload.size());
  put_le<uint32_t>(file, crc_of(payload.data(), payload.size()));
  file += payload;
  write_file_atomically(path, file);
}

Checkpoint load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "a readable checkpoint file", "a file that cannot be opened");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return load_checkpoint_bytes(bytes, path);
}

Checkpoint load_checkpoint_bytes(const std::string& bytes, const std::string& path) {
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw DataError(path, "a spritetorch checkpoint (magic SPRITETORCH-CKPT)",
                    bytes.size() < 16 ? std::to_string(bytes.size()) + " bytes" : "other content",
                    "checkpoints are written by `spritetorch train --save PATH`");
  const auto version = get_le<uint32_t>(bytes.data() + 16);
  if (version == 0 || version > kCheckpointVersion)
    throw DataError(path, "format version 1.." + std::to_string(kCheckpointVersion),
                    "version " + std::to_string(version), "a newer spritetorch wrote it: upgrade");
  const auto length = get_le<uint64_t>(bytes.data() + 20);
  const auto crc = get_le<uint32_t>(bytes.data() + 28);
  if (length != bytes.size() - kHeaderSize)
    throw DataError(path, std::to_string(length) + " payload bytes",
                    std::to_string(bytes.size() - kHeaderSize) + " (truncated or padded file)");
  const char* payload = bytes.data() + kHeaderSize;
  if (crc_of(payload, length) != crc)
    throw DataError(path, "a payload matching its CRC-32", "a different checksum (corrupt file)");

  Checkpoint out;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(payload, length, torch::Device(torch::kCPU));
    c10::IValue meta;
    archive.read("meta", meta);
    if (!meta.isString())
      throw DataError(path, "a string 'meta' entry", std::string("a ") + meta.tagKind());
    out.meta = nlohmann::json::parse(meta.toStringRef());
    if (!out.meta.is_object())
      throw DataError(path, "a JSON object as metadata", std::string("a JSON ") + out.meta.type_name());
    for (const auto& key : archive.keys()) {
      if (key.rfind("model.", 0) == 0) {
        torch::Tensor t;
        archive.read(key, t);
        out.model[key.substr(6)] = t;
      } else if (key.rfind("optimizer.", 0) == 0) {
        torch::Tensor t;
        archive.read(key, t);
        out.optimizer[key.substr(10)] = t;
      } else if (key.rfind("run.", 0) == 0) {
        torch::Tensor t;
        archive.read(key, t);
        out.run[key.substr(4)] = t;
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw DataError(path, "a readable LibTorch archive inside the checkpoint",
                    std::string("an unreadable one (") + e.what_without_backtrace() + ")");
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path, "JSON metadata", std::string("invalid JSON (") + e.what() + ")");
  } catch (const std::exception& e) {
    // LibTorch's archive reader also throws torch::jit::ErrorReport (its TorchScript front end),
    // often with an empty message; found by fuzz/checkpoint_payload_fuzzer.
    const std::string what = e.what();
    throw DataError(path, "a readable LibTorch archive inside the checkpoint",
                    "an unreadable one (" + (what.empty() ? std::string("a malformed archive") : what) + ")");
  }
  return out;
}

}  // namespace spritetorch::train
