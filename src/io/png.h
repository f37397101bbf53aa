// PNG files through libpng's simplified API, and the pixel-art helpers around them:
// nearest-neighbour upscaling and sprite-sheet grids. Images are (H, W, 4) uint8 RGBA tensors on
// the CPU; every PNG colour type (RGBA, RGB, grey, grey + alpha, indexed with or without
// tRNS, 1..16 bits) is expanded to that on read. Not a codec of its own: libpng does the decoding
// and the checks.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/atomic_file.h"

namespace spritetorch::io {

// The largest picture read_png decodes: 8192 x 8192 (256 MiB of RGBA). A sprite, a sheet or a
// photo to classify is far smaller; a small file that claims more is refused before allocating.
constexpr int64_t kMaxPicturePixels = int64_t{1} << 26;

// Reads any PNG as (H, W, 4) uint8 RGBA, each sample as stored (no gamma or colour-profile
// conversion; 16-bit samples rounded to 8 bits). Throws DataError naming the file for a missing,
// truncated or corrupt file, for one whose decoded size is implausible for its length, and for one
// of more than kMaxPicturePixels. What libpng recovers from (a damaged tRNS chunk, palette indices
// past the palette) is read as libpng recovers it, and its warnings go to `warnings` when given,
// else to stderr as notes naming the file.
torch::Tensor read_png(const std::string& path, std::vector<std::string>* warnings = nullptr);
// Same, from bytes in memory; `name` is used in error messages.
torch::Tensor decode_png(const std::string& bytes, const std::string& name,
                         std::vector<std::string>* warnings = nullptr);

// Encodes (H, W, 4), (H, W, 3) or (H, W, 1) uint8 (any device) as an 8-bit RGBA / RGB / grey PNG
// in memory; `name` is used in error messages.
std::string encode_png(const torch::Tensor& image, const std::string& name);
// The same, written to `path` atomically (common/atomic_file.h).
void write_png(const std::string& path, const torch::Tensor& image,
               IfExists existing = IfExists::kReplace);

// Nearest-neighbour upscale of (H, W, C) or (N, C, H, W) by an integer factor >= 1.
torch::Tensor upscale_nearest(const torch::Tensor& image, int64_t scale);

// Nearest-neighbour resize of (N, C, H, W) uint8 to (N, C, size, size): pixel repetition or
// sampling only, never interpolation (pixel art keeps its hard edges and its colours).
torch::Tensor resize_nearest(const torch::Tensor& images, int64_t size);

// Resize of RGBA sprites (N, 4, H, W) uint8 to (N, 4, size, size) for a model: up by nearest
// neighbour (resize_nearest), down by the mean over each target pixel's source area, colours
// weighted by alpha (a transparent pixel lends no colour) and alpha the area's mean, rounded to 0
// or 255 in a sprite whose alpha is all 0 or 255 (hard edges stay hard). Sampling every other
// pixel instead breaks 1-pixel outlines and leaves stray specks (docs/sprites.md, "Datasets").
torch::Tensor resize_area(const torch::Tensor& images, int64_t size);

// How a sprite set is brought to the model's size: "area" (resize_area, the default) or
// "nearest" (resize_nearest; what checkpoints that record none were trained with). Anything
// else is an Error.
torch::Tensor resize_sprites(const torch::Tensor& images, int64_t size, const std::string& method);

struct SheetOptions {
  int64_t columns = 0;  // 0: ceil(sqrt(N))
  int64_t padding = 1;  // transparent pixels between tiles and around the sheet (before scaling)
  int64_t scale = 1;    // nearest-neighbour factor applied to the whole sheet
};
// The largest sheet make_sheet draws: read_png's limits (so that a sheet can be read back),
// 65,536 pixels a side and kMaxPicturePixels in all.
constexpr int64_t kMaxSheetSide = 1 << 16;
constexpr int64_t kMaxSheetPixels = kMaxPicturePixels;
// Throws Error naming the sheet's size when `count` sprites of h x w pixels laid out by `options`
// exceed those limits: commands call it before the work that makes the sprites.
void check_sheet_size(int64_t count, int64_t h, int64_t w, const SheetOptions& options);
// Lays (N, 4, H, W) uint8 sprites out in a grid: (rows*(H+p)+p, cols*(W+p)+p, 4) * scale, RGBA,
// transparent background. On the CPU. check_sheet_size first.
torch::Tensor make_sheet(const torch::Tensor& sprites, const SheetOptions& options = {});
// A generator's samples during training, (N, 4, S, S): one row per class (`per_class` columns;
// one sprite per class is laid out 8 classes a row), small sprites enlarged to about 64 pixels. The
// run folder's samples/epoch-NNN.png and TensorBoard's "samples/generated" show the same picture.
torch::Tensor make_sample_sheet(const torch::Tensor& sprites, int64_t per_class);

}  // namespace spritetorch::io
