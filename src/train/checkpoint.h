// Checkpoint files: what a run needs to be evaluated, resumed or exported.
//
// Layout (little-endian):
//   16 bytes  magic "SPRITETORCH-CKPT"
//   u32       format version (kCheckpointVersion)
//   u64       payload length in bytes
//   u32       CRC-32 of the payload
//   payload   (version 2)
//     u32 meta length, the meta JSON
//     u32 tensor count, then per tensor: u16 name length, name ("model.<name>", "optimizer.<name>",
//     "run.<name>" or "task.<name>"), u8 dtype (the c10::ScalarType value: uint8, int8, int16,
//     int32, int64, float16, float32, float64, bool, bfloat16), u8 ndim (0..8), ndim x u64 sizes,
//     then the elements, contiguous, little-endian.
// Version 1 payloads were LibTorch archives; loading those runs LibTorch's TorchScript importer,
// which crashes on hostile input (found by fuzz/checkpoint_payload_fuzzer), so version 2 is a
// format whose every length is checked against the bytes present before anything is allocated.
// Files are written atomically (common/atomic_file.h), so a crash leaves either the old file or the
// new one.
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/atomic_file.h"

namespace spritetorch::train {

constexpr uint32_t kCheckpointVersion = 2;

struct Checkpoint {
  // model, input_shape, classes, class_names, dataset, epoch, seed, optimizer, lr, ...
  nlohmann::json meta;
  std::map<std::string, torch::Tensor> model;      // parameter and buffer name -> tensor (CPU)
  std::map<std::string, torch::Tensor> optimizer;  // optimizer state name -> tensor (CPU)
  std::map<std::string, torch::Tensor> run;  // mid-run state (train/run_state.h); may be empty
  // The task's own state beside its module's (Task::save adds, Task::load reads: a user's EMA
  // copy, say); may be empty. Names are the task's.
  std::map<std::string, torch::Tensor> task;
};

// Written atomically (common/atomic_file.h); kKeep refuses a file that is there by then.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     IfExists existing = IfExists::kReplace);
// Throws DataError naming the file when it is a folder or not a spritetorch checkpoint, is
// truncated, fails its checksum or comes from a newer format version.
Checkpoint load_checkpoint(const std::string& path);
// The metadata alone, read from the front of the file without the checksum over the whole payload
// (a few KB however large the weights): for naming things before the run reads the file properly.
// nullopt when it is not a readable checkpoint of this version; DataError when it is a folder.
std::optional<nlohmann::json> peek_checkpoint_meta(const std::string& path);
// The same checks on bytes already in memory; `source` names them in errors. (Fuzz targets use it.)
Checkpoint load_checkpoint_bytes(const std::string& bytes, const std::string& source);

}  // namespace spritetorch::train
