// `spritetorch eval --checkpoint PATH`: loss, accuracy, per-class accuracy, confusion matrix.
#include <iostream>

#include "checks.h"
#include "commands.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "device/device.h"
#include "output.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::cli {

Subcommand add_eval_command(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "Evaluate a checkpoint on its dataset's test split");
  struct Flags {
    std::string checkpoint, device = "auto", data_dir = data::kDefaultFashionMnistDir;
    int64_t batch_size = 1000, limit = 0;
    bool json = false;
    CpuThreadFlags cpu;
  };
  auto f = std::make_shared<Flags>();
  sub->add_option("--checkpoint", f->checkpoint, "Checkpoint written by train --save")->required();
  sub->add_option("--device", f->device, "auto | cpu | cuda | cuda:N | mps")->capture_default_str();
  sub->add_option("--data", f->data_dir, "Folder with the Fashion-MNIST IDX files")
      ->capture_default_str();
  sub->add_option("--batch-size", f->batch_size, "Samples per forward pass")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--limit", f->limit, "Evaluate on the first N test samples only (0: all)")
      ->check(kNonNegative);
  sub->add_flag("--json", f->json, "Print the report as JSON");
  add_cpu_thread_options(sub, f->cpu.threads, f->cpu.blas_threads);
  auto generator_flags = add_generator_eval_options(sub);

  return {sub, [f, generator_flags]() {
            const torch::Device device = device::pick_device(f->device);
            const train::Checkpoint checkpoint = train::load_checkpoint(f->checkpoint);
            if (checkpoint.meta.value("task", std::string()) == "generate")
              return run_generator_eval(*generator_flags, f->checkpoint, f->device, f->cpu,
                                        f->json);
            train::TrainConfig config;
            config.dataset = checkpoint.meta.value("dataset", std::string("fashion-mnist"));
            config.data_dir = f->data_dir;
            config.seed = checkpoint.meta.value("seed", uint64_t{1});
            config.test_limit = f->limit;
            if (checkpoint.meta.contains("sprites"))
              config.sprites = data::sprite_options_from_json(checkpoint.meta["sprites"]);
            const data::Dataset test = train::load_datasets(config).test;
            auto model = train::model_from_checkpoint(checkpoint, f->checkpoint, device);
            const std::string threads = describe_cpu_threads(
                apply_cpu_threads(f->cpu.threads, f->cpu.blas_threads, cpu_work_of(*model)));
            data::ResidentLoader loader(test, device, {f->batch_size, false, false, config.seed});
            const auto report = train::evaluate(*model, loader, test.num_classes());
            if (f->json) {
              nlohmann::json out = eval_json(report, test.class_names);
              out["device"] = device::display_name(device);
              out["threads"] = threads;
              std::cout << out.dump() << "\n";
            } else {
              std::cout << "Using device: " << device::display_name(device) << "\n"
                        << "CPU threads: " << threads << "\n"
                        << "Checkpoint: " << f->checkpoint << " ("
                        << checkpoint.meta.value("model", std::string("?")) << ", epoch "
                        << checkpoint.meta.value("epoch", int64_t{0}) << ")\n";
              print_eval(std::cout, report, test.class_names);
            }
            return 0;
          }};
}

}  // namespace spritetorch::cli
