// Fuzzes checkpoint loading as `eval --checkpoint` and `train --resume` do it: the file's header,
// length and CRC checks, the LibTorch archive inside, the metadata and the model it describes.
#include "fuzz_util.h"
#include "train/model_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  return spritetorch::fuzz::expect_clean([&] {
    const auto checkpoint = spritetorch::train::load_checkpoint_bytes(bytes, "fuzz.pt");
    spritetorch::train::model_from_checkpoint(checkpoint, "fuzz.pt", torch::kCPU);
  });
}
