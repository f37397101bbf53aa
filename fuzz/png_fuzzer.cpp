// Fuzzes what `classify` and `sheet:` datasets do with a PNG from a user: decoding (our checks
// around libpng: sizes implausible for the file's length, truncation, every colour type), then
// the picture conversions of each model kind and the sheet cut.
#include "data/picture.h"
#include "data/sprite_sources.h"
#include "fuzz_util.h"
#include "io/png.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  return spritetorch::fuzz::expect_clean([&] {
    std::vector<std::string> warnings;  // what libpng recovered from: not a finding
    const torch::Tensor rgba = spritetorch::io::decode_png(bytes, "fuzz.png", &warnings);
    spritetorch::data::picture_to_input(rgba, {1, 28, 28});
    spritetorch::data::picture_to_input(rgba, {4, 16, 16});
    spritetorch::data::picture_to_input(rgba, {3, 8, 8}, /*invert=*/true);
    spritetorch::data::SpriteOptions cut;  // 16x16 tiles, spacing 1, margin 1
    cut.spacing = cut.margin = 1;
    spritetorch::data::cut_sheet(rgba, "fuzz.png", cut);
  });
}
