// The spritetorch subcommands. Each registers its flags on the CLI11 app and returns the function
// that runs it; the functions fill library configs and print, nothing more.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>

#include "diffusion/generator.h"
#include "train/config.h"
#include "train/trainer.h"

namespace spritetorch::cli {

struct Subcommand {
  CLI::App* app;             // the parsed flags live in the closure of `run`
  std::function<int()> run;  // returns the process exit code
};

Subcommand add_devices_command(CLI::App& app);
Subcommand add_train_command(CLI::App& app);
Subcommand add_eval_command(CLI::App& app);
Subcommand add_bench_command(CLI::App& app);
Subcommand add_classify_command(CLI::App& app);
Subcommand add_generate_command(CLI::App& app);
// generate and eval: a sampler option the chosen --sampler does not take is an error, not ignored
// (--eta is DDIM's; DDPM takes all T steps, so no --steps or --spacing).
void check_sampler_options(const CLI::App& sub, const diffusion::SampleOptions& options);
// generate's and eval's --precision.
inline constexpr const char* kSamplingPrecisionHelp =
    "auto | fp32 | bf16: the UNet's passes in bf16 (on CUDA a bf16 copy of it, on the CPU "
    "autocast; the updates between passes stay fp32). auto: bf16 on an AMD CPU with native "
    "bf16 (twice as fast, the same quality), else fp32 (Intel's bf16 CPUs too: slower there; "
    "devices --json: bf16_auto)";
// generate and eval: --guidance W and --guidance-interval FROM:TO (text into `interval`, parsed by
// diffusion::parse_guidance_interval when the command runs). `prefix` starts each help text.
void add_guidance_options(CLI::App* sub, diffusion::SampleOptions& options, std::string& interval,
                          const std::string& prefix);
// generate and eval: --alpha auto|binary|soft (text into `alpha`); alpha_option turns it into
// SampleOptions::alpha (auto: unset, the generator's own).
void add_alpha_option(CLI::App* sub, std::string& alpha, const std::string& prefix);
std::optional<diffusion::AlphaMode> alpha_option(const std::string& alpha);
Subcommand add_data_command(CLI::App& app);

// --threads and --blas-threads, as every command that runs a model takes them (0: the split
// common/cpu_threads.h picks for the model); mirrored by SPRITETORCH_THREADS / _BLAS_THREADS.
struct CpuThreadFlags {
  int threads = 0;
  int blas_threads = 0;
};
void add_cpu_thread_options(CLI::App* sub, int& threads, int& blas_threads);

// Sprite pieces of train, import, data preview and classify (sprite_options.cpp), and the
// generator branch of eval (cmd_eval.cpp).
void add_sprite_data_options(CLI::App* sub, train::TrainConfig& config, bool training);
CLI::Validator sprite_dataset_validator();
CLI::Validator tile_validator();  // --tile WxH
class RunSession;                 // run_session.h
struct GeneratorEvalFlags {
  std::string classifier;
  int64_t count = 256;
  bool no_fidelity = false;
  diffusion::SampleOptions options;
  std::string spacing = diffusion::spacing_name(options.spacing);  // --spacing
  std::string guidance_interval =
      diffusion::guidance_interval_text(options.guidance_interval);  // --guidance-interval
  std::string alpha = "auto";                                        // --alpha
  // Every option add_generator_eval_options registered: eval refuses them for a classifier.
  std::vector<const CLI::Option*> registered;
};
std::shared_ptr<GeneratorEvalFlags> add_generator_eval_options(CLI::App* sub);
int run_generator_eval(const CLI::App& sub, const GeneratorEvalFlags& flags,
                       const std::string& checkpoint, const std::string& device,
                       const CpuThreadFlags& threads, int64_t batch_size, bool json,
                       const std::string& dataset, const std::string& labels);
Subcommand add_launch_command(CLI::App& app);
// Python interop (cmd_interop.cpp) and shell completion (cmd_completion.cpp).
Subcommand add_export_command(CLI::App& app);
Subcommand add_import_command(CLI::App& app);
Subcommand add_completion_command(CLI::App& app);
// The bash completion script for `app` and its subcommands, from their registered options.
std::string bash_completion_script(const CLI::App& app);
Subcommand add_runs_command(CLI::App& app);

}  // namespace spritetorch::cli
