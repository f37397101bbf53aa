// Files Python's `torch.load` reads as a dict {name: tensor}: the zip container `torch.save` writes
// (data.pkl + one record per tensor), produced by LibTorch's own pickler (torch::pickle_save).
// Only writing: LibTorch's unpickler is not safe on untrusted files (docs/reliability.md), so
// imports take safetensors only.
#pragma once

#include <string>

#include "interop/safetensors.h"

namespace spritetorch::interop {

// Writes `file.tensors` (in order, on the CPU) as a dict; metadata is not stored. Atomic.
void write_torch_state_dict(const std::string& path, const TensorFile& file,
                            IfExists existing = IfExists::kReplace);

}  // namespace spritetorch::interop
