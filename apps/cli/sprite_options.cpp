// The sprite dataset flags that train, import and data preview share (sheet cutting, holdout, size,
// procedural sprites), and their checks.
#include "checks.h"
#include "commands.h"
#include "common/error.h"
#include "data/sprite_sources.h"
#include "diffusion/generator.h"

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

}  // namespace

CLI::Validator tile_validator() { return CLI::Validator(tile_check, "WxH"); }

void add_sprite_data_options(CLI::App* sub, train::TrainConfig& config, bool training) {
  auto& s = config.sprites;
  sub->add_option("--holdout", s.holdout,
                  "Sprite datasets: share held out as the test split (deterministic)")
      ->check(number_between(0.0, 0.95))
      ->capture_default_str();
  sub->add_option("--size", s.size, "Sprite datasets: model size S (16, 32 or 64; see --resize)")
      ->check(CLI::Validator(
          [](std::string& text) {
            return text == "16" || text == "32" || text == "64"
                       ? std::string()
                       : "'" + text + "' is not a sprite size (expected 16, 32 or 64)";
          },
          "{16,32,64}", "SIZE"))
      ->capture_default_str();
  sub->add_option("--resize", s.resize,
                  "Sprite datasets: how sprites of another size are brought to --size: area "
                  "(larger ones by the mean of each pixel's area, alpha-weighted, so outlines "
                  "survive; smaller ones by pixel repetition) or nearest (every pixel repeated "
                  "or skipped)")
      ->check(CLI::IsMember({"area", "nearest"}))
      ->capture_default_str();
  sub->add_option_function<std::string>(
         "--tile",
         [&s](const std::string& text) { std::tie(s.tile_w, s.tile_h) = data::parse_tile(text); },
         "sheet: tile size WxH [default: 16x16]")
      ->check(tile_validator());
  sub->add_option("--spacing", s.spacing, "sheet: pixels between tiles")->check(kNonNegative);
  sub->add_option("--margin", s.margin, "sheet: pixels around the tile grid")->check(kNonNegative);
  sub->add_option("--labels", s.label_map,
                  "sheet: label map, lines of 'TILE_INDEX CLASS' (row-major, from 0)")
      ->check(kExistingFile);
  sub->add_option("--sprite-count", s.count,
                  "sprites: procedural sprites to generate (before the split; at most " +
                      std::to_string(data::kMaxSpriteCount) + ")")
      ->check(CLI::Range(int64_t{1}, data::kMaxSpriteCount))
      ->capture_default_str();
  if (training) {
    sub->add_option("--unet-base", config.unet_base,
                    "--task generate: UNet channels per unit of --unet-mult (the generator's "
                    "default: 32; at most " +
                        std::to_string(diffusion::kMaxUNetBase) + ")")
        ->check(multiple_of_8_up_to(diffusion::kMaxUNetBase))
        ->capture_default_str();
    sub->add_flag("--activation-checkpointing", config.activation_checkpointing,
                  "recompute activations in backward instead of keeping them (less memory, "
                  "about one more forward per step): each UNet block of a generator, each "
                  "convolution stage but the last of --model cnn and fastcnn*");
    sub->add_option(
           "--unet-attention", config.unet_attention,
           "--task generate: self-attention at a quarter of the sprite size (1), there and at "
           "half the size (2), or none (0)")
        ->capture_default_str();
    sub->add_option("--unet-scale-shift", config.unet_scale_shift,
                    "--task generate: the time and class embedding scales and shifts each "
                    "block's second GroupNorm (1) or is added before it (0)")
        ->capture_default_str();
    sub->add_option("--unet-mult", config.unet_mult,
                    "--task generate: the UNet's widths at the sprite size S, S/2 and S/4, as "
                    "multiples of --unet-base")
        // Checked while parsing, so --print-config never writes a value the run would refuse.
        ->check(CLI::Validator([](std::string& text) { return diffusion::unet_mult_problem(text); },
                               "S,S/2,S/4", "unet-mult"))
        ->capture_default_str();
    sub->add_option("--prediction", config.prediction,
                    "--task generate: what the UNet predicts: v, eps (the noise) or x0")
        ->check(CLI::IsMember({"v", "eps", "x0"}))
        ->capture_default_str();
    sub->add_option("--noise-schedule", config.noise_schedule,
                    "--task generate: cosine or linear betas (T = 500)")
        ->check(CLI::IsMember({"cosine", "linear"}))
        ->capture_default_str();
    sub->add_option("--min-snr-gamma", config.min_snr_gamma,
                    "--task generate: weight each timestep's loss as min(SNR, gamma) x the x0 "
                    "error (0: the plain MSE of the prediction)")
        ->check(kNonNegative)
        ->capture_default_str();
  }
  sub->add_option("--data-seed", s.seed,
                  "sprites: seed of the procedural sprites and of the holdout split")
      ->check(kSeed)
      ->capture_default_str();
}

CLI::Validator sprite_dataset_validator() { return CLI::Validator(dataset_check, "DATASET"); }

}  // namespace spritetorch::cli
