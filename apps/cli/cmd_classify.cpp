// `spritetorch classify`: class + confidence per PNG, or per tile of sprite sheets.
#include <cmath>
#include <iomanip>
#include <iostream>

#include "checks.h"
#include "commands.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/json_field.h"
#include "common/json_text.h"
#include "data/picture.h"
#include "data/sprite_sources.h"
#include "device/device.h"
#include "io/png.h"
#include "models/predict.h"
#include "train/checkpoint_dataset.h"
#include "train/classifier_task.h"
#include "train/model_state.h"

namespace spritetorch::cli {

namespace {

// A file or class name as one field of the tab-separated lines: a tab, newline or backslash in it
// written \t, \n, \\ (and a carriage return \r), so that each line keeps its three fields.
std::string tsv_field(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

Subcommand add_classify_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "classify",
      "Classify PNGs with a classifier checkpoint (sprite models, and Fashion-MNIST ones on grey "
      "pictures): one picture per file, or every tile of sprite sheets (--tile)");
  struct Flags {
    std::string checkpoint, device = "auto";
    std::vector<std::string> files;
    bool json = false;
    bool sheets = false;  // --tile given: each file is a sheet of tiles
    bool invert = false;
    data::SpriteOptions cut;
    CpuThreadFlags cpu;
  };
  auto f = std::make_shared<Flags>();
  sub->add_option("--checkpoint", f->checkpoint, "Classifier checkpoint (train --save)")
      ->required();
  sub->add_option("files", f->files,
                  "PNG files; each gets a line FILE<tab>CLASS<tab>CONFIDENCE (a tab, newline or "
                  "backslash in a name written \\t, \\n, \\\\)")
      ->required();
  sub->add_option("--device", f->device, "auto | cpu | cuda | cuda:N | mps")->capture_default_str();
  sub->add_flag("--json", f->json, "Print one JSON object per file (per tile with --tile)");
  add_cpu_thread_options(sub, f->cpu.threads, f->cpu.blas_threads);
  sub->add_flag("--invert", f->invert,
                "Grey and RGB models: invert the pictures first (a dark item on a light ground; "
                "Fashion-MNIST draws light items on black)");
  sub->add_option_function<std::string>(
         "--tile",
         [f](const std::string& text) {
           std::tie(f->cut.tile_w, f->cut.tile_h) = data::parse_tile(text);
           f->sheets = true;
         },
         "The files are sprite sheets: classify each non-empty WxH tile (row-major index from 0)")
      ->check(tile_validator());
  sub->add_option("--spacing", f->cut.spacing, "With --tile: pixels between tiles")
      ->check(kNonNegative);
  sub->add_option("--margin", f->cut.margin, "With --tile: pixels around the tile grid")
      ->check(kNonNegative);
  return {
      sub, [f, sub]() {
        if (!f->sheets && (sub->count("--spacing") || sub->count("--margin")))
          throw Error("--spacing and --margin cut sprite sheets: they need --tile WxH");
        const torch::Device device = device::pick_device(f->device);
        const auto checkpoint = train::load_checkpoint(f->checkpoint);
        if (json_field(checkpoint.meta, "task", std::string(), f->checkpoint, "task") == "generate")
          throw Error(f->checkpoint + " is a generator checkpoint",
                      "classify needs a classifier (train --task classify)");
        const auto shape = json_field(checkpoint.meta, "input_shape", std::vector<int64_t>(),
                                      f->checkpoint, "input_shape");
        if (!data::takes_pictures(shape))
          throw DataError(f->checkpoint,
                          "an image classifier (input shape (4, S, S) for sprites, (1, H, W) "
                          "or (3, H, W))",
                          "input shape " + c10::str(c10::IntArrayRef(shape)));
        if (f->invert && shape[0] == 4)
          throw Error("--invert is for grey and RGB models; " + f->checkpoint +
                          " is a sprite model, which takes the RGBA pixels as they are",
                      "drop --invert");
        const auto names = json_field(checkpoint.meta, "class_names", std::vector<std::string>(),
                                      f->checkpoint, "class_names");
        // Sprites of another size are resized as the training set was.
        const std::string sprite_resize =
            train::checkpoint_data_config(checkpoint.meta, f->checkpoint).sprites.resize;
        auto model = train::model_from_checkpoint(checkpoint, f->checkpoint, device);
        apply_cpu_threads(f->cpu.threads, f->cpu.blas_threads, cpu_work_of(*model));
        model->eval();
        const auto forward = train::checkpoint_forward(checkpoint.meta, model, f->checkpoint);
        // One line (or JSON object) per picture; `tile` is null for whole files.
        auto classify = [&](const std::string& file, const torch::Tensor& hwc,
                            const data::SheetTile* tile) {
          const auto input =
              data::picture_to_input(hwc, shape, f->invert, sprite_resize);  // (1, C, H, W)
          const auto prediction =
              models::predict(forward, data::to_model_input(input.to(device)), names).at(0);
          const std::string& name = prediction.name;
          const double confidence = prediction.confidence;
          if (!std::isfinite(confidence))  // finite weights whose outputs overflow
            throw DataError(
                f->checkpoint, "a model whose outputs are finite",
                "outputs that are not for " + file,
                "the run that wrote it was diverging: take an earlier checkpoint of it");
          if (f->json) {
            nlohmann::json line{{"file", file}, {"class", name}, {"confidence", confidence}};
            if (tile) line.update({{"tile", tile->index}, {"row", tile->row}, {"col", tile->col}});
            std::cout << json_text(line) << "\n";
          } else {
            std::cout << tsv_field(file)
                      << (tile ? "#" + std::to_string(tile->index) : std::string()) << "\t"
                      << tsv_field(name) << "\t" << std::fixed << std::setprecision(4) << confidence
                      << std::defaultfloat << "\n";
          }
        };
        // A file that cannot be read is reported and skipped: the others still get their
        // lines, and the exit code says that something was missing.
        int unreadable = 0;
        for (const auto& file : f->files) {
          torch::Tensor image;   // (H, W, 4) uint8
          data::SheetGrid grid;  // with --tile
          try {
            image = io::read_png(file);
            if (f->sheets) grid = data::cut_sheet(image, file, f->cut);
          } catch (const DataError& e) {
            std::cout << std::flush;
            std::cerr << "error: " << e.what() << "\n";
            ++unreadable;
            continue;
          }
          if (f->sheets) {
            if (!grid.uncovered.empty()) std::cerr << "note: " << grid.uncovered << "\n";
            if (grid.tiles.empty())
              std::cerr << "note: " << file << ": every " << f->cut.tile_w << "x" << f->cut.tile_h
                        << " tile is fully transparent; nothing to classify\n";
            for (const auto& tile : grid.tiles) classify(file, tile.pixels, &tile);
            continue;
          }
          if (image.size(0) * shape[2] != image.size(1) * shape[1])
            std::cerr << "note: " << file << " is " << image.size(1) << "x" << image.size(0)
                      << ": classified as one picture, stretched to the model's " << shape[2] << "x"
                      << shape[1] << " (a sprite sheet? pass --tile WxH)\n";
          classify(file, image, nullptr);
        }
        if (unreadable > 0)
          throw Error(std::to_string(unreadable) + " of " + std::to_string(f->files.size()) +
                          " files could not be read or cut (see above); the others are classified",
                      "classify takes PNG files (sprite sheets with --tile WxH)");
        return 0;
      }};
}

}  // namespace spritetorch::cli
