// `spritetorch generate`: a sprite sheet or one PNG per sprite from a generator checkpoint.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "checks.h"
#include "commands.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/json_text.h"
#include "common/output_file.h"
#include "common/timer.h"
#include "device/device.h"
#include "diffusion/cuda_graph_sampler.h"
#include "diffusion/generator.h"
#include "io/png.h"

namespace spritetorch::cli {

void check_sampler_options(const CLI::App& sub, const diffusion::SampleOptions& options) {
  if (options.guidance == 1.0 && sub.count("--guidance-interval") > 0)
    throw Error(
        "--guidance-interval places guidance on part of the schedule; --guidance 1 is no "
        "guidance, so there is nothing to place",
        "give --guidance W (W > 1), or leave --guidance-interval out");
  if (options.sampler != "ddim" && sub.count("--eta") > 0)
    throw Error("--eta is DDIM's noise; --sampler " + options.sampler + " does not take it",
                "use --sampler ddim, or leave --eta out");
  if (options.sampler == "ddpm")
    for (const char* name : {"--steps", "--spacing"})
      if (sub.count(name) > 0)
        throw Error(
            std::string(name) + ": --sampler ddpm takes every one of the schedule's T steps",
            "use --sampler ddim or dpm++2m for fewer steps");
}

void add_guidance_options(CLI::App* sub, diffusion::SampleOptions& options, std::string& interval,
                          const std::string& prefix) {
  sub->add_option("--guidance", options.guidance,
                  prefix +
                      "Classifier-free guidance scale on the steps of --guidance-interval (1: "
                      "none; 0: unconditional there, every step with --guidance-interval 0:1; "
                      "1-10 is usual, past that the sprites saturate)")
      ->check(number_between(0, diffusion::kMaxGuidance))
      ->capture_default_str();
  sub->add_option("--guidance-interval", interval,
                  prefix +
                      "Guide only the steps with t/T in FROM:TO (1 is pure noise; 0:1 every "
                      "step); the others take the conditional output alone, one pass of the net "
                      "instead of two")
      ->capture_default_str();
}

void add_alpha_option(CLI::App* sub, std::string& alpha, const std::string& prefix) {
  sub->add_option("--alpha", alpha,
                  prefix + (prefix.empty() ? "T" : "t") +
                      "he sprites' alpha: binary (opaque or transparent, pixel art's hard "
                      "edges), soft (8 bits: shadows, glows, antialiased edges), or auto (what "
                      "the training set had: soft when " +
                      c10::str(diffusion::kSoftAlphaShare * 100) +
                      "% or more of its visible pixels are partly transparent; recorded in the "
                      "checkpoint)")
      ->check(CLI::IsMember({"auto", "binary", "soft"}))
      ->capture_default_str();
}

std::optional<diffusion::AlphaMode> alpha_option(const std::string& alpha) {
  if (alpha == "auto") return std::nullopt;
  return diffusion::parse_alpha_mode(alpha);
}

Subcommand add_generate_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "generate", "Draw sprites from a generator checkpoint into a PNG sprite sheet");
  struct Flags {
    std::string checkpoint, class_name, out, out_dir, palette,
        device = "auto", precision = "auto", alpha = "auto",
        spacing = diffusion::spacing_name(diffusion::SampleOptions().spacing),
        guidance_interval =
            diffusion::guidance_interval_text(diffusion::SampleOptions().guidance_interval);
    bool no_cuda_graphs = false, overwrite = false;
    int64_t count = 64, scale = 1, columns = 0;
    diffusion::SampleOptions sample;
    bool json = false;
    CpuThreadFlags cpu;
  };
  auto f = std::make_shared<Flags>();
  // A run's sprites are sampled together: 10^11 would fail allocating, not with a reason.
  constexpr double kMaxCount = 1e6;
  sub->add_option("--checkpoint", f->checkpoint,
                  "Generator checkpoint (train --task generate --save)")
      ->required();
  sub->add_option("--class", f->class_name, "Class to draw (default: all classes in turn)")
      ->check(CLI::Validator(
          [](std::string& text) {
            return text.empty() ? std::string(
                                      "an empty class name (expected one of the "
                                      "generator's classes; leave --class out for all)")
                                : std::string();
          },
          "CLASS", "CLASS"));
  sub->add_option("--count", f->count, "Sprites to draw (at most 1,000,000)")
      ->check(number_between(1, kMaxCount))
      ->capture_default_str();
  sub->add_option("--out", f->out, "Sprite sheet PNG (grid with 1-pixel transparent padding)")
      ->check(kPath);
  sub->add_option("--out-dir", f->out_dir, "Also write one PNG per sprite into this folder")
      ->check(kPath);
  sub->add_option("--scale", f->scale, "Nearest-neighbour upscale factor")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--columns", f->columns, "Sheet columns (0: square-ish)")->check(kNonNegative);
  sub->add_option("--palette", f->palette,
                  "Snap colours to a palette: auto (k-means of the training set) or a PNG whose "
                  "opaque colours are the palette [default: no snapping]")
      ->check(kPath);  // "" would read as no snapping
  sub->add_option("--colours", f->sample.colours,
                  "At most this many colours per sprite (k-means of its own pixels; 0: the "
                  "model's own colours)")
      ->check(kNonNegative)
      ->capture_default_str();
  add_alpha_option(sub, f->alpha, "");
  sub->add_option("--steps", f->sample.steps, "Sampler steps (ddim, dpm++2m)")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--spacing", f->spacing,
                  "Where the sampler's steps fall: uniform in t, or quadratic (more of them at "
                  "low noise, where edges and flat colours are decided)")
      ->check(CLI::IsMember({"uniform", "quadratic"}))
      ->capture_default_str();
  add_guidance_options(sub, f->sample, f->guidance_interval, "");
  sub->add_option(
         "--eta", f->sample.eta,
         "DDIM noise: 0 deterministic, 1 DDPM-like (the default: cleaner sprites, docs/sprites.md)")
      ->check(number_between(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--sampler", f->sample.sampler,
                  "ddim (--steps, --eta) | dpm++2m (deterministic, second "
                  "order: DDIM's quality in fewer --steps) | ddpm (all T steps)")
      ->check(CLI::IsMember({"ddim", "dpm++2m", "ddpm"}))
      ->capture_default_str();
  sub->add_option("--seed", f->sample.seed,
                  "Sampling seed: the same sprites for the same --count and --batch-size (with "
                  "--eta 0 or dpm++2m, for any of them)")
      ->check(kSeed)
      ->capture_default_str();
  sub->add_option("--batch-size", f->sample.batch, "Sprites per forward pass")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--device", f->device, "auto | cpu | cuda | cuda:N | mps")->capture_default_str();
  sub->add_option("--precision", f->precision, kSamplingPrecisionHelp)
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  sub->add_flag("--no-cuda-graphs", f->no_cuda_graphs,
                "CUDA: sample every batch eagerly (default: deterministic sampling, DDIM with "
                "--eta 0 or dpm++2m, replays the whole "
                "sampling loop as one CUDA graph from the second batch of --batch-size on)");
  sub->add_option("--channels-last", f->sample.channels_last,
                  "The UNet's activations channels_last (NHWC) while sampling (true|false): on "
                  "CUDA cuDNN's convolutions take them without transposing, and spritetorch's "
                  "GroupNorm + SiLU kernel runs NHWC where the build has it (devices); on the "
                  "CPU LibTorch's ops in either layout, within 10% of NCHW on a Zen 5 "
                  "(docs/sprites.md)")
      ->capture_default_str();
  sub->add_flag("--overwrite", f->overwrite,
                "Replace an existing --out sheet and existing --out-dir PNGs (default: refuse, "
                "before any sampling)");
  sub->add_flag("--json", f->json, "Print a JSON summary");
  add_cpu_thread_options(sub, f->cpu.threads, f->cpu.blas_threads);
  return {
      sub, [sub, f]() {
        if (f->out.empty() && f->out_dir.empty())
          throw Error("generate needs --out SHEET.png and/or --out-dir DIR");
        if (f->out.empty() && sub->count("--columns") > 0)
          throw Error("--columns lays out the --out sheet; this command writes no sheet",
                      "add --out SHEET.png, or drop --columns");
        f->sample.spacing = diffusion::parse_spacing(f->spacing);
        f->sample.guidance_interval = diffusion::parse_guidance_interval(f->guidance_interval);
        f->sample.alpha = alpha_option(f->alpha);
        check_sampler_options(*sub, f->sample);
        // Every output is checked, and the palette read, before any sampling: a typo must not
        // cost the minutes a large --count takes.
        if (!f->out.empty()) check_output_path(f->out, f->overwrite, "--out");
        const torch::Tensor palette_png = f->palette.empty() || f->palette == "auto"
                                              ? torch::Tensor()
                                              : diffusion::palette_from_png(f->palette);
        const torch::Device device = device::pick_device(f->device);
        auto generator = diffusion::load_generator(f->checkpoint, device);
        if (f->palette == "auto" && generator.palette.size(0) == 0)
          throw DataError(f->checkpoint, "the training set's palette for --palette auto",
                          "an empty 'palette' in its metadata",
                          "give --palette a PNG of the colours to snap to");
        const std::string threads = describe_cpu_threads(
            apply_cpu_threads(f->cpu.threads, f->cpu.blas_threads, cpu_work_of(*generator.net)));
        if (!f->out.empty())  // before the labels: a sheet too large fails with its own words
          io::check_sheet_size(f->count, generator.size, generator.size, {f->columns, 1, f->scale});
        const int64_t k = static_cast<int64_t>(generator.class_names.size());
        torch::Tensor labels = torch::arange(f->count, torch::kInt64).remainder(k);
        if (!f->class_name.empty()) {
          // Guidance 0 on every step never conditions: the class would only name the files.
          if (f->sample.guidance == 0 && f->sample.guidance_interval.whole())
            throw Error("--class " + f->class_name + ": --guidance 0 with --guidance-interval " +
                            diffusion::guidance_interval_text(f->sample.guidance_interval) +
                            " samples every step unconditionally, so the class has no effect",
                        "leave --class out, or guide by a scale above 0 or on part of the steps");
          const auto it =
              std::find(generator.class_names.begin(), generator.class_names.end(), f->class_name);
          if (it == generator.class_names.end()) {
            std::string known;
            for (const auto& n : generator.class_names) known += (known.empty() ? "" : ", ") + n;
            throw Error("unknown class '" + f->class_name + "'", "this generator knows: " + known);
          }
          labels = torch::full({f->count}, it - generator.class_names.begin(), torch::kInt64);
        }
        f->sample.cuda_graphs = !f->no_cuda_graphs;
        if (f->no_cuda_graphs && !device.is_cuda())  // accepted (scripts share flags), but said
          std::cerr << "note: --no-cuda-graphs has no effect on " << device::display_name(device)
                    << ": CUDA graphs replay sampling on CUDA devices only\n";
        // --out-dir: one PNG per sprite, named by class and index. Class names come from the user's
        // data (a sheet's --labels file, folder names): file_name_part keeps "../x" inside.
        const auto sprite_path = [&](int64_t i) {
          std::ostringstream path;
          path << f->out_dir << "/"
               << file_name_part(
                      generator.class_names[static_cast<size_t>(labels[i].item<int64_t>())])
               << "_" << std::setw(4) << std::setfill('0') << i << ".png";
          return path.str();
        };
        if (!f->out_dir.empty()) {
          std::error_code ec;
          if (std::filesystem::exists(f->out_dir, ec) &&
              !std::filesystem::is_directory(f->out_dir, ec))
            throw Error("--out-dir " + f->out_dir + " exists and is not a folder",
                        "give a folder, new or existing");
          // The sprite PNGs are written after the sheet: one of them would replace it.
          if (!f->out.empty())
            for (int64_t i = 0; i < f->count; ++i)
              if (same_file(sprite_path(i), f->out))
                throw Error("--out " + f->out + " is one of the --out-dir PNGs (" + sprite_path(i) +
                                "): the sprite would replace the sheet",
                            "name the sheet otherwise, or put it outside --out-dir");
          std::filesystem::create_directories(f->out_dir, ec);
          if (ec) throw Error("cannot create --out-dir " + f->out_dir + ": " + ec.message());
          for (int64_t i = 0; i < f->count; ++i)
            check_output_path(sprite_path(i), f->overwrite, "--out-dir");
        }

        f->sample.precision = diffusion::resolve_sampling_precision(f->precision, device);
        const bool graphed = diffusion::graph_sampling_applies(device, f->sample, f->count);
        // Fixed shapes: let cuDNN time its algorithms once (the first batch pays for it).
        if (device.is_cuda()) at::globalContext().setBenchmarkCuDNN(true);
        DeviceTimer timer(device);
        const auto alpha = f->sample.alpha.value_or(generator.alpha);
        // Each batch made uint8 sprites as it comes: a large --count keeps 1 KB a 16x16 sprite.
        auto sprites =
            diffusion::sample(generator, labels, f->sample, [&](const torch::Tensor& batch) {
              return diffusion::finish_sprites(batch, f->sample.colours, alpha);
            });
        const double seconds = timer.seconds();
        if (f->palette == "auto")
          sprites = diffusion::snap_to_palette(sprites, generator.palette);
        else if (palette_png.defined())
          sprites = diffusion::snap_to_palette(sprites, palette_png);
        if (!f->out.empty())
          io::write_png(f->out, io::make_sheet(sprites, {f->columns, 1, f->scale}),
                        if_exists(f->overwrite));
        if (!f->out_dir.empty())
          for (int64_t i = 0; i < sprites.size(0); ++i)
            io::write_png(sprite_path(i),
                          io::upscale_nearest(sprites[i].permute({1, 2, 0}), f->scale),
                          if_exists(f->overwrite));
        const double rate = static_cast<double>(f->count) / seconds;
        if (f->json) {
          auto out = nlohmann::json{{"count", f->count},
                                    {"seconds", seconds},
                                    {"sprites_per_second", rate},
                                    {"device", device::display_name(device)},
                                    {"threads", threads},
                                    {"precision", f->sample.precision},
                                    {"cuda_graphs", graphed},
                                    {"channels_last", f->sample.channels_last},
                                    {"out", f->out},
                                    {"alpha", diffusion::alpha_mode_name(alpha)}};
          out.update(diffusion::sampler_json(f->sample, generator.schedule.steps()));
          std::cout << json_text(out) << "\n";
        } else {
          std::cout << "Generated " << f->count << " sprites on " << device::display_name(device)
                    << " in " << std::fixed << std::setprecision(2) << seconds << " s ("
                    << std::setprecision(1) << rate << " sprites/s, "
                    << diffusion::describe_sampler(f->sample, generator.schedule.steps()) << ", "
                    << f->sample.precision << (f->precision == "auto" ? " (auto)" : "")
                    << (graphed ? ", CUDA graph" : "")
                    << (f->sample.channels_last ? ", channels_last" : "") << ", alpha "
                    << diffusion::alpha_mode_name(alpha) << (f->alpha == "auto" ? " (auto)" : "")
                    << "; CPU threads: " << threads << ")\n"
                    << std::defaultfloat;
          if (!f->out.empty()) std::cout << "Wrote " << f->out << "\n";
          if (!f->out_dir.empty())
            std::cout << "Wrote " << f->count << " PNGs to " << f->out_dir << "\n";
        }
        return 0;
      }};
}

}  // namespace spritetorch::cli
