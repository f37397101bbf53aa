// `spritetorch export` and `spritetorch import`: classifier weights to and from Python PyTorch
// (docs/interop.md). Export writes safetensors or a torch.save-style dict under Python's names;
// import turns a Python state dict saved as safetensors into a spritetorch checkpoint.
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>

#include "checks.h"
#include "commands.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/output_file.h"
#include "config_file.h"
#include "interop/import_meta.h"
#include "interop/python_state.h"
#include "interop/torch_file.h"
#include "models/classifier.h"
#include "models/script_model.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::cli {

namespace {

std::string format_from_extension(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".safetensors") return "safetensors";
  if (ext == ".pt" || ext == ".pth" || ext == ".bin") return "torch";
  throw Error("cannot tell the format of '" + path + "' from its extension",
              "pass --format safetensors|torch, or name it *.safetensors / *.pt");
}

int64_t parameter_count(const interop::TensorFile& file) {
  int64_t n = 0;
  for (const auto& [name, t] : file.tensors) n += t.numel();
  return n;
}

}  // namespace

Subcommand add_export_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "export",
      "Write a classifier checkpoint's weights for Python PyTorch (load_state_dict) as "
      "safetensors or a torch.load-able dict (a module of your own program's: as it named them)");
  struct Flags {
    std::string checkpoint, format = "auto", out, reference;
    int64_t reference_count = 16;
    bool overwrite = false;
  };
  auto f = std::make_shared<Flags>();
  sub->add_option("--checkpoint", f->checkpoint, "Checkpoint written by train --save or import")
      ->required()
      ->check(kExistingFile);
  sub->add_option("--format", f->format,
                  "safetensors | torch (torch.save's zip dict) | torchscript (a model trained "
                  "with --model script:FILE, its weights now trained: torch.jit.load) | auto: "
                  "from OUT's extension (.safetensors; .pt .pth .bin)")
      ->check(CLI::IsMember({"auto", "safetensors", "torch", "torchscript"}))
      ->capture_default_str();
  sub->add_option("out", f->out, "Output file")->required();
  auto* reference =
      sub->add_option("--reference", f->reference,
                      "Also write this safetensors file: 'inputs' (deterministic "
                      "samples; uint8 images, to be fed as inputs.float() / 255) and the 'logits' "
                      "spritetorch computes for them, to check the Python side against")
          ->check(kPath);
  sub->add_option("--reference-count", f->reference_count, "Samples in --reference")
      ->check(CLI::Range(1, 4096))
      ->needs(reference)
      ->capture_default_str();
  sub->add_flag("--overwrite", f->overwrite, "Replace OUT (and --reference) if they exist");
  return {sub, [f]() {
            // Each is written in turn: one file for two of them would keep only the last. (An
            // output that is the --checkpoint is refused before: check_outputs_are_not_inputs.)
            if (!f->reference.empty() && same_file(f->reference, f->out))
              throw Error("--reference " + f->reference + " and OUT " + f->out +
                              " are the same file: the reference would replace the weights",
                          "give the reference file another name");
            check_output_path(f->out, f->overwrite, "OUT");
            if (!f->reference.empty()) check_output_path(f->reference, f->overwrite, "--reference");
            const std::string format =
                f->format == "auto" ? format_from_extension(f->out) : f->format;
            const auto checkpoint = train::load_checkpoint(f->checkpoint);
            const std::string own = train::own_module_description(checkpoint, f->checkpoint);
            if (!own.empty() && !f->reference.empty())
              throw Error("--reference needs spritetorch to run the model, and " + f->checkpoint +
                              " holds " + own + ", a module of the program that trained it",
                          "leave --reference out; that program can compute logits to check the "
                          "Python side against");
            // Computed before OUT is written: a model that fails on the reference batch leaves
            // no OUT behind (a second try would then refuse to overwrite it).
            std::optional<interop::TensorFile> reference_file;
            auto compute_reference = [&] {
              if (!f->reference.empty())
                reference_file =
                    interop::reference_outputs(checkpoint, f->checkpoint, f->reference_count);
            };
            auto write_reference = [&] {
              if (!reference_file) return;
              try {
                interop::write_safetensors(f->reference, *reference_file, if_exists(f->overwrite));
              } catch (...) {
                std::error_code ignored;
                std::filesystem::remove(f->out, ignored);  // one without the other is half a result
                throw;
              }
              std::cout << "Wrote " << f->reference << ": " << f->reference_count
                        << " reference inputs and logits\n";
            };
            if (format == "torchscript") {
              const std::string model = checkpoint.meta.value("model", std::string());
              if (model != "script")
                throw Error(
                    "--format torchscript writes a model trained from a TorchScript file "
                    "(--model script:FILE); " +
                        f->checkpoint + " holds " + (own.empty() ? "model '" + model + "'" : own),
                    "use --format safetensors or torch: load_state_dict takes them");
              auto trained = std::dynamic_pointer_cast<models::ScriptClassifierImpl>(
                  train::model_from_checkpoint(checkpoint, f->checkpoint, torch::kCPU));
              compute_reference();
              write_file_atomically(f->out, trained->archive(), if_exists(f->overwrite));
              int64_t values = 0;
              for (const auto& p : trained->parameters()) values += p.numel();
              std::cout << "Wrote " << f->out << " (torchscript): the model of "
                        << checkpoint.meta.value("script_file", std::string("its checkpoint"))
                        << " with its trained weights, " << values << " parameters\n"
                        << "Python: model = torch.jit.load(\"" << f->out << "\")\n";
              write_reference();
              return 0;
            }
            const auto state = interop::python_state_dict(checkpoint, f->checkpoint);
            compute_reference();
            if (format == "safetensors") {
              interop::write_safetensors(f->out, state, if_exists(f->overwrite));
            } else {
              interop::write_torch_state_dict(f->out, state, if_exists(f->overwrite));
            }
            std::cout << "Wrote " << f->out << " (" << format << "): "
                      << (own.empty() ? "model " + checkpoint.meta.value("model", std::string("?"))
                                      : own)
                      << ", " << state.tensors.size() << " tensors, " << parameter_count(state)
                      << " values\n";
            for (const auto& [name, t] : state.tensors)
              std::cout << "  " << name << "  " << t.sizes() << "\n";
            write_reference();
            if (checkpoint.meta.value("model", std::string()) == "script")
              std::cout << "Python: model.load_state_dict(state_dict), the model being the "
                           "module that was saved as TorchScript (or torch.jit.load of it); "
                           "--format torchscript writes the whole trained module\n";
            else if (own.empty())
              std::cout << "Python: model.load_state_dict(state_dict); the model classes are in "
                           "docs/interop.md\n";
            else
              std::cout << "Python: model.load_state_dict(state_dict), the model being the same "
                           "module written in Python (the names are the ones its C++ "
                           "register_module calls gave)\n";
            return 0;
          }};
}

Subcommand add_import_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "import", "Turn a Python state dict saved as safetensors into a spritetorch checkpoint");
  auto config = std::make_shared<train::TrainConfig>();
  struct Flags {
    std::string in, out;
    bool overwrite = false;
  };
  auto f = std::make_shared<Flags>();
  config->model.clear();
  sub->add_option("in", f->in, "safetensors file with the state dict (Python names, float32)")
      ->required()
      ->check(kExistingFile);
  sub->add_option("out", f->out, "Checkpoint to write")->required();
  sub->add_option("--model", config->model,
                  "ann | cnn | fastcnn | fastcnn-2x | fastcnn-wide | simplenn: the Python "
                  "class of docs/interop.md "
                  "[default: the file's spritetorch metadata, else ann; cnn for sprite datasets]")
      ->check(CLI::IsMember(models::model_names()));
  sub->add_option("--dataset", config->dataset,
                  "The dataset the weights are for (input shape, classes, "
                  "what eval uses) [default: the file's spritetorch metadata, else fashion-mnist]")
      ->check(sprite_dataset_validator());
  sub->add_option("--data", config->data_dir, "Folder with the Fashion-MNIST IDX files")
      ->capture_default_str();
  sub->add_option("--seed", config->seed,
                  "Seed recorded in the checkpoint (the dummy dataset depends on it)")
      ->check(kSeed)
      ->capture_default_str();
  add_sprite_data_options(sub, *config, /*training=*/false);
  sub->add_flag("--overwrite", f->overwrite, "Replace OUT if it exists");
  return {sub, [sub, f, config]() {
            check_output_path(f->out, f->overwrite, "OUT");
            const interop::TensorFile state = interop::read_safetensors(f->in);
            std::set<std::string> given;
            for (const auto* option : sub->get_options())
              if (option->count() > 0 && !set_by_environment(option))
                given.insert(option->get_name());
            const auto imported = interop::import_meta(state, f->in, *config, given);
            // --data reads Fashion-MNIST only (its variable, a machine's setting, may stay set).
            const CLI::Option* data = sub->get_option("--data");
            if (data->count() > 0 && !set_by_environment(data) &&
                imported.config.dataset != "fashion-mnist")
              throw Error("--data is the Fashion-MNIST folder; these weights are for " +
                              imported.config.dataset,
                          "leave --data out");
            const auto& spec = imported.spec;
            const auto checkpoint =
                interop::checkpoint_from_python(state, spec, imported.meta, f->in);
            train::save_checkpoint(f->out, checkpoint, if_exists(f->overwrite));
            std::cout << "Wrote " << f->out << ": model " << spec.name << " for "
                      << imported.config.dataset << " (" << spec.classes << " classes), "
                      << checkpoint.model.size() << " tensors from " << f->in
                      << "\nEvaluate it: spritetorch eval --checkpoint " << f->out << "\n";
            return 0;
          }};
}

}  // namespace spritetorch::cli
