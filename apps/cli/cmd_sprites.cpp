// The sprite subcommands: `classify` (class + confidence per PNG), `generate` (a sprite sheet or
// one PNG per sprite from a generator checkpoint), `data preview` (a PNG grid of a dataset, one row
// per class), plus the sprite flags of `train` and the generator branches of `train` and `eval`.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "checks.h"
#include "commands.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/timer.h"
#include "data/picture.h"
#include "data/sprite_sources.h"
#include "device/device.h"
#include "diffusion/generator.h"
#include "io/png.h"
#include "output.h"
#include "run_session.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::cli {

namespace {

std::string tile_check(const std::string& text) {
  try {
    data::parse_tile(text);
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

std::string dataset_check(const std::string& text) {
  if (text == "fashion-mnist" || text == "dummy" || data::is_sprite_dataset(text)) return {};
  return "expected fashion-mnist, dummy, sprites, folder:PATH, sheet:FILE or npy:FILE[,LABELS.npy]";
}

void print_generator_eval(std::ostream& out, const diffusion::GeneratorEval& r,
                          const std::vector<std::string>& class_names) {
  out << std::fixed << std::setprecision(4) << "Samples: " << r.samples << "\n"
      << "Class agreement: " << r.class_agreement << "\n";
  for (size_t k = 0; k < class_names.size() && k < r.per_class_agreement.size(); ++k)
    out << "  " << std::left << std::setw(12) << class_names[k] << "  " << r.per_class_agreement[k]
        << "\n";
  out << "Distinct: " << r.distinct << "\nExact copies of training sprites: " << r.exact_copies
      << "\n"
      << std::setprecision(2) << "Sampling: " << r.sample_seconds << " s, " << std::setprecision(1)
      << r.sprites_per_second << " sprites/s\n"
      << std::defaultfloat;
}

}  // namespace

void add_sprite_data_options(CLI::App* sub, train::TrainConfig& config, bool training) {
  auto& s = config.sprites;
  sub->add_option("--holdout", s.holdout,
                  "Sprite datasets: share held out as the test split (deterministic)")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  sub->add_option("--size", s.size,
                  "Sprite datasets: model size S (16, 32 or 64; nearest-neighbour scaling)")
      ->check(CLI::IsMember({16, 32, 64}))
      ->capture_default_str();
  sub->add_option_function<std::string>(
         "--tile",
         [&s](const std::string& text) { std::tie(s.tile_w, s.tile_h) = data::parse_tile(text); },
         "sheet: tile size WxH [default: 16x16]")
      ->check(CLI::Validator(tile_check, "WxH"));
  sub->add_option("--spacing", s.spacing, "sheet: pixels between tiles")->check(kNonNegative);
  sub->add_option("--margin", s.margin, "sheet: pixels around the tile grid")->check(kNonNegative);
  sub->add_option("--labels", s.label_map,
                  "sheet: label map, lines of 'TILE_INDEX CLASS' (row-major, from 0)")
      ->check(CLI::ExistingFile);
  sub->add_option("--sprite-count", s.count,
                  "sprites: procedural sprites to generate (before the split)")
      ->check(kPositive)
      ->capture_default_str();
  if (training)
    sub->add_option("--unet-base", config.unet_base,
                    "--task generate: UNet channels at full resolution (x2 below)")
        ->check(kPositive)
        ->capture_default_str();
  sub->add_option("--data-seed", s.seed,
                  "sprites: seed of the procedural sprites and of the holdout split")
      ->capture_default_str();
}

CLI::Validator sprite_dataset_validator() { return CLI::Validator(dataset_check, "DATASET"); }

std::shared_ptr<GeneratorEvalFlags> add_generator_eval_options(CLI::App* sub) {
  auto f = std::make_shared<GeneratorEvalFlags>();
  sub->add_option("--classifier", f->classifier,
                  "Generator checkpoints: a classifier checkpoint trained on the real data, to "
                  "judge the samples")
      ->check(CLI::ExistingFile);
  sub->add_option("--count", f->count,
                  "Generator checkpoints: samples to draw (spread over the classes)")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--steps", f->options.steps, "Generator checkpoints: DDIM steps")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--guidance", f->options.guidance,
                  "Generator checkpoints: classifier-free guidance scale")
      ->capture_default_str();
  sub->add_option("--eta", f->options.eta, "Generator checkpoints: DDIM noise (0 deterministic)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--sampler", f->options.sampler, "Generator checkpoints: ddim | ddpm")
      ->check(CLI::IsMember({"ddim", "ddpm"}))
      ->capture_default_str();
  sub->add_option("--seed", f->options.seed, "Generator checkpoints: sampling seed")
      ->capture_default_str();
  return f;
}

int run_generator_eval(const GeneratorEvalFlags& f, const std::string& checkpoint,
                       const std::string& device_text, const CpuThreadFlags& cpu, bool json) {
  if (f.classifier.empty())
    throw Error(
        "evaluating a generator needs --classifier C.pt",
        "train one on the same data: spritetorch train --task classify --dataset ... --save C.pt");
  const torch::Device device = device::pick_device(device_text);
  auto generator = diffusion::load_generator(checkpoint, device);
  const std::string threads = describe_cpu_threads(
      apply_cpu_threads(cpu.threads, cpu.blas_threads, cpu_work_of(*generator.net)));
  const auto classifier_ckpt = train::load_checkpoint(f.classifier);
  const auto names = classifier_ckpt.meta.value("class_names", std::vector<std::string>());
  if (names != generator.class_names)
    throw Error(
        "--classifier " + f.classifier + " knows other classes than the generator " + checkpoint,
        "train the classifier on the generator's dataset");
  auto classifier = train::model_from_checkpoint(classifier_ckpt, f.classifier, device);
  train::TrainConfig config;
  config.dataset = generator.meta.value("dataset", std::string("sprites"));
  if (generator.meta.contains("sprites"))
    config.sprites = data::sprite_options_from_json(generator.meta["sprites"]);
  const auto training = train::load_datasets(config).train.inputs;
  const auto r =
      diffusion::evaluate_generator(generator, *classifier, training, f.count, f.options);
  if (json) {
    std::cout << nlohmann::json{{"samples", r.samples},
                                {"class_agreement", r.class_agreement},
                                {"per_class_agreement", r.per_class_agreement},
                                {"distinct", r.distinct},
                                {"exact_copies", r.exact_copies},
                                {"sample_s", r.sample_seconds},
                                {"sprites_per_second", r.sprites_per_second},
                                {"steps", f.options.steps},
                                {"guidance", f.options.guidance},
                                {"sampler", f.options.sampler},
                                {"device", device::display_name(device)},
                                {"threads", threads}}
                     .dump()
              << "\n";
  } else {
    std::cout << "Using device: " << device::display_name(device) << "\nCPU threads: " << threads
              << "\nGenerator: " << checkpoint << " (" << f.options.sampler << ", "
              << f.options.steps << " steps, guidance " << f.options.guidance
              << ")\nJudged by: " << f.classifier << "\n";
    print_generator_eval(std::cout, r, generator.class_names);
  }
  return 0;
}

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
  sub->add_option("files", f->files, "PNG files")->required();
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
      ->check(CLI::Validator(tile_check, "WxH"));
  sub->add_option("--spacing", f->cut.spacing, "With --tile: pixels between tiles")
      ->check(kNonNegative);
  sub->add_option("--margin", f->cut.margin, "With --tile: pixels around the tile grid")
      ->check(kNonNegative);
  return {sub, [f, sub]() {
            if (!f->sheets && (sub->count("--spacing") || sub->count("--margin")))
              throw Error("--spacing and --margin cut sprite sheets: they need --tile WxH");
            const torch::Device device = device::pick_device(f->device);
            const auto checkpoint = train::load_checkpoint(f->checkpoint);
            if (checkpoint.meta.value("task", std::string()) == "generate")
              throw Error(f->checkpoint + " is a generator checkpoint",
                          "classify needs a classifier (train --task classify)");
            const auto shape = checkpoint.meta.value("input_shape", std::vector<int64_t>());
            if (!data::takes_pictures(shape))
              throw DataError(f->checkpoint,
                              "an image classifier (input shape (4, S, S) for sprites, (1, H, W) "
                              "or (3, H, W))",
                              "input shape " + c10::str(c10::IntArrayRef(shape)));
            if (f->invert && shape[0] == 4)
              throw Error("--invert is for grey and RGB models; " + f->checkpoint +
                              " is a sprite model, which takes the RGBA pixels as they are",
                          "drop --invert");
            const auto names = checkpoint.meta.value("class_names", std::vector<std::string>());
            auto model = train::model_from_checkpoint(checkpoint, f->checkpoint, device);
            apply_cpu_threads(f->cpu.threads, f->cpu.blas_threads, cpu_work_of(*model));
            model->eval();
            // One line (or JSON object) per picture; `tile` is null for whole files.
            auto classify = [&](const std::string& file, const torch::Tensor& hwc,
                                const data::SheetTile* tile) {
              const auto input = data::picture_to_input(hwc, shape, f->invert);  // (1, C, H, W)
              torch::InferenceMode guard;
              const auto probs =
                  torch::softmax(model->forward(data::to_model_input(input.to(device))), 1).cpu();
              const auto best = probs.argmax(1).item<int64_t>();
              const double confidence = probs[0][best].item<double>();
              const std::string name =
                  best < static_cast<int64_t>(names.size()) ? names[best] : std::to_string(best);
              if (f->json) {
                nlohmann::json line{{"file", file}, {"class", name}, {"confidence", confidence}};
                if (tile)
                  line.update({{"tile", tile->index}, {"row", tile->row}, {"col", tile->col}});
                std::cout << line.dump() << "\n";
              } else {
                std::cout << file << (tile ? "#" + std::to_string(tile->index) : std::string())
                          << "\t" << name << "\t" << std::fixed << std::setprecision(4)
                          << confidence << std::defaultfloat << "\n";
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
                if (grid.tiles.empty())
                  std::cerr << "note: " << file << ": every " << f->cut.tile_w << "x"
                            << f->cut.tile_h << " tile is fully transparent; nothing to classify\n";
                for (const auto& tile : grid.tiles) classify(file, tile.pixels, &tile);
                continue;
              }
              if (image.size(0) * shape[2] != image.size(1) * shape[1])
                std::cerr << "note: " << file << " is " << image.size(1) << "x" << image.size(0)
                          << ": classified as one picture, stretched to the model's " << shape[2]
                          << "x" << shape[1] << " (a sprite sheet? pass --tile WxH)\n";
              classify(file, image, nullptr);
            }
            if (unreadable > 0)
              throw Error(
                  std::to_string(unreadable) + " of " + std::to_string(f->files.size()) +
                      " files could not be read or cut (see above); the others are classified",
                  "classify takes PNG files (sprite sheets with --tile WxH)");
            return 0;
          }};
}

Subcommand add_generate_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "generate", "Draw sprites from a generator checkpoint into a PNG sprite sheet");
  struct Flags {
    std::string checkpoint, class_name, out, out_dir, palette, device = "auto";
    int64_t count = 64, scale = 1, columns = 0;
    diffusion::SampleOptions sample;
    bool json = false;
    CpuThreadFlags cpu;
  };
  auto f = std::make_shared<Flags>();
  sub->add_option("--checkpoint", f->checkpoint,
                  "Generator checkpoint (train --task generate --save)")
      ->required();
  sub->add_option("--class", f->class_name, "Class to draw (default: all classes in turn)");
  sub->add_option("--count", f->count, "Sprites to draw")->check(kPositive)->capture_default_str();
  sub->add_option("--out", f->out, "Sprite sheet PNG (grid with 1-pixel transparent padding)");
  sub->add_option("--out-dir", f->out_dir, "Also write one PNG per sprite into this folder");
  sub->add_option("--scale", f->scale, "Nearest-neighbour upscale factor")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--columns", f->columns, "Sheet columns (0: square-ish)")->check(kNonNegative);
  sub->add_option(
      "--palette", f->palette,
      "Snap colours to a palette: auto (k-means of the training set) or a PNG whose opaque colours "
      "are the palette [default: no snapping]");
  sub->add_option("--steps", f->sample.steps, "DDIM steps")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--guidance", f->sample.guidance, "Classifier-free guidance scale (1: none)")
      ->capture_default_str();
  sub->add_option("--eta", f->sample.eta, "DDIM noise: 0 deterministic, 1 DDPM-like")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--sampler", f->sample.sampler,
                  "ddim (deterministic, --steps) | ddpm (all T steps)")
      ->check(CLI::IsMember({"ddim", "ddpm"}))
      ->capture_default_str();
  sub->add_option("--seed", f->sample.seed, "Sampling seed")->capture_default_str();
  sub->add_option("--batch-size", f->sample.batch, "Sprites per forward pass")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--device", f->device, "auto | cpu | cuda | cuda:N | mps")->capture_default_str();
  sub->add_flag("--json", f->json, "Print a JSON summary");
  add_cpu_thread_options(sub, f->cpu.threads, f->cpu.blas_threads);
  return {
      sub, [f]() {
        if (f->out.empty() && f->out_dir.empty())
          throw Error("generate needs --out SHEET.png and/or --out-dir DIR");
        const torch::Device device = device::pick_device(f->device);
        auto generator = diffusion::load_generator(f->checkpoint, device);
        const std::string threads = describe_cpu_threads(
            apply_cpu_threads(f->cpu.threads, f->cpu.blas_threads, cpu_work_of(*generator.net)));
        const int64_t k = static_cast<int64_t>(generator.class_names.size());
        torch::Tensor labels = torch::arange(f->count, torch::kInt64).remainder(k);
        if (!f->class_name.empty()) {
          const auto it =
              std::find(generator.class_names.begin(), generator.class_names.end(), f->class_name);
          if (it == generator.class_names.end()) {
            std::string known;
            for (const auto& n : generator.class_names) known += (known.empty() ? "" : ", ") + n;
            throw Error("unknown class '" + f->class_name + "'", "this generator knows: " + known);
          }
          labels = torch::full({f->count}, it - generator.class_names.begin(), torch::kInt64);
        }
        DeviceTimer timer(device);
        auto sprites = diffusion::to_sprites(diffusion::sample(generator, labels, f->sample));
        const double seconds = timer.seconds();
        if (f->palette == "auto")
          sprites = diffusion::snap_to_palette(sprites, generator.palette);
        else if (!f->palette.empty())
          sprites = diffusion::snap_to_palette(sprites, diffusion::palette_from_png(f->palette));
        if (!f->out.empty())
          io::write_png(f->out, io::make_sheet(sprites, {f->columns, 1, f->scale}));
        if (!f->out_dir.empty()) {
          std::filesystem::create_directories(f->out_dir);
          for (int64_t i = 0; i < sprites.size(0); ++i) {
            const auto name = generator.class_names[static_cast<size_t>(labels[i].item<int64_t>())];
            std::ostringstream path;
            path << f->out_dir << "/" << name << "_" << std::setw(4) << std::setfill('0') << i
                 << ".png";
            io::write_png(path.str(), io::upscale_nearest(sprites[i].permute({1, 2, 0}), f->scale));
          }
        }
        const double rate = static_cast<double>(f->count) / seconds;
        if (f->json) {
          std::cout << nlohmann::json{{"count", f->count},
                                      {"seconds", seconds},
                                      {"sprites_per_second", rate},
                                      {"device", device::display_name(device)},
                                      {"threads", threads},
                                      {"out", f->out}}
                           .dump()
                    << "\n";
        } else {
          std::cout << "Generated " << f->count << " sprites on " << device::display_name(device)
                    << " in " << std::fixed << std::setprecision(2) << seconds << " s ("
                    << std::setprecision(1) << rate << " sprites/s, " << f->sample.sampler << " "
                    << f->sample.steps << " steps; CPU threads: " << threads << ")\n"
                    << std::defaultfloat;
          if (!f->out.empty()) std::cout << "Wrote " << f->out << "\n";
          if (!f->out_dir.empty())
            std::cout << "Wrote " << f->count << " PNGs to " << f->out_dir << "\n";
        }
        return 0;
      }};
}

Subcommand add_data_command(CLI::App& app) {
  auto* sub = app.add_subcommand("data", "Look at datasets");
  sub->require_subcommand(1, 1);
  auto* preview =
      sub->add_subcommand("preview", "Write a PNG grid of a dataset's samples, one row per class");
  auto config = std::make_shared<train::TrainConfig>();
  config->dataset = "sprites";
  struct Flags {
    std::string out;
    int64_t per_class = 12, scale = 4;
    std::string split = "train";
  };
  auto f = std::make_shared<Flags>();
  preview
      ->add_option("--dataset", config->dataset,
                   "sprites | folder:PATH | sheet:FILE | npy:FILE[,LABELS.npy]")
      ->check(sprite_dataset_validator())
      ->capture_default_str();
  preview->add_option("--out", f->out, "PNG to write")->required();
  preview->add_option("--per-class", f->per_class, "Samples per class (one row each)")
      ->check(kPositive)
      ->capture_default_str();
  preview->add_option("--scale", f->scale, "Nearest-neighbour upscale")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  preview->add_option("--split", f->split, "train | test")
      ->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  add_sprite_data_options(preview, *config, /*training=*/false);
  return {sub, [config, f]() {
            if (!data::is_sprite_dataset(config->dataset))
              throw Error("data preview takes sprite datasets");
            const auto sets = train::load_datasets(*config);
            const auto& d = f->split == "train" ? sets.train : sets.test;
            // Rows = classes in order; each row holds the first --per-class samples of that class.
            const int64_t k = d.num_classes(), s = d.inputs.size(2);
            auto grid = torch::zeros({k * f->per_class, 4, s, s}, torch::kUInt8);
            for (int64_t c = 0; c < k; ++c) {
              const auto index = torch::nonzero(d.labels == c).flatten();
              const int64_t n = std::min(f->per_class, index.size(0));
              if (n)
                grid.narrow(0, c * f->per_class, n)
                    .copy_(d.inputs.index_select(0, index.narrow(0, 0, n)));
            }
            io::write_png(f->out, io::make_sheet(grid, {f->per_class, 1, f->scale}));
            std::cout << "Wrote " << f->out << ": " << d.name << " (" << d.size() << " samples), "
                      << f->per_class << " per row; rows:\n";
            for (int64_t c = 0; c < k; ++c)
              std::cout << "  " << c + 1 << "  " << d.class_names[static_cast<size_t>(c)] << " ("
                        << (d.labels == c).sum().item<int64_t>() << " samples)\n";
            return 0;
          }};
}

}  // namespace spritetorch::cli
