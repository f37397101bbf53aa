// Fuzzes what lies behind a checkpoint's CRC: the input is the payload (format 2: the metadata JSON
// and the named tensors, train/checkpoint.h), wrapped in a valid header with the right length and
// CRC-32, so mutations reach the payload reader, the metadata checks and model_from_checkpoint
// instead of stopping at the checksum. A hostile file can
// carry a correct CRC, so this is the path that matters for untrusted checkpoints.
#include <zlib.h>

#include "fuzz_util.h"
#include "train/model_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes = "SPRITETORCH-CKPT";
  auto put = [&bytes](uint64_t value, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  };
  put(spritetorch::train::kCheckpointVersion, 4);
  put(size, 8);
  put(crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(size)), 4);
  bytes.append(reinterpret_cast<const char*>(data), size);
  return spritetorch::fuzz::expect_clean([&] {
    const auto checkpoint = spritetorch::train::load_checkpoint_bytes(bytes, "fuzz.pt");
    spritetorch::train::model_from_checkpoint(checkpoint, "fuzz.pt", torch::kCPU);
  });
}
