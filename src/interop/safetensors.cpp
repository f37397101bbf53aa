#include "interop/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/json_text.h"

// Tensors are copied byte for byte: the host must store numbers the way the format does.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

namespace spritetorch::interop {

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  torch::ScalarType type;
  const char* name;
};
constexpr DtypeInfo kDtypes[] = {
    {torch::kFloat64, "F64"},   {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},     {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"},
};

std::string dtype_list() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// One header entry after validation; `begin`/`end` are offsets into the data section.
struct Entry {
  std::string name;
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& name, const nlohmann::json& j, uint64_t data_size,
                  const std::string& source) {
  const std::string where = "tensor '" + name + "'";
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data_offsets"))
    throw DataError(source, where + " as {dtype, shape, data_offsets}", j.dump().substr(0, 200));
  Entry e;
  e.name = name;
  const auto& dtype = j["dtype"];
  const DtypeInfo* info = nullptr;
  if (dtype.is_string())
    for (const auto& d : kDtypes)
      if (dtype.get<std::string>() == d.name) info = &d;
  if (!info)
    throw DataError(source, where + " with a dtype in " + dtype_list(), "dtype " + dtype.dump());
  e.type = info->type;

  const auto& shape = j["shape"];
  if (!shape.is_array() || shape.size() > 16)
    throw DataError(source, where + " with a shape of at most 16 dimensions",
                    "shape " + shape.dump());
  uint64_t bytes = torch::elementSize(e.type);
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned())
      throw DataError(source, where + " with non-negative integer dimensions",
                      "shape " + shape.dump());
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(bytes, d, &bytes))
      throw DataError(source, where + " with a shape whose size fits in 64 bits",
                      "shape " + shape.dump());
    e.shape.push_back(static_cast<int64_t>(d));
  }

  const auto& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    throw DataError(source, where + " with data_offsets [BEGIN, END]",
                    "data_offsets " + offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size)
    throw DataError(source,
                    where + " inside the " + std::to_string(data_size) + "-byte data section",
                    "data_offsets " + offsets.dump() + " (truncated file?)");
  if (e.end - e.begin != bytes)
    throw DataError(source,
                    where + " of " + std::to_string(bytes) + " bytes (" + info->name + " x shape " +
                        shape.dump() + ")",
                    std::to_string(e.end - e.begin) + " bytes in data_offsets " + offsets.dump());
  return e;
}

}  // namespace

const torch::Tensor* TensorFile::find(const std::string& name) const {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return &tensor;
  return nullptr;
}

std::string safetensors_dtype(torch::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  throw Error(std::string("safetensors cannot hold tensors of dtype ") + c10::toString(type),
              "supported: " + dtype_list());
}

std::string safetensors_bytes(const TensorFile& file) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (name == "__metadata__")
      throw Error("a tensor may not be called __metadata__ in safetensors");
    if (header.contains(name))
      throw Error("tensor '" + name + "' given twice for one safetensors file");
    auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = cpu.numel() * cpu.element_size();
    header[name] = {{"dtype", safetensors_dtype(cpu.scalar_type())},
                    {"shape", cpu.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(cpu));
  }
  std::string json = json_text(header);
  json.append((8 - json.size() % 8) % 8, ' ');  // tensors start 8-byte aligned
  std::string out;
  out.reserve(8 + json.size() + offset);
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((uint64_t{json.size()} >> (8 * i)) & 0xff));
  out += json;
  for (const auto& t : data)
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return out;
}

void write_safetensors(const std::string& path, const TensorFile& file, IfExists existing) {
  write_file_atomically(path, safetensors_bytes(file), existing);
}

TensorFile read_safetensors(const std::string& path) {
  check_input_file(path, "a safetensors file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "a readable safetensors file", "a file that cannot be opened");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return read_safetensors_bytes(bytes, path);
}

TensorFile read_safetensors_bytes(const std::string& bytes, const std::string& source) {
  if (bytes.size() < 8)
    throw DataError(source, "a safetensors file (8-byte header length, JSON header, data)",
                    std::to_string(bytes.size()) + " bytes");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8)
    throw DataError(source,
                    "a header length of at most " +
                        std::to_string(std::min<uint64_t>(bytes.size() - 8, kMaxHeaderBytes)) +
                        " bytes (the file holds " + std::to_string(bytes.size()) + ")",
                    std::to_string(header_size) + " (not a safetensors file, or truncated)");
  const char* json_begin = bytes.data() + 8;
  const char* json_end = json_begin + header_size;
  // nlohmann::json keeps the last of repeated keys; a repeated tensor name is an error here.
  std::set<std::string> seen;
  std::string repeated;
  const auto note_repeats = [&](int depth, nlohmann::json::parse_event_t event,
                                nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key &&
        !seen.insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json_begin, json_end, note_repeats);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's text starts "[json.exception.parse_error.101] ": an id that means nothing here.
    std::string what = e.what();
    if (const auto id_end = what.find("] ");
        what.rfind("[json.exception.", 0) == 0 && id_end != std::string::npos)
      what = what.substr(id_end + 2);
    throw DataError(source, "a JSON header", "invalid JSON (" + what + ")");
  }
  if (!header.is_object())
    throw DataError(source, "a JSON object as header", std::string("a JSON ") + header.type_name());
  if (!repeated.empty())
    throw DataError(source, "unique names in the header", "'" + repeated + "' twice");

  const uint64_t data_size = bytes.size() - 8 - header_size;
  const char* data = json_end;
  TensorFile out;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        throw DataError(source, "__metadata__ as a JSON object", value.dump().substr(0, 200));
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string())
          throw DataError(source, "string values in __metadata__",
                          "'" + key + "': " + text.dump().substr(0, 200));
        out.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(name, value, data_size, source));
  }
  // The spans must tile the data section exactly: no overlap (two tensors sharing bytes), no gap.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const auto& e : entries) {
    if (e.begin != covered)
      throw DataError(source, "tensors tiling the data section without overlap or gap",
                      "tensor '" + e.name + "' at byte " + std::to_string(e.begin) + " where " +
                          std::to_string(covered) + " was expected");
    covered = e.end;
  }
  if (covered != data_size)
    throw DataError(source,
                    std::to_string(covered) + " data bytes after the header (what the tensors use)",
                    std::to_string(data_size) + " bytes");

  for (const auto& e : entries) {
    if (e.type == torch::kBool)  // a bool byte other than 0 or 1 is undefined behaviour in C++
      for (uint64_t i = e.begin; i < e.end; ++i)
        if (static_cast<unsigned char>(data[i]) > 1)
          throw DataError(source, "BOOL tensor '" + e.name + "' holding bytes 0 and 1",
                          "byte value " + std::to_string(static_cast<unsigned char>(data[i])));
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(e.type));
    if (e.end > e.begin) std::memcpy(tensor.data_ptr(), data + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, std::move(tensor));
  }
  return out;
}

}  // namespace spritetorch::interop
