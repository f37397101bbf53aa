// `spritetorch data preview`: a PNG grid of a sprite dataset, one row per class.
#include <algorithm>
#include <iostream>

#include "checks.h"
#include "commands.h"
#include "common/error.h"
#include "common/output_file.h"
#include "data/sprite_sources.h"
#include "io/png.h"
#include "train/trainer.h"

namespace spritetorch::cli {

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
    bool overwrite = false;
  };
  auto f = std::make_shared<Flags>();
  preview
      ->add_option("--dataset", config->dataset,
                   "sprites | folder:PATH | sheet:FILE | npy:FILE[,LABELS.npy]")
      ->check(sprite_dataset_validator())
      ->capture_default_str();
  preview->add_option("--out", f->out, "PNG to write")->required()->check(kPath);
  preview->add_option("--per-class", f->per_class, "Samples per class (one row each; at most 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  preview->add_option("--scale", f->scale, "Nearest-neighbour upscale")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  preview->add_option("--split", f->split, "train | test")
      ->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  preview->add_flag("--overwrite", f->overwrite, "Replace an existing --out file");
  add_sprite_data_options(preview, *config, /*training=*/false);
  return {sub, [config, f]() {
            if (!data::is_sprite_dataset(config->dataset))
              throw Error("data preview takes sprite datasets");
            check_output_path(f->out, f->overwrite, "--out");
            const auto sets = train::load_datasets(*config);
            const auto& d = f->split == "train" ? sets.train : sets.test;
            if (d.size() == 0)
              throw Error("--split " + f->split + " of " + d.name + " holds no samples" +
                              (f->split == "test" && config->sprites.holdout == 0
                                   ? " (--holdout 0 holds none out)"
                                   : ""),
                          f->split == "test" ? "a --holdout above 0 makes a test split"
                                             : "preview --split test, or a smaller --holdout");
            io::check_sheet_size(d.num_classes() * f->per_class, d.inputs.size(2), d.inputs.size(3),
                                 {f->per_class, 1, f->scale});
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
            io::write_png(f->out, io::make_sheet(grid, {f->per_class, 1, f->scale}),
                          if_exists(f->overwrite));
            std::cout << "Wrote " << f->out << ": " << d.name << " (" << d.size() << " samples), "
                      << f->per_class << " per row; rows:\n";
            for (int64_t c = 0; c < k; ++c)
              std::cout << "  " << c + 1 << "  " << d.class_names[static_cast<size_t>(c)] << " ("
                        << (d.labels == c).sum().item<int64_t>() << " samples)\n";
            return 0;
          }};
}

}  // namespace spritetorch::cli
