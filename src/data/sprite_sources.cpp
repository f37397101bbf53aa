#include "data/sprite_sources.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "common/json_field.h"
#include "common/notes.h"
#include "data/loader.h"
#include "data/procedural_sprites.h"
#include "io/png.h"

namespace spritetorch::data {

namespace fs = std::filesystem;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

void check_size(int64_t size) {
  if (size != 16 && size != 32 && size != 64)
    throw Error("--size must be 16, 32 or 64, got " + std::to_string(size));
}

std::string read_all(const std::string& path, const std::string& what) {
  check_input_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, what, "a file that cannot be opened");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// (H, W, 4) -> (1, 4, size, size), resized by `resize` (io::resize_sprites).
torch::Tensor to_sprite(const torch::Tensor& hwc, int64_t size, const std::string& resize) {
  return io::resize_sprites(hwc.permute({2, 0, 1}).unsqueeze(0), size, resize);
}

}  // namespace

bool is_sprite_dataset(const std::string& spec) {
  return spec == "sprites" || starts_with(spec, "folder:") || starts_with(spec, "sheet:") ||
         starts_with(spec, "npy:");
}

std::vector<std::string> sprite_dataset_files(const std::string& spec) {
  if (starts_with(spec, "sheet:")) return {spec.substr(6)};
  if (!starts_with(spec, "npy:")) return {};
  const std::string files = spec.substr(4);
  const auto comma = files.find(',');
  if (comma == std::string::npos) return {files};
  return {files.substr(0, comma), files.substr(comma + 1)};
}

namespace {

// One sprite option: its flag, the datasets that read it, and how to put it back to its default
// (whether `options` sets it follows: resetting it changes them).
struct SpriteField {
  const char* flag;
  const char* readers;  // the datasets that read it, as the messages name them
  bool (*reads)(const std::string& dataset);
  void (*reset)(SpriteOptions& o, const SpriteOptions& defaults);
  std::string (*text)(const SpriteOptions& o);  // the value as the flag takes it
};

bool read_by_every_sprite_set(const std::string& d) { return is_sprite_dataset(d); }
bool read_by_sheets(const std::string& d) { return starts_with(d, "sheet:"); }
bool read_by_procedural(const std::string& d) { return d == "sprites"; }

const char* const kEverySpriteSet = "sprite datasets (sprites, folder:, sheet:, npy:)";
const char* const kSheets = "sprite sheets (--dataset sheet:FILE)";

const SpriteField kSpriteFields[] = {
    {"--size", kEverySpriteSet, read_by_every_sprite_set,
     [](SpriteOptions& o, const SpriteOptions& d) { o.size = d.size; },
     [](const SpriteOptions& o) { return std::to_string(o.size); }},
    {"--holdout", kEverySpriteSet, read_by_every_sprite_set,
     [](SpriteOptions& o, const SpriteOptions& d) { o.holdout = d.holdout; },
     [](const SpriteOptions& o) { return nlohmann::json(o.holdout).dump(); }},
    {"--resize", kEverySpriteSet, read_by_every_sprite_set,
     [](SpriteOptions& o, const SpriteOptions& d) { o.resize = d.resize; },
     [](const SpriteOptions& o) { return o.resize; }},
    {"--data-seed", kEverySpriteSet, read_by_every_sprite_set,
     [](SpriteOptions& o, const SpriteOptions& d) { o.seed = d.seed; },
     [](const SpriteOptions& o) { return std::to_string(o.seed); }},
    {"--sprite-count", "the procedural sprites (--dataset sprites)", read_by_procedural,
     [](SpriteOptions& o, const SpriteOptions& d) { o.count = d.count; },
     [](const SpriteOptions& o) { return std::to_string(o.count); }},
    {"--tile", kSheets, read_by_sheets,
     [](SpriteOptions& o, const SpriteOptions& d) {
       o.tile_w = d.tile_w;
       o.tile_h = d.tile_h;
     },
     [](const SpriteOptions& o) {
       return std::to_string(o.tile_w) + "x" + std::to_string(o.tile_h);
     }},
    {"--spacing", kSheets, read_by_sheets,
     [](SpriteOptions& o, const SpriteOptions& d) { o.spacing = d.spacing; },
     [](const SpriteOptions& o) { return std::to_string(o.spacing); }},
    {"--margin", kSheets, read_by_sheets,
     [](SpriteOptions& o, const SpriteOptions& d) { o.margin = d.margin; },
     [](const SpriteOptions& o) { return std::to_string(o.margin); }},
    {"--labels", kSheets, read_by_sheets,
     [](SpriteOptions& o, const SpriteOptions& d) { o.label_map = d.label_map; },
     [](const SpriteOptions& o) {
       return o.label_map.empty() ? std::string("(none)") : o.label_map;
     }},
};

}  // namespace

void check_sprite_options_apply(const std::string& dataset, const SpriteOptions& options) {
  const SpriteOptions defaults;
  const nlohmann::json given = sprite_options_json(options);  // every field, comparable
  for (const SpriteField& f : kSpriteFields) {
    if (f.reads(dataset)) continue;
    SpriteOptions unset = options;
    f.reset(unset, defaults);
    if (sprite_options_json(unset) != given)
      throw Error(std::string(f.flag) + " applies to " + f.readers + ", not --dataset " + dataset,
                  std::string("leave ") + f.flag + " out, or choose a dataset that reads it");
  }
}

void check_given_sprite_options_match(const std::string& dataset, const SpriteOptions& options,
                                      const SpriteOptions& recorded,
                                      const std::set<std::string>& given,
                                      const std::string& recorded_in) {
  for (const SpriteField& f : kSpriteFields) {
    if (!f.reads(dataset) || !given.count(f.flag)) continue;
    if (f.text(options) != f.text(recorded))
      throw Error(std::string(f.flag) + " " + f.text(options) + ": " + recorded_in + " records " +
                      f.flag + " " + f.text(recorded) + " for " + dataset,
                  std::string("leave ") + f.flag +
                      " out to use the recorded value; weights trained on other data "
                      "need --dataset as well");
  }
}

SpriteOptions sprite_options_read_by(const std::string& dataset, SpriteOptions options) {
  const SpriteOptions defaults;
  for (const SpriteField& f : kSpriteFields)
    if (!f.reads(dataset)) f.reset(options, defaults);
  return options;
}

std::pair<int64_t, int64_t> parse_tile(const std::string& text) {
  const auto x = text.find('x');
  try {
    if (x != std::string::npos) {
      size_t used_w = 0, used_h = 0;
      const std::string ws = text.substr(0, x), hs = text.substr(x + 1);
      const long w = std::stol(ws, &used_w), h = std::stol(hs, &used_h);
      if (used_w == ws.size() && used_h == hs.size() && w > 0 && h > 0 && w <= 4096 && h <= 4096)
        return {w, h};
    }
  } catch (const std::exception&) {
  }
  throw Error("--tile must be WxH with sides in 1..4096 (e.g. 16x16), got '" + text + "'");
}

Dataset load_sprite_dataset(const std::string& spec, const SpriteOptions& options) {
  check_size(options.size);
  if (spec == "sprites") {
    if (options.count > kMaxSpriteCount)
      throw Error("--sprite-count " + std::to_string(options.count) + ": at most " +
                  std::to_string(kMaxSpriteCount) + " procedural sprites");
    Dataset d = make_procedural_sprites(options.count, options.seed);
    if (options.size != kProceduralSpriteSize)
      d.inputs = io::resize_sprites(d.inputs, options.size, options.resize);
    return d;
  }
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = spec.substr(colon + 1);
  if (arg.empty()) throw Error("--dataset " + spec + ": a path is missing after '" + kind + ":'");
  if (kind == "folder") return read_sprite_folder(arg, options.size, options.resize);
  if (kind == "sheet") return read_sprite_sheet(arg, options);
  if (kind == "npy") {
    const auto files = sprite_dataset_files(spec);
    return read_npy_sprites(files[0], files.size() > 1 ? files[1] : "", options.size,
                            options.resize);
  }
  throw Error("unknown sprite dataset '" + spec + "'",
              "expected sprites, folder:PATH, sheet:FILE or npy:FILE[,LABELS.npy]");
}

SpriteSplit holdout_split(const Dataset& all, double holdout, uint64_t seed) {
  if (!(holdout >= 0.0 && holdout < 1.0))
    throw Error("--holdout must be in [0, 1), got " + std::to_string(holdout));
  const int64_t n = all.size();
  int64_t test = static_cast<int64_t>(std::llround(static_cast<double>(n) * holdout));
  if (holdout > 0 && n >= 2) test = std::clamp<int64_t>(test, 1, n - 1);
  const auto order = epoch_order(n, seed, /*epoch=*/-1, /*shuffle=*/true);
  SpriteSplit out;
  out.train = all;
  out.test = all;
  // Sorted indices keep each split in the dataset's own order (stable for a given seed).
  const auto train_index = std::get<0>(order.narrow(0, 0, n - test).sort());
  const auto test_index = std::get<0>(order.narrow(0, n - test, test).sort());
  out.train.inputs = all.inputs.index_select(0, train_index);
  out.train.labels = all.labels.index_select(0, train_index);
  out.test.inputs = all.inputs.index_select(0, test_index);
  out.test.labels = all.labels.index_select(0, test_index);
  out.train.name = all.name + "/train";
  out.test.name = all.name + "/test";
  return out;
}

namespace {

// `p` as written under `root` ("hero/walk"), for notes about a sprite folder.
std::string relative_name(const fs::path& p, const std::string& root) {
  // Lexically: fs::relative follows links, and named a link to ".." inside a class folder ".".
  const auto relative = p.lexically_relative(root);
  return relative.empty() ? p.string() : relative.string();
}

// ".PNG" -> ".png": file names from Windows tools and cameras keep their capitals.
std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext;
}

// Whether a folder holds a .png file, at any depth (links to folders not followed).
bool holds_png(const fs::path& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (lower_extension(it->path()) == ".png") return true;
  return false;
}

}  // namespace

Dataset read_sprite_folder(const std::string& path, int64_t size, const std::string& resize) {
  check_size(size);
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw DataError(path, "a folder with one subfolder of PNG files per class",
                    fs::exists(path, ec) ? "a file" : "no such folder");
  // Hidden entries (.git, macOS's ._name.png) are not classes or sprites.
  auto hidden = [](const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; };
  auto other_picture = [&](const fs::path& p) {
    static const std::set<std::string> kinds = {".gif",  ".jpg", ".jpeg", ".bmp",
                                                ".webp", ".tga", ".tif",  ".tiff",
                                                ".qoi",  ".psd", ".ase",  ".aseprite"};
    return kinds.count(lower_extension(p)) > 0;
  };
  // What is left out is said (stderr), not dropped without a word: a class folder without PNGs
  // is no class, a .png entry that is no file (a broken link, a folder) is no sprite, and PNGs
  // outside the class folders, in folders inside them, or pictures of other formats are not read.
  std::vector<std::string> empty_classes, not_files, top_level, nested, other_formats, dead_links;
  std::vector<fs::path> class_dirs;
  // A folder the process may not list is an error naming it, not a raw filesystem exception (exit
  // 1) nor, for a class, a class dropped.
  auto entries_of = [](const fs::path& dir, const char* what) {
    std::error_code error;
    std::vector<fs::directory_entry> entries;
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
      entries.push_back(*it);
    if (error)
      throw DataError(dir.string(), std::string(what) + " this process may read",
                      "it cannot be read (" + error.message() + ")");
    return entries;
  };
  // Links that lead nowhere (missing targets, loops) are said and left out.
  auto is_folder = [&](const fs::directory_entry& entry) {
    std::error_code error;
    const bool folder = entry.is_directory(error);
    if (error || (!folder && entry.is_symlink(error) && !entry.exists(error)))
      dead_links.push_back(relative_name(entry.path(), path));
    return folder && !error;
  };
  for (const auto& entry : entries_of(path, "a sprite folder")) {
    if (hidden(entry.path())) continue;
    const size_t dead = dead_links.size();
    if (is_folder(entry))
      class_dirs.push_back(entry.path());
    else if (dead_links.size() == dead && lower_extension(entry.path()) == ".png")
      top_level.push_back(entry.path().filename().string());
  }
  std::sort(class_dirs.begin(), class_dirs.end());
  std::vector<torch::Tensor> images;
  std::vector<int64_t> labels;
  std::vector<std::string> png_warnings;  // "FILE (its first warning)"
  Dataset out;
  for (const auto& dir : class_dirs) {
    std::vector<fs::path> files;
    for (const auto& entry : entries_of(dir, "a class folder")) {
      if (hidden(entry.path())) continue;
      const std::string ext = lower_extension(entry.path());
      if (ext != ".png") {
        if (is_folder(entry) && holds_png(entry.path()))
          nested.push_back(relative_name(entry.path(), path));
        else if (other_picture(entry.path()))
          other_formats.push_back(relative_name(entry.path(), path));
        continue;
      }
      std::error_code error;
      if (entry.is_regular_file(error))
        files.push_back(entry.path());
      else
        not_files.push_back(entry.path().string());
    }
    if (files.empty()) {
      empty_classes.push_back(dir.filename().string());
      continue;
    }
    std::sort(files.begin(), files.end());
    const auto label = static_cast<int64_t>(out.class_names.size());
    out.class_names.push_back(dir.filename().string());
    for (const auto& f : files) {
      std::vector<std::string> warnings;
      images.push_back(to_sprite(io::read_png(f.string(), &warnings), size, resize));
      labels.push_back(label);
      if (!warnings.empty())
        png_warnings.push_back(relative_name(f, path) + " (" + warnings.front() + ")");
    }
  }
  if (images.empty())
    throw DataError(path, "subfolders (one per class) holding .png files",
                    "no PNG files in any subfolder", "lay the data out as PATH/<class>/<name>.png");
  auto listed = [](const std::vector<std::string>& names) {
    std::string text;
    for (size_t i = 0; i < names.size() && i < 3; ++i) text += (i ? ", " : "") + names[i];
    return names.size() > 3 ? text + " and " + std::to_string(names.size() - 3) + " more" : text;
  };
  if (!empty_classes.empty())
    note(path + ": no .png files in " + listed(empty_classes) + ", so no class of that name");
  if (!not_files.empty())
    note(path + ": " + std::to_string(not_files.size()) +
         " .png entries are not files (broken links or folders), left out: " + listed(not_files));
  if (!dead_links.empty())
    note(path + ": " + std::to_string(dead_links.size()) +
         " links lead nowhere (a missing target or a loop), left out: " + listed(dead_links));
  if (!top_level.empty())
    note(path + ": " + std::to_string(top_level.size()) +
         " .png files are in no class folder, left out: " + listed(top_level) +
         " (a class is a subfolder: PATH/<class>/<name>.png)");
  if (!nested.empty())
    note(path + ": " + std::to_string(nested.size()) +
         " folders inside class folders hold .png files, left out: " + listed(nested) +
         " (a class's sprites are its folder's own files: move them up, or make each "
         "folder a class of its own)");
  if (!other_formats.empty())
    note(path + ": " + std::to_string(other_formats.size()) + " pictures are not PNG, left out: " +
         listed(other_formats) + " (save them as .png to use them)");
  if (!png_warnings.empty())
    note(path + ": " + std::to_string(png_warnings.size()) +
         " files are damaged but readable: " + listed(png_warnings));
  out.inputs = torch::cat(images);
  out.labels = torch::tensor(labels, torch::kInt64);
  // "sprites/" names the folder "sprites", as "sprites" does.
  const fs::path folder = fs::path(path).lexically_normal();
  out.name =
      "folder:" + (folder.has_filename() ? folder : folder.parent_path()).filename().string();
  return out;
}

SheetGrid cut_sheet(const torch::Tensor& sheet, const std::string& file, const SpriteOptions& o) {
  if (o.tile_w <= 0 || o.tile_h <= 0 || o.spacing < 0 || o.margin < 0)
    throw Error("sheet slicing needs positive --tile sides and non-negative --spacing / --margin");
  const int64_t h = sheet.size(0), w = sheet.size(1);
  // Options up to 2^63 - 1 must not overflow the grid's arithmetic: a margin or tile beyond the
  // sheet fits no tile, and a spacing beyond the sheet's side cuts the same grid as one of that
  // side (one tile per row and column).
  const bool too_large = o.margin > std::min(w, h) / 2 || o.tile_w > w || o.tile_h > h;
  const int64_t spacing = std::min(o.spacing, std::max(w, h));
  SheetGrid grid;
  if (!too_large) {
    grid.cols = (w - 2 * o.margin + spacing) / (o.tile_w + spacing);
    grid.rows = (h - 2 * o.margin + spacing) / (o.tile_h + spacing);
  }
  if (grid.cols <= 0 || grid.rows <= 0)
    throw DataError(file,
                    "at least one " + std::to_string(o.tile_w) + "x" + std::to_string(o.tile_h) +
                        " tile with margin " + std::to_string(o.margin),
                    "an image of " + std::to_string(w) + "x" + std::to_string(h));
  for (int64_t r = 0; r < grid.rows; ++r)
    for (int64_t c = 0; c < grid.cols; ++c) {
      auto pixels = sheet.narrow(0, o.margin + r * (o.tile_h + spacing), o.tile_h)
                        .narrow(1, o.margin + c * (o.tile_w + spacing), o.tile_w);
      if (pixels.select(2, 3).max().item<int>() == 0) continue;  // fully transparent: an empty slot
      grid.tiles.push_back({r * grid.cols + c, r, c, std::move(pixels)});
    }
  // A sheet that is not a whole number of tiles: the strip past the last column or row is cut
  // off, which loses sprites when it holds any (a wrong --tile, --spacing or --margin).
  const int64_t covered_w = o.margin + grid.cols * (o.tile_w + spacing) - spacing;
  const int64_t covered_h = o.margin + grid.rows * (o.tile_h + spacing) - spacing;
  const auto visible = [&](int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
    return y1 > y0 && x1 > x0 &&
           sheet.narrow(0, y0, y1 - y0).narrow(1, x0, x1 - x0).select(2, 3).max().item<int>() > 0;
  };
  std::vector<std::string> strips;
  if (visible(0, h, covered_w, w - o.margin))
    strips.push_back(std::to_string(w - o.margin - covered_w) + " pixel columns on the right");
  if (visible(covered_h, h - o.margin, 0, w))
    strips.push_back(std::to_string(h - o.margin - covered_h) + " pixel rows at the bottom");
  if (!strips.empty())
    grid.uncovered = file + " is " + std::to_string(w) + "x" + std::to_string(h) + ": its " +
                     strips[0] + (strips.size() > 1 ? " and " + strips[1] : "") +
                     " hold visible pixels that no " + std::to_string(o.tile_w) + "x" +
                     std::to_string(o.tile_h) +
                     " tile covers (check --tile, --spacing and --margin)";
  return grid;
}

Dataset read_sprite_sheet(const std::string& file, const SpriteOptions& o) {
  check_size(o.size);
  const SheetGrid grid = cut_sheet(io::read_png(file), file, o);
  if (!grid.uncovered.empty()) note(grid.uncovered);
  const int64_t slots = grid.rows * grid.cols;
  // Optional label map: "TILE_INDEX CLASS" per line; tiles it does not name are left out.
  std::map<int64_t, std::string> names;
  if (!o.label_map.empty()) {
    std::istringstream lines(read_all(o.label_map, "a label map of 'TILE_INDEX CLASS' lines"));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(lines, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a map saved on Windows
      std::istringstream fields(line);
      std::string index_text, name, extra;
      fields >> index_text >> name >> extra;
      if (index_text.empty() || index_text[0] == '#') continue;  // blank or a comment
      // Exactly two fields, the first all digits: "2.7 b" or "2x b" must not read as tile 2, nor
      // "0 long sword" as class "long".
      int64_t index = -1;
      if (index_text.size() <= 12 &&
          index_text.find_first_not_of("0123456789") == std::string::npos)
        index = std::stoll(index_text);
      if (index < 0 || index >= slots || name.empty() || !extra.empty())
        throw DataError(o.label_map,
                        "'TILE_INDEX CLASS' with an index in 0.." + std::to_string(slots - 1) +
                            " and a class name of one word",
                        "'" + line + "' on line " + std::to_string(line_no));
      if (const auto seen = names.find(index); seen != names.end())
        throw DataError(o.label_map, "each tile index once",
                        "tile " + std::to_string(index) + " again on line " +
                            std::to_string(line_no) + " ('" + seen->second + "' before, '" + name +
                            "' now)");
      names[index] = name;
    }
    // An empty map would silently mean "no map" (every tile, one class): say so instead.
    if (names.empty())
      throw DataError(o.label_map, "at least one 'TILE_INDEX CLASS' line",
                      "none (empty, or only comments)");
  }
  std::vector<std::string> class_names;
  if (names.empty()) {
    class_names = {"sprite"};
  } else {
    for (const auto& [i, n] : names)
      if (std::find(class_names.begin(), class_names.end(), n) == class_names.end())
        class_names.push_back(n);
    std::sort(class_names.begin(), class_names.end());
  }
  std::vector<torch::Tensor> tiles;
  std::vector<int64_t> labels;
  for (const auto& tile : grid.tiles) {
    int64_t label = 0;
    if (!names.empty()) {
      auto it = names.find(tile.index);
      if (it == names.end()) continue;
      label = std::find(class_names.begin(), class_names.end(), it->second) - class_names.begin();
    }
    tiles.push_back(to_sprite(tile.pixels, o.size, o.resize));
    labels.push_back(label);
  }
  if (tiles.empty()) throw DataError(file, "at least one non-transparent tile", "none");
  Dataset out;
  out.inputs = torch::cat(tiles).contiguous();
  out.labels = torch::tensor(labels, torch::kInt64);
  out.class_names = class_names;
  out.name = "sheet:" + fs::path(file).filename().string();
  return out;
}

nlohmann::json sprite_options_json(const SpriteOptions& o) {
  return {{"size", o.size},     {"count", o.count},         {"seed", o.seed},
          {"tile_w", o.tile_w}, {"tile_h", o.tile_h},       {"spacing", o.spacing},
          {"margin", o.margin}, {"label_map", o.label_map}, {"holdout", o.holdout},
          {"resize", o.resize}};
}

SpriteOptions sprite_options_from_json(const nlohmann::json& j, const std::string& source) {
  SpriteOptions o;
  auto field = [&](const char* key, auto fallback) {
    return json_field(j, key, fallback, source, std::string("sprites.") + key);
  };
  o.size = field("size", o.size);
  o.count = field("count", o.count);
  o.seed = field("seed", o.seed);
  o.tile_w = field("tile_w", o.tile_w);
  o.tile_h = field("tile_h", o.tile_h);
  o.spacing = field("spacing", o.spacing);
  o.margin = field("margin", o.margin);
  o.label_map = field("label_map", o.label_map);
  o.holdout = field("holdout", o.holdout);
  o.resize = field("resize", std::string("nearest"));  // checkpoints from before "area"
  // The readers' own checks name the flags, which this file's user never gave.
  auto out_of_range = [&](const char* key, const std::string& expected) {
    throw DataError(source, std::string("metadata 'sprites.") + key + "' " + expected,
                    j.at(key).dump());
  };
  if (o.size != 16 && o.size != 32 && o.size != 64) out_of_range("size", "16, 32 or 64");
  if (o.count <= 0 || o.count > kMaxSpriteCount)
    out_of_range("count", "from 1 to " + std::to_string(kMaxSpriteCount));
  if (o.tile_w < 1 || o.tile_w > 4096) out_of_range("tile_w", "from 1 to 4096");
  if (o.tile_h < 1 || o.tile_h > 4096) out_of_range("tile_h", "from 1 to 4096");
  if (o.spacing < 0) out_of_range("spacing", ">= 0");
  if (o.margin < 0) out_of_range("margin", ">= 0");
  if (!(o.holdout >= 0.0 && o.holdout <= 0.95)) out_of_range("holdout", "from 0 to 0.95");
  if (o.resize != "area" && o.resize != "nearest") out_of_range("resize", "area or nearest");
  return o;
}

NpyArray parse_npy(const std::string& bytes, const std::string& name) {
  static const std::string kMagic = "\x93NUMPY";
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic) != 0)
    throw DataError(name, "a NumPy .npy file (magic \\x93NUMPY)",
                    bytes.size() < 10 ? std::to_string(bytes.size()) + " bytes" : "other bytes");
  const int major = static_cast<uint8_t>(bytes[6]);
  uint64_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) |
                 (static_cast<uint64_t>(static_cast<uint8_t>(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12)
      throw DataError(name, "a 12-byte .npy v2 preamble", std::to_string(bytes.size()) + " bytes");
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    throw DataError(name, ".npy format version 1, 2 or 3", "version " + std::to_string(major));
  }
  if (header_len > bytes.size() - offset)
    throw DataError(name, "a header of at most " + std::to_string(bytes.size() - offset) + " bytes",
                    "a header length of " + std::to_string(header_len));
  const std::string header = bytes.substr(offset, header_len);
  offset += header_len;
  // The header is a Python dict literal: {'descr': '<u1', 'fortran_order': False, 'shape': (N, H,
  // W, C), }
  auto value_of = [&](const std::string& key) -> std::string {
    const auto k = header.find("'" + key + "'");
    if (k == std::string::npos)
      throw DataError(name, "a header with '" + key + "'", "'" + header + "'");
    const auto colon = header.find(':', k);
    if (colon == std::string::npos)
      throw DataError(name, "'" + key + "': value", "'" + header + "'");
    return header.substr(colon + 1);
  };
  NpyArray out;
  {
    const std::string v = value_of("descr");
    const auto q1 = v.find('\''), q2 = q1 == std::string::npos ? q1 : v.find('\'', q1 + 1);
    if (q2 == std::string::npos) throw DataError(name, "a quoted descr", "'" + header + "'");
    out.descr = v.substr(q1 + 1, q2 - q1 - 1);
  }
  if (value_of("fortran_order").find("False") != 0 && value_of("fortran_order").find(" False") != 0)
    throw DataError(name, "fortran_order False (C order)", "'" + header + "'",
                    "save with np.ascontiguousarray");
  {
    const std::string v = value_of("shape");
    const auto open = v.find('('), close = v.find(')');
    if (open == std::string::npos || close == std::string::npos || close < open)
      throw DataError(name, "a shape tuple", "'" + header + "'");
    std::istringstream dims(v.substr(open + 1, close - open - 1));
    std::string part;
    while (std::getline(dims, part, ',')) {
      if (part.find_first_not_of(" \t") == std::string::npos) continue;
      size_t used = 0;
      long long d = -1;
      try {
        d = std::stoll(part, &used);
      } catch (const std::exception&) {
      }
      if (d < 0 || part.find_first_not_of(" \t", used) != std::string::npos)
        throw DataError(name, "non-negative integer dimensions",
                        "'" + part + "' in '" + header + "'");
      out.shape.push_back(d);
    }
  }
  struct Type {
    const char* descr;
    torch::ScalarType type;
    uint64_t size;
  };
  static const Type kTypes[] = {{"|u1", torch::kUInt8, 1},   {"<u1", torch::kUInt8, 1},
                                {"|i1", torch::kInt8, 1},    {"<i4", torch::kInt32, 4},
                                {"<i8", torch::kInt64, 8},   {"<f4", torch::kFloat32, 4},
                                {"<f8", torch::kFloat64, 8}, {"|b1", torch::kBool, 1}};
  const Type* type = nullptr;
  for (const auto& t : kTypes)
    if (out.descr == t.descr) type = &t;
  if (!type)
    throw DataError(name,
                    "dtype uint8, int8, int32, int64, float32, float64 or bool (little-endian)",
                    "descr '" + out.descr + "'");
  // Element count with overflow checks: never trust the header's product.
  uint64_t elements = 1;
  const uint64_t available = bytes.size() - offset;
  for (int64_t d : out.shape) {
    if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      throw DataError(name, "a shape whose size fits in 64 bits",
                      "shape " + c10::str(c10::IntArrayRef(out.shape)));
    elements *= static_cast<uint64_t>(d);
  }
  if (elements > available / type->size || elements * type->size != available)
    throw DataError(name,
                    std::to_string(elements) + " x " + std::to_string(type->size) +
                        " data bytes for shape " + c10::str(c10::IntArrayRef(out.shape)),
                    std::to_string(available) + " bytes after the header",
                    "the file is truncated or corrupt");
  out.data = torch::empty(out.shape, type->type);
  if (elements) std::memcpy(out.data.data_ptr(), bytes.data() + offset, elements * type->size);
  return out;
}

NpyArray read_npy(const std::string& file) {
  return parse_npy(read_all(file, "a NumPy .npy file"), file);
}

// As many classes as a checkpoint may hold (train/run_state.h).
constexpr int64_t kMaxNpyClasses = 65536;

Dataset read_npy_sprites(const std::string& file, const std::string& labels_file, int64_t size,
                         const std::string& resize) {
  check_size(size);
  NpyArray images = read_npy(file);
  if (images.data.scalar_type() != torch::kUInt8)
    throw DataError(file, "uint8 pixels (descr |u1)", "descr '" + images.descr + "'",
                    "save with arr.astype(np.uint8)");
  auto x = images.data;
  if (x.dim() == 3) x = x.unsqueeze(3);  // N x H x W grey
  if (x.dim() != 4 || (x.size(3) != 1 && x.size(3) != 3 && x.size(3) != 4) || x.size(0) == 0 ||
      x.size(1) == 0 || x.size(2) == 0)
    throw DataError(file, "N x H x W x C uint8 with C = 1, 3 or 4 and N, H, W > 0",
                    "shape " + c10::str(c10::IntArrayRef(images.shape)));
  // Expand to RGBA: grey -> RGB, missing alpha -> opaque.
  if (x.size(3) == 1) x = x.expand({-1, -1, -1, 3});
  if (x.size(3) == 3)
    x = torch::cat({x, torch::full({x.size(0), x.size(1), x.size(2), 1}, 255, torch::kUInt8)}, 3);
  Dataset out;
  out.inputs = io::resize_sprites(x.permute({0, 3, 1, 2}).contiguous(), size, resize).contiguous();
  const int64_t n = x.size(0);
  if (labels_file.empty()) {
    out.labels = torch::zeros({n}, torch::kInt64);
    out.class_names = {"sprite"};
  } else {
    NpyArray l = read_npy(labels_file);
    torch::Tensor labels;
    if (l.data.dim() == 2 && l.data.size(0) == n && l.data.size(1) >= 1) {  // one-hot (N, K)
      if (l.data.size(1) > kMaxNpyClasses)
        throw DataError(labels_file, "at most " + std::to_string(kMaxNpyClasses) + " classes",
                        std::to_string(l.data.size(1)) + " one-hot columns");
      const auto scores = l.data.to(torch::kFloat64);
      if (!torch::isfinite(scores).all().item<bool>())
        throw DataError(labels_file, "finite one-hot scores", "NaN or infinity");
      // Each row must name one class: an all-zero or a multi-hot row would go to its first
      // column by argmax's tie rule, silently.
      if (n > 0) {
        const auto ties = scores.eq(std::get<0>(scores.max(1, /*keepdim=*/true))).sum(1);
        const auto bad = ties.gt(1).nonzero();
        if (bad.size(0) > 0) {
          const int64_t row = bad[0][0].item<int64_t>();
          throw DataError(labels_file, "one-hot rows with one largest score (one class each)",
                          "row " + std::to_string(row) + " with its largest score in " +
                              std::to_string(ties[row].item<int64_t>()) + " columns (" +
                              std::to_string(bad.size(0)) + " such rows)");
        }
      }
      labels = scores.argmax(1);
      out.class_names.resize(static_cast<size_t>(l.data.size(1)));
    } else if (l.data.dim() == 1 && l.data.size(0) == n &&
               !l.data.is_floating_point()) {  // integer (N)
      labels = l.data.to(torch::kInt64);
      if (n && labels.min().item<int64_t>() < 0)
        throw DataError(labels_file, "class indices >= 0",
                        std::to_string(labels.min().item<int64_t>()));
      // Checked before the names are made: a stray 10^12 must not become 10^12 strings.
      const int64_t largest = n ? labels.max().item<int64_t>() : 0;
      if (largest >= kMaxNpyClasses)
        throw DataError(labels_file,
                        "class indices below " + std::to_string(kMaxNpyClasses) +
                            " (a checkpoint holds at most that many classes)",
                        std::to_string(largest));
      out.class_names.resize(static_cast<size_t>(largest + 1));
    } else {
      throw DataError(labels_file,
                      "labels for " + std::to_string(n) + " sprites: one-hot (" +
                          std::to_string(n) + ", K) or integer (" + std::to_string(n) + ")",
                      "shape " + c10::str(c10::IntArrayRef(l.shape)) + " descr '" + l.descr + "'");
    }
    for (size_t k = 0; k < out.class_names.size(); ++k)
      out.class_names[k] = "class" + std::to_string(k);
    out.labels = labels.contiguous();
  }
  out.name = "npy:" + fs::path(file).filename().string();
  return out;
}

}  // namespace spritetorch::data
