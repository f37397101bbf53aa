#include "interop/torch_file.h"

#include <torch/serialize.h>

#include "common/atomic_file.h"

namespace spritetorch::interop {

void write_torch_state_dict(const std::string& path, const TensorFile& file, IfExists existing) {
  c10::Dict<std::string, at::Tensor> dict;  // keeps insertion order, like Python's state_dict
  for (const auto& [name, tensor] : file.tensors)
    dict.insert(name, tensor.detach().cpu().contiguous());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  write_file_atomically(path, std::string(bytes.begin(), bytes.end()), existing);
}

}  // namespace spritetorch::interop
