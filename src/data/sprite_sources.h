// Sprite datasets as users keep them, all turned into data::Dataset with inputs (N, 4, S, S) uint8
// RGBA and labels (N) int64:
//   sprites            the built-in procedural sprites (data/procedural_sprites.h)
//   folder:PATH        one subfolder of PNGs per class (class names = folder names, sorted)
//   sheet:FILE         a sprite sheet cut into tiles; fully transparent tiles skipped; one class
//                      "sprite" unless a label map names a class per tile
//   npy:FILE[,LABELS]  NumPy uint8 N x H x W x C (C = 1, 3 or 4) with optional one-hot (N x K) or
//                      integer (N) labels
// Every reader checks its input and throws DataError(file, expected, found) for anything off; none
// allocates more than the file's real size can fill. Sizes other than S are brought to S as
// SpriteOptions::resize says (io::resize_sprites).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace spritetorch::data {

// The most procedural sprites --sprite-count makes: 1 GiB of 16x16 RGBA (16 GiB at --size 64).
constexpr int64_t kMaxSpriteCount = 1'000'000;

struct SpriteOptions {
  int64_t size = 16;     // model size S: 16, 32 or 64
  int64_t count = 8000;  // procedural sprites generated (before the holdout split)
  uint64_t seed = 1234;  // procedural sprites' seed (the data, not the training order)
  int64_t tile_w = 16, tile_h = 16;
  int64_t spacing = 0, margin = 0;  // sheet: pixels between tiles, around the grid
  std::string label_map;  // sheet: text file of "TILE_INDEX CLASS" lines (row-major, 0-based)
  double holdout = 0.1;   // share of samples held out as the test split
  // How sprites of another size are brought to `size`: "area" (down by area means, up by
  // nearest neighbour) or "nearest" (io::resize_sprites).
  std::string resize = "area";
};

// True for "sprites", "folder:...", "sheet:...", "npy:...".
bool is_sprite_dataset(const std::string& spec);
// The files a dataset spec reads whole: sheet:FILE -> {FILE}; npy:FILE[,LABELS] -> {FILE[,
// LABELS]}; none for the others (a folder's PNGs are found when it is read).
std::vector<std::string> sprite_dataset_files(const std::string& spec);

// Throws Error when `options` sets, to other than its default, a field that `dataset` does not
// read (so it would be ignored without a word): any of them on fashion-mnist or dummy, the sheet
// cutting (--tile, --spacing, --margin, --labels) on a dataset other than sheet:, --sprite-count
// on a dataset other than the procedural sprites. The message names the flag and the dataset.
void check_sprite_options_apply(const std::string& dataset, const SpriteOptions& options);

// `options` with every field that `dataset` does not read back at its default: what a checkpoint
// or an export recorded is read this way, since runs from before check_sprite_options_apply kept
// whatever was passed, read or not.
SpriteOptions sprite_options_read_by(const std::string& dataset, SpriteOptions options);

// Throws Error when a flag in `given` (e.g. "--size") that `dataset` reads holds another value in
// `options` than in `recorded`, the options `recorded_in` (a file's metadata) holds; the message
// names both values.
void check_given_sprite_options_match(const std::string& dataset, const SpriteOptions& options,
                                      const SpriteOptions& recorded,
                                      const std::set<std::string>& given,
                                      const std::string& recorded_in);

// The whole dataset a spec names (no split).
Dataset load_sprite_dataset(const std::string& spec, const SpriteOptions& options);

// A deterministic split: a permutation drawn from `seed`, the last round(N * holdout) samples (at
// least one when holdout > 0 and N >= 2) go to test. Stratification is not attempted.
struct SpriteSplit {
  Dataset train, test;
};
SpriteSplit holdout_split(const Dataset& all, double holdout, uint64_t seed);

Dataset read_sprite_folder(const std::string& path, int64_t size,
                           const std::string& resize = "area");
Dataset read_sprite_sheet(const std::string& file, const SpriteOptions& options);

// The tiles of a sprite sheet (H, W, 4) uint8 read from `file`, cut by options' tile size,
// spacing and margin, row-major; fully transparent tiles (empty slots) are left out. `pixels`:
// (tile_h, tile_w, 4) views into `sheet`. Throws DataError when not one tile fits.
struct SheetTile {
  int64_t index, row, col;  // index = row * columns + col, counting the empty slots too
  torch::Tensor pixels;
};
struct SheetGrid {
  int64_t rows = 0, cols = 0;
  std::vector<SheetTile> tiles;  // the non-transparent ones
  // Not empty when the sheet's edge strip past the last whole tile holds visible pixels: a note
  // naming the file and the strip (read_sprite_sheet prints it to stderr).
  std::string uncovered;
};
SheetGrid cut_sheet(const torch::Tensor& sheet, const std::string& file,
                    const SpriteOptions& options);
Dataset read_npy_sprites(const std::string& file, const std::string& labels_file, int64_t size,
                         const std::string& resize = "area");

// A parsed .npy array, for the readers above and for tests. data: a CPU tensor of the file's dtype
// (uint8, int32, int64, float32 or float64), shape as in the header, C order.
struct NpyArray {
  std::vector<int64_t> shape;
  std::string descr;  // e.g. "|u1", "<i8"
  torch::Tensor data;
};
NpyArray read_npy(const std::string& file);
NpyArray parse_npy(const std::string& bytes, const std::string& name);

// SpriteOptions in a checkpoint's metadata, so eval / classify / generate reload the same data.
// Reading throws DataError naming `source` and the field for a value of the wrong JSON type or out
// of the range the flag takes.
nlohmann::json sprite_options_json(const SpriteOptions& options);
SpriteOptions sprite_options_from_json(const nlohmann::json& json,
                                       const std::string& source = "checkpoint metadata");

// "16x16" -> {16, 16}; throws Error on anything else.
std::pair<int64_t, int64_t> parse_tile(const std::string& text);

}  // namespace spritetorch::data
