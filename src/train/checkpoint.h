// Checkpoint files: what a run needs to be evaluated, resumed or exported.
//
// Layout (little-endian):
//   16 bytes  magic "SPRITETORCH-CKPT"
//   u32       format version (kCheckpointVersion)
//   u64       payload length in bytes
//   u32       CRC-32 of the payload
//   payload   a LibTorch archive: "meta" (a JSON string), "model.<name>" and "optimizer.<name>"
//             tensors
// Files are written atomically: a temporary file in the same folder, flushed and fsynced, then
// renamed over the target, so a crash leaves either the old file or the new one.
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace spritetorch::train {

constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  // model, input_shape, classes, class_names, dataset, epoch, seed, optimizer, lr, ...
  nlohmann::json meta;
  std::map<std::string, torch::Tensor> model;      // parameter and buffer name -> tensor (CPU)
  std::map<std::string, torch::Tensor> optimizer;  // optimizer state name -> tensor (CPU)
  std::map<std::string, torch::Tensor> run;        // mid-run state (train/run_state.h); may be empty
};

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws DataError naming the file when it is not a spritetorch checkpoint, is truncated, fails its
// checksum or comes from a newer format version.
Checkpoint load_checkpoint(const std::string& path);
// The same checks on bytes already in memory; `source` names them in errors. (Fuzz targets use it.)
Checkpoint load_checkpoint_bytes(const std::string& bytes, const std::string& source);

// Writes `bytes` to `path` atomically (temporary file + fsync + rename).
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace spritetorch::train
