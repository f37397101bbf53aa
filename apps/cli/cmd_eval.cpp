// `spritetorch eval --checkpoint PATH`: loss, accuracy, per-class accuracy, confusion matrix; for a
// generator checkpoint, its samples judged by a classifier.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "checks.h"
#include "commands.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/json_field.h"
#include "common/json_text.h"
#include "config_file.h"
#include "device/device.h"
#include "diffusion/fidelity.h"
#include "diffusion/generator.h"
#include "output.h"
#include "train/checkpoint_dataset.h"
#include "train/classifier_task.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch::cli {

namespace {

void print_generator_eval(std::ostream& out, const diffusion::GeneratorEval& r,
                          const diffusion::Agreement& real, int64_t held_out,
                          const std::vector<std::string>& class_names) {
  out << std::fixed << std::setprecision(4) << "Samples: " << r.samples << "\n"
      << "Class agreement (generated, and the classifier on " << held_out
      << " held-out real sprites):\n"
      << "  " << std::left << std::setw(12) << "all"
      << "  " << r.agreement.mean << "  ";
  // No held-out sprites (--holdout 0), or none of a class: no reference to give.
  if (held_out > 0)
    out << real.mean << "\n";
  else
    out << "-\n";
  for (size_t k = 0; k < class_names.size() && k < r.agreement.per_class.size(); ++k) {
    out << "  " << std::left << std::setw(12) << class_names[k] << "  " << r.agreement.per_class[k]
        << "  ";
    if (k < real.per_class.size() && !std::isnan(real.per_class[k]))
      out << real.per_class[k] << "\n";
    else
      out << "-\n";
  }
  out << "Distinct: " << r.distinct << "\nExact copies of training sprites: " << r.exact_copies
      << "\n"
      << std::setprecision(2) << "Sampling: " << r.sample_seconds << " s, " << std::setprecision(1)
      << r.sprites_per_second << " sprites/s\n"
      << std::defaultfloat;
}

void print_fidelity(std::ostream& out, const diffusion::FidelityReport& f) {
  const auto row = [&](const char* what, double generated, double real) {
    out << "  " << std::left << std::setw(26) << what << std::right << std::setw(10) << generated
        << std::setw(10) << real << "\n";
  };
  const char* weighting =
      f.class_weighted ? "; real sprites weighted to the generated classes' mix" : "";
  out << std::fixed << std::setprecision(4) << "Two-sample test (a CNN telling real from other, "
      << f.per_set << " + " << f.per_set << " sprites, accuracy on held-out halves; 0.5 = "
      << "indistinguishable" << weighting << "):\n"
      << "  real vs generated  " << f.c2st << "\n"
      << "  real vs real       " << f.c2st_real << "\n";
  if (f.per_set < f.max_per_set)
    out << "  (the real set allows " << f.max_per_set << " a set: --count " << f.max_per_set
        << " gives the critics more to learn from, and a sharper test)\n";
  if (f.judged) {
    out << std::left << std::setw(28) << "In the classifier's features" << std::right
        << std::setw(10) << "generated" << std::setw(10) << "real"
        << "   (" << f.feature_dims << " dims; real: other real sprites)\n"
        << std::setprecision(2);
    row("Frechet distance", f.frechet, f.frechet_real);
    out << std::setprecision(4);
    row("precision (among real)", f.coverage.precision, f.coverage_real.precision);
    row("recall (real covered)", f.coverage.recall, f.coverage_real.recall);
  }
  out << std::left << std::setw(28) << "Pixel-art statistics" << std::right << std::setw(10)
      << "generated" << std::setw(10) << "real"
      << "\n"
      << std::setprecision(2);
  row("stray opaque pixels/sprite", f.generated.stray_pixels, f.real.stray_pixels);
  row("colours/sprite (4 bit)", f.generated.colours, f.real.colours);
  out << std::setprecision(4);
  row("alpha coverage", f.generated.alpha_coverage, f.real.alpha_coverage);
  out << std::setprecision(1) << "Fidelity: " << f.seconds << " s\n" << std::defaultfloat;
}

nlohmann::json stats_json(const diffusion::PixelArtStats& s) {
  return {{"sprites", s.sprites},
          {"stray_pixels", s.stray_pixels},
          {"colours", s.colours},
          {"alpha_coverage", s.alpha_coverage}};
}

}  // namespace

std::shared_ptr<GeneratorEvalFlags> add_generator_eval_options(CLI::App* sub) {
  auto f = std::make_shared<GeneratorEvalFlags>();
  const std::vector<CLI::Option*> before = sub->get_options();
  sub->add_option("--classifier", f->classifier,
                  "Generator checkpoints: a classifier checkpoint trained on the real data, to "
                  "judge the samples (class agreement; Frechet distance, precision and recall in "
                  "its features)")
      ->check(kExistingFile);
  sub->add_option("--count", f->count,
                  "Generator checkpoints: samples to draw (spread over the classes)")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--colours", f->options.colours,
                  "Generator checkpoints: at most this many colours per sprite, as generate draws "
                  "them (0: the model's own colours)")
      ->check(kNonNegative)
      ->capture_default_str();
  add_alpha_option(sub, f->alpha, "Generator checkpoints: ");
  sub->add_option("--steps", f->options.steps,
                  "Generator checkpoints: sampler steps (ddim, dpm++2m)")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--spacing", f->spacing,
                  "Generator checkpoints: where the sampler's steps fall: uniform in t, or "
                  "quadratic (more of them at low noise)")
      ->check(CLI::IsMember({"uniform", "quadratic"}))
      ->capture_default_str();
  add_guidance_options(sub, f->options, f->guidance_interval, "Generator checkpoints: ");
  sub->add_option("--eta", f->options.eta,
                  "Generator checkpoints: DDIM noise (0 deterministic, 1 DDPM-like)")
      ->check(number_between(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--sampler", f->options.sampler, "Generator checkpoints: ddim | dpm++2m | ddpm")
      ->check(CLI::IsMember({"ddim", "dpm++2m", "ddpm"}))
      ->capture_default_str();
  sub->add_option("--seed", f->options.seed,
                  "Generator checkpoints: sampling seed (and the two-sample test's)")
      ->check(kSeed)
      ->capture_default_str();
  sub->add_flag(
      "--no-fidelity", f->no_fidelity,
      "Generator checkpoints: skip the fidelity report (two-sample test, distances in the "
      "classifier's features, pixel-art statistics)");
  f->options.precision = "auto";
  sub->add_option("--precision", f->options.precision,
                  std::string("Generator checkpoints: ") + kSamplingPrecisionHelp)
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  for (const CLI::Option* option : sub->get_options())
    if (std::find(before.begin(), before.end(), option) == before.end())
      f->registered.push_back(option);
  return f;
}

// Options that mean something for one kind of checkpoint only (`other_task`: those of the kind
// `checkpoint` is not): given on the command line they are refused (exit 2) rather than dropped
// without a word; set by their environment variable (settings for every command) they are not.
static void refuse_options_of_other_task(const std::vector<const CLI::Option*>& other_task,
                                         const std::string& checkpoint, bool generator) {
  for (const CLI::Option* option : other_task)
    if (option->count() > 0 && !set_by_environment(option)) {
      const std::string name = "--" + option->get_lnames().front();
      throw Error(name + " applies to " + (generator ? "classifier" : "generator") +
                      " checkpoints; " + checkpoint + " is a " +
                      (generator ? "generator" : "classifier"),
                  generator ? "a generator is evaluated on the sprites it draws: --count, "
                              "--classifier, the sampler's options"
                            : "leave it out, or evaluate a checkpoint of train --task generate");
    }
}

// The data a checkpoint is evaluated on: what it recorded, or `dataset` (--dataset), the same kind
// of data from another place (a folder: path is relative to where the run was started). A recorded
// path that is not there is named as the checkpoint's, with the way to point elsewhere.
static train::TrainConfig eval_data_source(const nlohmann::json& meta,
                                           const std::string& checkpoint,
                                           const std::string& dataset) {
  train::TrainConfig config = train::checkpoint_data_config(meta, checkpoint);
  const auto kind = [](const std::string& spec) { return spec.substr(0, spec.find(':')); };
  if (config.dataset == train::kInMemoryDataset) {
    if (dataset.empty())
      throw Error(checkpoint +
                      " was trained on data a program gave Trainer::fit in memory (its "
                      "metadata's dataset: " +
                      config.dataset + "): there is none to load",
                  "pass --dataset with that data (fashion-mnist, folder:PATH, sheet:FILE or "
                  "npy:FILE[,LABELS.npy])");
    config.dataset = dataset;
    return config;
  }
  if (!dataset.empty()) {
    if (config.dataset.find(':') == std::string::npos)
      throw Error("--dataset " + dataset + ": " + checkpoint + " was trained on " + config.dataset +
                      ", which has no path to change",
                  config.dataset == "fashion-mnist" ? "--data DIR is the Fashion-MNIST folder"
                                                    : "leave --dataset out");
    if (kind(dataset) != kind(config.dataset))
      throw Error("--dataset " + dataset + ": " + checkpoint + " was trained on " + config.dataset +
                      "; --dataset names where the same kind of data is now",
                  "give --dataset " + kind(config.dataset) + ":PATH, or leave it out");
    config.dataset = dataset;
    return config;
  }
  const auto colon = config.dataset.find(':');
  if (colon != std::string::npos) {
    const std::string path = config.dataset.substr(colon + 1, config.dataset.find(',') - colon - 1);
    std::error_code ec;
    if (!path.empty() && !std::filesystem::exists(path, ec))
      throw Error(checkpoint + " was trained on --dataset " + config.dataset + ", and " + path +
                      " is not there" +
                      (std::filesystem::path(path).is_relative()
                           ? " (relative to the current folder " +
                                 std::filesystem::current_path(ec).string() + ")"
                           : std::string()),
                  "run from the folder the model was trained in, or pass --dataset " +
                      kind(config.dataset) + ":PATH to read the same data from elsewhere");
  }
  return config;
}

// eval_data_source, and a sheet's label map: `labels` (--labels) where given, else the one the
// checkpoint recorded, which the sheet needs to have the classes it was trained on: one that is
// not there is named as the checkpoint's, as a recorded dataset path is.
static train::TrainConfig eval_data_config(const nlohmann::json& meta,
                                           const std::string& checkpoint,
                                           const std::string& dataset, const std::string& labels) {
  train::TrainConfig config = eval_data_source(meta, checkpoint, dataset);
  // Messages name what the checkpoint recorded, not where --dataset points now.
  const std::string trained_on = train::checkpoint_data_config(meta, checkpoint).dataset;
  const bool sheet = config.dataset.rfind("sheet:", 0) == 0;
  if (!labels.empty()) {
    if (!sheet)
      throw Error(
          "--labels applies to sheet: datasets; " + checkpoint + " was trained on " + trained_on,
          "leave --labels out");
    config.sprites.label_map = labels;
    return config;
  }
  const std::string& recorded = config.sprites.label_map;
  std::error_code ec;
  if (sheet && !recorded.empty() && !std::filesystem::exists(recorded, ec))
    throw Error(checkpoint + " was trained on --dataset " + trained_on + " with --labels " +
                    recorded + ", and that recorded labels file is not there" +
                    (std::filesystem::path(recorded).is_relative()
                         ? " (relative to the current folder " +
                               std::filesystem::current_path(ec).string() + ")"
                         : std::string()),
                "run from the folder the model was trained in, or pass --labels FILE to read "
                "the same label map from elsewhere");
  return config;
}

// `--data` reads Fashion-MNIST only: given for a checkpoint of other data it would do nothing.
static void refuse_data_flag(const CLI::App& sub, const train::TrainConfig& config,
                             const std::string& checkpoint) {
  const CLI::Option* data = sub.get_option("--data");
  if (data->count() > 0 && !set_by_environment(data) && config.dataset != "fashion-mnist")
    throw Error(
        "--data is the Fashion-MNIST folder; " + checkpoint + " was trained on " + config.dataset,
        config.dataset.find(':') == std::string::npos
            ? "leave --data out"
            : "leave --data out; --dataset " + config.dataset.substr(0, config.dataset.find(':')) +
                  ":PATH reads the checkpoint's data from elsewhere");
}

int run_generator_eval(const CLI::App& sub, const GeneratorEvalFlags& flags,
                       const std::string& checkpoint, const std::string& device_text,
                       const CpuThreadFlags& cpu, int64_t batch_size, bool json,
                       const std::string& dataset, const std::string& labels) {
  GeneratorEvalFlags f = flags;
  f.options.spacing = diffusion::parse_spacing(f.spacing);
  f.options.guidance_interval = diffusion::parse_guidance_interval(f.guidance_interval);
  f.options.alpha = alpha_option(f.alpha);
  check_sampler_options(sub, f.options);
  if (sub.count("--batch-size") > 0) f.options.batch = batch_size;
  if (f.classifier.empty())
    throw Error(
        "evaluating a generator needs --classifier C.pt",
        "train one on the same data: spritetorch train --task classify --dataset ... --save C.pt");
  const torch::Device device = device::pick_device(device_text);
  const bool auto_precision = f.options.precision == "auto";
  f.options.precision = diffusion::resolve_sampling_precision(f.options.precision, device);
  auto generator = diffusion::load_generator(checkpoint, device);
  // Agreement per class and the two-sample test's class mix need a sprite of every class.
  const auto classes = static_cast<int64_t>(generator.class_names.size());
  if (f.count < classes)
    throw Error("--count " + std::to_string(f.count) + ": " + checkpoint + " draws " +
                    std::to_string(classes) +
                    " classes, and eval judges at least one sprite of each",
                "pass --count " + std::to_string(classes) + " or more (the default is 256)");
  const diffusion::AlphaMode alpha = f.options.alpha.value_or(generator.alpha);
  const std::string threads = describe_cpu_threads(
      apply_cpu_threads(cpu.threads, cpu.blas_threads, cpu_work_of(*generator.net)));
  const auto classifier_ckpt = train::load_checkpoint(f.classifier);
  // Built first: it says so when --classifier names a generator or a damaged file.
  auto classifier = train::model_from_checkpoint(classifier_ckpt, f.classifier, device);
  const auto names = json_field(classifier_ckpt.meta, "class_names", std::vector<std::string>(),
                                f.classifier, "class_names");
  if (names != generator.class_names)
    throw Error(
        "--classifier " + f.classifier + " knows other classes than the generator " + checkpoint,
        "train the classifier on the generator's dataset");
  // The classifier judges the generator's sprites as they are drawn: (4, size, size) RGBA.
  const auto shape = json_field(classifier_ckpt.meta, "input_shape", std::vector<int64_t>(),
                                f.classifier, "input_shape");
  const std::vector<int64_t> sprites{4, generator.size, generator.size};
  if (shape != sprites)
    throw Error("--classifier " + f.classifier + " takes inputs of shape " +
                    c10::str(c10::IntArrayRef(shape)) + "; the generator " + checkpoint +
                    " draws sprites of " + c10::str(c10::IntArrayRef(sprites)),
                "train the classifier on the generator's dataset with --size " +
                    std::to_string(generator.size));
  const auto data =
      train::load_datasets(eval_data_config(generator.meta, checkpoint, dataset, labels));
  const auto r =
      diffusion::evaluate_generator(generator, *classifier, data.train.inputs, f.count, f.options);
  // The same classifier on the held-out real sprites: the class agreement it can give at most.
  const auto real = diffusion::classifier_agreement(*classifier, data.test.inputs, data.test.labels,
                                                    data.test.num_classes());
  std::optional<diffusion::FidelityReport> fidelity_report;
  if (!f.no_fidelity) {
    // Every real sprite, held-out ones included: the two-sample test wants 2 x count of them.
    diffusion::TwoSampleOptions o;
    o.seed = f.options.seed;
    o.device = device;
    o.alpha = alpha;
    fidelity_report = diffusion::fidelity(
        r.sprites, torch::cat({data.train.inputs, data.test.inputs}), o, classifier.get(),
        {r.labels, torch::cat({data.train.labels, data.test.labels})});
  }
  if (json) {
    nlohmann::json out{{"samples", r.samples},
                       {"class_agreement", r.agreement.mean},
                       {"per_class_agreement", r.agreement.per_class},
                       {"real_class_agreement",
                        data.test.size() > 0 ? nlohmann::json(real.mean) : nlohmann::json()},
                       {"real_per_class_agreement", real.per_class},
                       {"real_held_out", data.test.size()},
                       {"distinct", r.distinct},
                       {"exact_copies", r.exact_copies},
                       {"sample_s", r.sample_seconds},
                       {"sprites_per_second", r.sprites_per_second},
                       {"colours", f.options.colours},
                       {"precision", f.options.precision},
                       {"alpha", diffusion::alpha_mode_name(alpha)},
                       {"device", device::display_name(device)},
                       {"threads", threads}};
    out.update(diffusion::sampler_json(f.options, generator.schedule.steps()));
    if (fidelity_report) {
      const auto& fr = *fidelity_report;
      out["fidelity"] = {{"per_set", fr.per_set},
                         {"max_per_set", fr.max_per_set},
                         {"class_weighted", fr.class_weighted},
                         {"c2st", fr.c2st},
                         {"c2st_real", fr.c2st_real},
                         {"generated", stats_json(fr.generated)},
                         {"real", stats_json(fr.real)},
                         {"seconds", fr.seconds}};
      if (fr.judged)
        out["fidelity"]["judge_features"] = {{"dims", fr.feature_dims},
                                             {"frechet", fr.frechet},
                                             {"frechet_real", fr.frechet_real},
                                             {"precision", fr.coverage.precision},
                                             {"precision_real", fr.coverage_real.precision},
                                             {"recall", fr.coverage.recall},
                                             {"recall_real", fr.coverage_real.recall}};
    }
    std::cout << json_text(out) << "\n";
  } else {
    std::cout << "Using device: " << device::display_name(device) << "\nCPU threads: " << threads
              << "\nGenerator: " << checkpoint << " ("
              << diffusion::describe_sampler(f.options, generator.schedule.steps()) << ", "
              << f.options.precision << (auto_precision ? " (auto)" : "") << ", alpha "
              << diffusion::alpha_mode_name(alpha) << (f.alpha == "auto" ? " (auto)" : "")
              << ")\nJudged by: " << f.classifier << "\n";
    print_generator_eval(std::cout, r, real, data.test.size(), generator.class_names);
    if (fidelity_report) print_fidelity(std::cout, *fidelity_report);
  }
  return 0;
}

Subcommand add_eval_command(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "Evaluate a checkpoint on its dataset's test split");
  struct Flags {
    std::string checkpoint, device = "auto", data_dir = data::kDefaultFashionMnistDir, dataset;
    std::string labels;                 // a sheet's label map from another place
    int64_t batch_size = 0, limit = 0;  // batch 0: train::evaluation_batch
    bool json = false;
    CpuThreadFlags cpu;
  };
  auto f = std::make_shared<Flags>();
  sub->add_option("--checkpoint", f->checkpoint, "Checkpoint written by train --save")->required();
  sub->add_option("--device", f->device, "auto | cpu | cuda | cuda:N | mps")->capture_default_str();
  const std::vector<const CLI::Option*> classifier_only = {
      sub->add_option("--data", f->data_dir, "Folder with the Fashion-MNIST IDX files")
          ->capture_default_str(),
      sub->add_option(
             "--limit", f->limit,
             "Evaluate on N test samples only (0: all): the first N; of a sprite dataset, N of its "
             "held-out split stratified by class: one of every class (N below the classes: N "
             "classes at even steps), the rest in proportion to the class sizes")
          ->check(kNonNegative)};
  sub->add_option("--dataset", f->dataset,
                  "The checkpoint's data from another place: folder:PATH, sheet:FILE or "
                  "npy:FILE[,LABELS] of the kind it was trained on (default: the path it "
                  "recorded)")
      ->check(sprite_dataset_validator());
  sub->add_option("--labels", f->labels,
                  "sheet: the checkpoint's label map ('TILE_INDEX CLASS' lines) from another "
                  "place (default: the path it recorded)")
      ->check(kExistingFile);
  sub->add_option("--batch-size", f->batch_size,
                  "Samples per forward pass (default: 256 for a conv net on a CPU, else 1000)")
      ->check(kPositive);
  sub->add_flag("--json", f->json, "Print the report as JSON");
  add_cpu_thread_options(sub, f->cpu.threads, f->cpu.blas_threads);
  auto generator_flags = add_generator_eval_options(sub);

  return {
      sub, [sub, f, generator_flags, classifier_only]() {
        const torch::Device device = device::pick_device(f->device);
        const train::Checkpoint checkpoint = train::load_checkpoint(f->checkpoint);
        const bool generator =
            json_field(checkpoint.meta, "task", std::string(), f->checkpoint, "task") == "generate";
        refuse_options_of_other_task(generator ? classifier_only : generator_flags->registered,
                                     f->checkpoint, generator);
        if (generator)
          return run_generator_eval(*sub, *generator_flags, f->checkpoint, f->device, f->cpu,
                                    f->batch_size, f->json, f->dataset, f->labels);
        train::TrainConfig config =
            eval_data_config(checkpoint.meta, f->checkpoint, f->dataset, f->labels);
        refuse_data_flag(*sub, config, f->checkpoint);
        config.data_dir = f->data_dir;
        config.test_limit = f->limit;
        // The test split alone: Fashion-MNIST's training files are neither needed nor read.
        const data::Dataset test = train::load_test_dataset(config);
        auto model = train::model_from_checkpoint(checkpoint, f->checkpoint, device);
        // The weights' input and classes against the data the metadata names: a checkpoint
        // whose two disagree would fail inside the first layer with LibTorch's words.
        const auto sample = test.inputs.sizes().vec();
        const std::vector<int64_t> data_shape(sample.begin() + 1, sample.end());
        if (data_shape != model->spec().input_shape || test.num_classes() != model->spec().classes)
          throw DataError(
              f->checkpoint,
              "weights for the data " +
                  std::string(f->dataset.empty() ? "its metadata names" : "--dataset names") +
                  " (" + test.name + ": input " + c10::str(c10::IntArrayRef(data_shape)) + ", " +
                  std::to_string(test.num_classes()) + " classes)",
              "weights for input " + c10::str(c10::IntArrayRef(model->spec().input_shape)) + ", " +
                  std::to_string(model->spec().classes) + " classes");
        // And its classes by name: a folder of the same shape whose classes are other ones would
        // be scored under the checkpoint's labels without a word.
        const auto trained_on =
            json_field(checkpoint.meta, "class_names", std::vector<std::string>(), f->checkpoint,
                       "class_names");
        if (!trained_on.empty() && trained_on != test.class_names) {
          auto listed = [](const std::vector<std::string>& names) {
            std::string out;
            for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
            return out + (names.size() > 8 ? ", ..." : "");
          };
          throw DataError(
              test.name,
              "the classes " + f->checkpoint + " was trained on (" + listed(trained_on) + ")",
              "classes " + listed(test.class_names));
        }
        const std::string threads = describe_cpu_threads(
            apply_cpu_threads(f->cpu.threads, f->cpu.blas_threads, cpu_work_of(*model)));
        const int64_t batch = f->batch_size > 0
                                  ? f->batch_size
                                  : train::evaluation_batch(device, cpu_work_of(*model));
        data::ResidentLoader loader(test, device, {batch, false, false, config.seed});
        // As its training run evaluated it (test-time flips when it recorded them).
        const auto report =
            train::evaluate(train::checkpoint_forward(checkpoint.meta, model, f->checkpoint),
                            *model, loader, test.num_classes());
        // Finite weights whose outputs overflow (a run that was diverging): a loss of NaN and an
        // accuracy of one class would read as a result.
        if (!std::isfinite(report.loss))
          throw DataError(f->checkpoint, "a model whose outputs are finite",
                          "outputs that are not (the test set's loss is NaN or infinite)",
                          "the run that wrote it was diverging: take an earlier checkpoint of it");
        if (f->json) {
          nlohmann::json out = eval_json(report, test.class_names);
          out["device"] = device::display_name(device);
          out["threads"] = threads;
          std::cout << json_text(out) << "\n";
        } else {
          std::cout << "Using device: " << device::display_name(device) << "\n"
                    << "CPU threads: " << threads << "\n"
                    << "Checkpoint: " << f->checkpoint << " ("
                    << checkpoint.meta.value("model", std::string("?")) << ", epoch "
                    << json_field(checkpoint.meta, "epoch", int64_t{0}, f->checkpoint, "epoch")
                    << ")\n";
          print_eval(std::cout, report, test.class_names);
        }
        return 0;
      }};
}

}  // namespace spritetorch::cli
