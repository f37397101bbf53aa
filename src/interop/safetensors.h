// The safetensors file format (Hugging Face's; what Python's `safetensors.torch.save_file` writes):
//
//   u64 little-endian  N, the length of the JSON header
//   N bytes            JSON: {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN,
//   END]},
//                             ..., "__metadata__": {"KEY": "VALUE", ...}}   (optional metadata)
//   data               every tensor's elements, row-major, little-endian; offsets are relative to
//                      the start of this section and must tile it with no gap or overlap
//
// Written and read here with no third-party code. Reading trusts nothing: the header length is
// checked against the file size before anything is allocated, and every entry's dtype, shape and
// byte span are checked against each other and against the data section.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/atomic_file.h"

namespace spritetorch::interop {

// Tensors in file order (Python's state_dict order when we write them), plus free-form metadata.
struct TensorFile {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // CPU, contiguous
  std::map<std::string, std::string> metadata;                 // "__metadata__"; may be empty
  // nullptr when absent.
  const torch::Tensor* find(const std::string& name) const;
};

// "F32" for torch::kFloat32 and so on; throws Error for a dtype safetensors cannot hold.
std::string safetensors_dtype(torch::ScalarType type);

// The whole file as bytes: the header padded with spaces to a multiple of 8 bytes (so every tensor
// starts 8-byte aligned, as the reference writer does), then the data. Tensors may live anywhere;
// they are copied to the CPU.
std::string safetensors_bytes(const TensorFile& file);
// Atomic write (temporary file + rename), like checkpoints.
void write_safetensors(const std::string& path, const TensorFile& file,
                       IfExists existing = IfExists::kReplace);

// Throws DataError naming `path` (or `source`) for anything that is not a well-formed file.
TensorFile read_safetensors(const std::string& path);
TensorFile read_safetensors_bytes(const std::string& bytes, const std::string& source);

}  // namespace spritetorch::interop
