// `spritetorch train`: by default the seeds' Fashion-MNIST example, then a test-set evaluation.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <optional>

#include "checks.h"
#include "commands.h"
#include "common/error.h"
#include "common/json_text.h"
#include "common/timer.h"
#include "config/toml_file.h"
#include "config_file.h"
#include "data/augment.h"
#include "data/sprite_sources.h"
#include "data/streaming_loader.h"
#include "device/device.h"
#include "diffusion/generator_task.h"
#include "models/classifier.h"
#include "output.h"
#include "precision/precision.h"
#include "run_session.h"
#include "tasks/make_task.h"
#include "tensorboard_output.h"
#include "train/checkpoint.h"
#include "train/flat_optimizer.h"
#include "train/lr_schedule.h"
#include "train/parallel.h"
#include "train/recipe.h"
#include "train/task.h"
#include "train/trainer.h"

namespace spritetorch::cli {

void add_cpu_thread_options(CLI::App* sub, int& threads, int& blas_threads) {
  sub->add_option("--threads", threads,
                  "LibTorch intra-op CPU threads (0: default: one per core for conv nets, 1 for "
                  "MLPs)")
      ->check(kThreadCount)
      ->capture_default_str();
  sub->add_option("--blas-threads", blas_threads,
                  "OpenBLAS threads (0: default: 1 for conv nets, one per core for MLPs)")
      ->check(kThreadCount)
      ->capture_default_str();
}

// `train --json`: the same keys for every task; accuracies only where the task has them.
nlohmann::json train_json(const train::TrainReport& report, const std::string& run_dir) {
  nlohmann::json epochs = nlohmann::json::array();
  for (const auto& e : report.epochs) {
    epochs.push_back({{"epoch", e.epoch},
                      {"loss", e.loss},
                      {"seconds", e.seconds},
                      {"images_per_second", e.images_per_second}});
    if (e.has_accuracy) epochs.back()["accuracy"] = e.accuracy;
    if (e.has_test) {
      epochs.back()["test_loss"] = e.test_loss;
      if (e.has_accuracy) epochs.back()["test_accuracy"] = e.test_accuracy;
    }
  }
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [k, v] : report.settings) settings[k] = v;
  nlohmann::json out = {{"task", report.task},  {"device", report.device},
                        {"run_dir", run_dir},   {"settings", settings},
                        {"epochs", epochs},     {"train_s", report.train_seconds},
                        {"steps", report.steps}};
  if (!report.evals.empty()) {
    nlohmann::json evals = nlohmann::json::array();
    for (const auto& p : report.evals) {
      evals.push_back({{"step", p.step},
                       {"epoch", p.epoch},
                       {"train_s", p.train_seconds},
                       {"test_loss", p.loss}});
      if (report.has_accuracy) evals.back()["test_accuracy"] = p.accuracy;
    }
    out["evals"] = evals;
  }
  if (report.target_reached) {  // absent when not reached
    out["time_to_target_s"] = report.target_reached->train_seconds;
    out["target_epoch"] = report.target_reached->epoch;
    out["target_step"] = report.target_reached->step;
    out["target_test_accuracy"] = report.target_reached->accuracy;
  }
  if (report.budget) out["time_budget"] = train::budget_json(*report.budget);
  if (report.peak_memory.bytes >= 0)
    out["peak_memory"] = train::peak_memory_json(report.peak_memory);
  if (!report.thread_changes.empty())
    out["thread_changes"] = train::thread_changes_json(report.thread_changes);
  if (!report.epochs.empty()) out["loss"] = report.epochs.back().loss;
  if (report.has_test) {
    out["test"] = eval_json(report.test, report.class_names);
    if (report.has_accuracy) out["accuracy"] = report.test.accuracy;
  }
  return out;
}

Subcommand add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "train",
      "Train a classifier (default: the seeds' Fashion-MNIST MLP, 5 epochs) or a sprite generator "
      "(--task generate), and evaluate it");
  auto config = std::make_shared<train::TrainConfig>();
  auto json = std::make_shared<bool>(false);
  config->model.clear();  // empty = ann, or the resumed checkpoint's model
  sub->add_option("--device", config->device,
                  "auto | cpu | cuda | cuda:N | mps (auto: CUDA, else MPS, else CPU)")
      ->capture_default_str();
  sub->add_option("--model", config->model,
                  "ann (seed MLP 784-128-64-10) | cnn | fastcnn | fastcnn-2x | fastcnn-wide (the "
                  "recipes' BatchNorm CNNs) | simplenn (seed 003, 3-10-2) | script:FILE (your "
                  "own, from Python: torch.jit.script(model).save(FILE); docs/interop.md) "
                  "[default: ann; cnn for sprite datasets]")
      ->check(model_validator());
  sub->add_option("--dataset", config->dataset,
                  "fashion-mnist | dummy (random learnable data for simplenn) | "
                  "sprites | folder:PATH | sheet:FILE | npy:FILE[,LABELS.npy] (docs/sprites.md)")
      ->check(sprite_dataset_validator())
      ->capture_default_str();
  sub->add_option("--data", config->data_dir,
                  "Folder with the Fashion-MNIST IDX files (plain or .gz)")
      ->capture_default_str();
  const std::string generator_budget =
      std::to_string(static_cast<int>(diffusion::kDefaultTimeBudgetSeconds / 60)) + " minutes";
  // --epochs and --batch-size show no default value: a generator's depend on its data and device,
  // and a --print-config file that stated 5 or 64 would fix them when replayed.
  sub->add_option("--epochs", config->epochs,
                  "Epochs to train (in total, when resuming; with --time-budget, the most). "
                  "Unset: 5; a generator, about " +
                      std::to_string(diffusion::kDefaultSprites) + " sprites' worth (" +
                      std::to_string(diffusion::default_steps(diffusion::kDefaultBatch)) +
                      " steps of " + std::to_string(diffusion::kDefaultBatch) + ", " +
                      std::to_string(diffusion::default_steps(diffusion::kDefaultCpuBatch)) +
                      " of " + std::to_string(diffusion::kDefaultCpuBatch) +
                      ") within a time budget of " + generator_budget + "; a sprite classifier, " +
                      train::sprite_classifier_epochs_rule())
      ->check(kNonNegative);
  sub->add_option("--time-budget", config->time_budget_s,
                  "Train the epochs that fit in this much training time (900, 900s, 15m, 1.5h, "
                  "1h30m; 0: none), at most --epochs: planned from the speed of the run's first "
                  "steps and revised twice from that of the steps since (evaluations and sample "
                  "sheets not counted); a budget used up before its steps are timed ends the run "
                  "with the epoch in progress; a --config file takes "
                  "seconds or the same text in quotes. A generator without --epochs takes " +
                      generator_budget)
      ->type_name("DURATION")
      ->transform(CLI::Validator(
          [](std::string& text) {
            try {
              // Every digit: c10::str keeps 6, and the run would take the rounded budget.
              // No flag in the message: CLI11 puts "--time-budget: " before it.
              text = config::shortest_double_text(train::parse_duration(text, ""));
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          ""));  // the type name says DURATION
  sub->add_option("--batch-size", config->batch_size,
                  "Samples per step. Unset: " + std::to_string(config->batch_size) +
                      "; a generator, " + std::to_string(diffusion::kDefaultCpuBatch) +
                      " on the CPU (where a step's time grows with its sprites, so a time budget "
                      "buys more steps) and " +
                      std::to_string(diffusion::kDefaultBatch) + " on a GPU")
      ->check(kPositive);
  sub->add_option("--lr", config->lr, "Learning rate")->check(kPositive)->capture_default_str();
  sub->add_option("--optimizer", config->optimizer, "adam | adamw (decoupled weight decay) | sgd")
      ->check(CLI::IsMember(train::optimizer_names()))
      ->capture_default_str();
  sub->add_option("--momentum", config->momentum, "SGD momentum")
      ->check(number_between(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--weight-decay", config->weight_decay,
                  "Weight decay: decoupled for adamw, L2 on the gradient for adam and sgd, as "
                  "PyTorch's optimizers [default: 0.01 for adamw, 0 otherwise]")
      ->check(kNonNegative);
  sub->add_option("--lr-schedule", config->lr_schedule,
                  "constant | cosine (to 0 at the run's end) | step:E[:G] (times G, default 0.1, "
                  "every E epochs); a function of the global step, so resuming continues it")
      ->check(
          parsed_by([](const std::string& text) { train::parse_lr_schedule(text); }, "SCHEDULE"))
      ->capture_default_str();
  sub->add_option("--warmup-steps", config->warmup_steps,
                  "Linear learning-rate warm-up over the first N steps (0: none); one that spans "
                  "the whole run is refused (the lr would never reach --lr), and said in a "
                  "settings note when a recipe or the generator's defaults chose it")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--seed", config->seed, "Seed for weights and data order")
      ->check(kSeed)
      ->capture_default_str();
  sub->add_option("--log-every", config->log_every,
                  "Steps between running-loss lines (0: per epoch only)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--train-limit", config->train_limit,
                  "Train on N samples only (0: all): the first N; of a sprite dataset, N "
                  "stratified by class: one of every class (N below the classes: N classes at even "
                  "steps), the rest in proportion to the class sizes")
      ->check(kNonNegative);
  sub->add_option("--test-limit", config->test_limit,
                  "Evaluate on N test samples only (0: all): the first N; of a sprite dataset, N "
                  "of its held-out split stratified by class, as --train-limit (refused without "
                  "one)")
      ->check(kNonNegative);
  add_cpu_thread_options(sub, config->threads, config->blas_threads);
  sub->add_option(
         "--data-on", config->data_path.data_on,
         "auto | device (whole dataset resident on the device) | host (streamed by workers)")
      ->check(CLI::IsMember({"auto", "device", "host"}))
      ->capture_default_str();
  sub->add_option("--workers", config->data_path.workers,
                  "Streaming: batch-assembling threads (0: in the training thread; at most " +
                      std::to_string(data::kMaxWorkers) + ")")
      ->check(number_between(0, data::kMaxWorkers))
      ->capture_default_str();
  sub->add_option("--prefetch", config->data_path.prefetch,
                  "Streaming: batches in flight to the device")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--pin-memory", config->data_path.pin_memory,
                  "Streaming: pinned host buffers, 1/0 (default: on for CUDA)")
      ->check(CLI::Range(0, 1));
  sub->add_option("--resident-share", config->data_path.resident_share,
                  "auto: resident when the data needs at most this share of free device memory")
      ->check(number_between(0.0, 1.0))
      ->capture_default_str();
  sub->add_option(
         "--augment", config->augment,
         "On-device batch augmentation: none, or flip, shift[:N] (up to N pixels each way, "
         "default 2; less than half the image's side) and cutout:N (an N x N square set to 0; "
         "less than the image's side), joined by commas, e.g. flip,shift:2,cutout:8")
      ->check(parsed_by([](const std::string& text) { data::parse_augment(text); }, "AUGMENT"))
      ->capture_default_str();
  add_choice(sub, "--class-sampling", config->class_sampling,
             "natural | balanced (each epoch draws every class equally often, the small classes' "
             "sprites repeated: for generators asked for every class alike)");
  add_choice(sub, "--step", config->step,
             "auto | autograd | fused (fused: hand-written forward/backward for ReLU MLPs)");
  sub->add_option("--micro-batches", config->micro_batches,
                  "Each batch's forward and backward in this many chunks, one optimizer step "
                  "after them: the memory of a chunk, the gradient of the whole batch (BatchNorm "
                  "sees each chunk's statistics). The autograd step")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option(
         "--step-threads,--step-shards", config->step_threads,
         "Fused step on the CPU: threads that split each step (0: one per core, or cores / "
         "--blas-threads when that is given)")
      ->check(kThreadCount)
      ->capture_default_str();
  add_choice(sub, "--thread-governor", config->thread_governor,
             "auto | on | off. CPU, no thread count given: fewer threads while other processes "
             "keep the cores busy, all again when they stop (beside one busy process a step on 2 "
             "cores ran 2x faster on 1 thread than on 2). auto: for the fused MLP step, whose "
             "results stay the same; on: for conv nets too, whose last bits then vary; off: keep "
             "the threads");
  sub->add_flag("--drop-last", config->drop_last, "Drop the last partial batch of each epoch");
  add_choice(sub, "--precision", config->precision,
             "fp32 | bf16 | fp16 | auto (bf16/fp16: autocast with fp32 weights; fp16 is CUDA "
             "only and adds dynamic loss scaling; auto: bf16 where the device's native bf16 was "
             "measured faster: CUDA, AMD CPUs; devices says what auto picks)");
  sub->add_option("--clip-grad-norm", config->clip_grad_norm,
                  "Clip the gradients' L2 norm to this, after loss unscaling (0: off)")
      ->check(kNonNegative)
      ->capture_default_str();
  // Two flags for one tri-state (auto unless either is given); both given is an error.
  auto* graphs_on = sub->add_flag_function(
      "--cuda-graphs",
      [config](int64_t n) {
        if (n > 0) config->cuda_graphs = train::CudaGraphs::kOn;
      },
      "CUDA: insist on capturing the whole train step as a CUDA graph (an error says why it "
      "cannot). Default: captured wherever valid (CUDA, resident data, one process), the settings "
      "say why not elsewhere");
  sub->add_flag_function(
         "--no-cuda-graphs",
         [config](int64_t n) {
           if (n > 0) config->cuda_graphs = train::CudaGraphs::kOff;
         },
         "CUDA: run every step eagerly, without graph capture")
      ->excludes(graphs_on);
  sub->add_option("--channels-last", config->channels_last,
                  "CNNs on CUDA and on CPUs with AVX2: channels_last memory format "
                  "(true|false; a generator's default is false: its GroupNorms run NCHW)")
      ->capture_default_str();
  sub->add_option("--cudnn-benchmark", config->cudnn_benchmark,
                  "CUDA: let cuDNN pick the fastest conv algorithms (true|false)")
      ->capture_default_str();
  sub->add_option("--save", config->save, "Write a checkpoint here after training")->check(kPath);
  sub->add_option("--resume", config->resume, "Continue from this checkpoint")
      ->check(kExistingFile);
  sub->add_option("--checkpoint-every", config->checkpoint_every,
                  "Also checkpoint every N steps, to <save>.step<global step>.pt (0: never)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--keep-last", config->keep_last,
                  "Keep only the newest K periodic checkpoints (0: all)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_flag("--overwrite", config->overwrite, "Let --save replace an existing file");
  add_choice(sub, "--task", config->task,
             "classify | generate (sprite diffusion model; docs/sprites.md). Without --recipe, "
             "generate fills the options not given with the generator's defaults: " +
                 train::generator_defaults().summary);
  add_sprite_data_options(sub, *config, /*training=*/true);
  add_choice(sub, "--strategy", config->strategy,
             "auto | single | dp | ddp (auto: ddp when started by launch/torchrun, else single; "
             "dp needs a CUDA build)");
  add_choice(sub, "--dist-backend", config->dist_backend,
             "auto | gloo | nccl (auto: nccl on CUDA, else gloo)");
  sub->add_option(
         "--dist-timeout", config->dist_timeout_s,
         "Seconds a rank waits for the others (rendezvous, each collective) before failing")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--bucket-mb", config->bucket_mb, "Gradient all-reduce bucket size in MB (ddp)")
      ->check(kPositive)
      ->capture_default_str();
  add_choice(sub, "--dist-shard", config->dist_shard,
             "ddp: auto | global (each epoch's order re-sharded over the ranks: the batches of "
             "a single process) | local (a fixed 1/R share per rank, all a rank keeps; auto: "
             "local on CUDA, else global)");
  sub->add_flag_callback(
      "--no-overlap", [config] { config->overlap = false; },
      "ddp: all-reduce the gradients after backward instead of overlapping it");
  sub->add_option("--recipe", config->recipe,
                  "Named defaults for the options not given (a flag, variable or --config file "
                  "overrides each): " +
                      train::describe_recipes() + ". docs/benchmarks.md")
      ->check(CLI::IsMember(train::recipe_names()));
  sub->add_option("--target-accuracy", config->target_accuracy,
                  "Stop when the test accuracy reaches this (0-1; evaluated every epoch and "
                  "every --eval-every-steps, outside the timed training); --json reports "
                  "time_to_target_s (0: train every epoch)")
      ->check(number_between(0.0, 1.0));
  sub->add_option("--label-smoothing", config->label_smoothing,
                  "Classifiers: cross-entropy against labels smoothed by this much (0-1)")
      ->check(number_between(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--test-time-augment", config->test_time_augment,
                  "Classifiers: none | flip (evaluate on the mean of each image's and its "
                  "mirror's probabilities; kept in the checkpoint for eval and classify)")
      ->check(CLI::IsMember({"none", "flip"}))
      ->capture_default_str();
  sub->add_option("--first-conv", config->first_conv,
                  "Classifiers: learned | whitened (the model's first convolution fixed before "
                  "training to whiten its patches of the first 5,000 training images, each "
                  "principal direction beside its negative, repeated when it has more channels "
                  "than directions, and frozen: the rest learns on decorrelated inputs from the "
                  "first step; computing them counts as training time)")
      ->check(CLI::IsMember({"learned", "whitened"}))
      ->capture_default_str();
  sub->add_flag("--json", *json, "Print a JSON summary on stdout (progress goes to stderr)");
  auto run_flags = add_run_options(sub, *config);
  auto tensorboard = std::make_shared<bool>(false);
  sub->add_flag(
      "--tensorboard", *tensorboard,
      "Also write TensorBoard event files (running and epoch loss, accuracy, test "
      "results, a sheet of training samples; generators: the sprites drawn every --sample-every "
      "epochs) into the run folder: tensorboard --logdir runs");

  return {
      sub, [sub, config, json, run_flags, tensorboard]() {
        check_data_option_applies(*sub, config->dataset);
        // The generator's options, given on the command line of a classifier's run: refused even
        // at their default values (the library sees only values, and refuses the others).
        if (config->task == train::TaskKind::kClassify)
          for (const char* name :
               {"--unet-base", "--unet-mult", "--unet-attention", "--unet-scale-shift",
                "--prediction", "--noise-schedule", "--min-snr-gamma", "--sample-every"}) {
            const CLI::Option* option = sub->get_option_no_throw(name);
            if (option != nullptr && given_on_command_line(option))
              throw train::not_for_task(name, "classify", "it is one of the generator's options");
          }
        if (const auto note = unused_runs_root_note(*run_flags, *sub, *tensorboard); !note.empty())
          std::cerr << "note: " << note << "\n";
        RunSession session(*run_flags, *config, *sub, *json);
        std::ostream& human = session.human();
        std::unique_ptr<report::EventWriter> events;
        std::unique_ptr<report::TensorBoardObserver> tensorboard_observer;
        if (*tensorboard && (events = open_tensorboard(session.folder(), run_flags->runs_root))) {
          if (!session.quiet()) human << "TensorBoard events: " << events->path() << "\n";
          tensorboard_observer = std::make_unique<report::TensorBoardObserver>(
              *events, nullptr, [&session](const std::string& line) { session.warn(line); });
          session.add_observer(tensorboard_observer.get());
        }
        // A run refused before it starts (no such device, --save there, an option the Trainer
        // refuses) leaves no events file: TensorBoard would list it as a run.
        struct DiscardUnlessStarted {
          report::EventWriter* events;
          const report::TensorBoardObserver* observer;
          ~DiscardUnlessStarted() {
            if (events && observer && !observer->started()) events->discard();
          }
        } discard_events{events.get(), tensorboard_observer.get()};
        auto task = make_task(*config);  // an option of the other task fails first,
        const torch::Device device =
            device::pick_device(config->device);  // then an unavailable device, before the data
        const train::Datasets data = train::load_datasets(*config);
        const bool generator = config->task == train::TaskKind::kGenerate;
        // A resumed classifier without --model trains the checkpoint's: config.toml records it,
        // or --config would replay the run with the default model.
        if (!generator && sub->count("--model") == 0 && !config->resume.empty())
          if (const auto resumed = train::peek_checkpoint_meta(config->resume)) {
            std::string model = resumed->value("model", std::string());
            if (model == "script") {  // --model takes the TorchScript file it came from
              const std::string file = resumed->value("script_file", std::string());
              model = file.empty() ? std::string() : "script:" + file;
            }
            if (!model.empty()) {
              sub->get_option("--model")->add_result(model);
              session.record_config(*sub);
            }
          }
        // A generator's batch without --batch-size (flag, variable, config file) is the resumed
        // run's, else follows from the device; config.toml records it, so --config repeats this
        // run.
        if (generator && sub->count("--batch-size") == 0) {
          std::optional<nlohmann::json> resumed;
          if (!config->resume.empty()) resumed = train::peek_checkpoint_meta(config->resume);
          const int64_t resumed_batch = resumed && resumed->contains("batch_size") &&
                                                resumed->at("batch_size").is_number_integer()
                                            ? resumed->at("batch_size").get<int64_t>()
                                            : 0;
          config->batch_size = resumed_batch > 0 ? resumed_batch : diffusion::default_batch(device);
          sub->get_option("--batch-size")->add_result(std::to_string(config->batch_size));
          session.record_config(*sub);
        }
        // A generator trains for a number of optimizer steps, whatever the dataset's size, and a
        // sprite classifier for at least a number of them: without --epochs (flag, variable,
        // config file or recipe) the epochs follow from the dataset's size.
        const bool sprite_classifier =
            config->task == train::TaskKind::kClassify && data::is_sprite_dataset(config->dataset);
        if ((generator || sprite_classifier) && sub->count("--epochs") == 0) {
          const int64_t n = config->train_limit > 0
                                ? std::min(config->train_limit, data.train.size())
                                : data.train.size();
          config->epochs = generator ? diffusion::default_epochs(n, config->batch_size)
                                     : train::sprite_classifier_epochs(n, config->batch_size);
          // A run folder's sheets: about ten over the run, not one per (short) epoch.
          if (generator && sub->count("--sample-every") == 0 && config->sample_every > 0) {
            config->sample_every = std::max<int64_t>(1, config->epochs / 10);
            sub->get_option("--sample-every")->add_result(std::to_string(config->sample_every));
          }
          // Its held-out loss: about 50 points on the test curve, not one per short epoch (each
          // is a pass over the held-out sprites: 282 of them took 59 s of a 17-minute DCSS run).
          if (generator && sub->count("--eval-every") == 0 && config->eval_every > 0) {
            config->eval_every = std::max<int64_t>(1, config->epochs / 50);
            sub->get_option("--eval-every")->add_result(std::to_string(config->eval_every));
          }
          // A generator's steps are bounded by time too: the defaults must fit a slow CPU, and a
          // fast one takes every step (train/time_budget.h).
          if (generator && sub->count("--time-budget") == 0) {
            config->time_budget_s = diffusion::kDefaultTimeBudgetSeconds;
            sub->get_option("--time-budget")
                ->add_result(config::shortest_double_text(config->time_budget_s));
          }
          // config.toml records the epochs chosen, so `--config` repeats this run.
          sub->get_option("--epochs")->add_result(std::to_string(config->epochs));
          session.record_config(*sub);
          task = make_task(*config);
          if (!session.quiet())
            human << "Epochs: " << config->epochs << " ("
                  << (generator ? "about " +
                                      std::to_string(diffusion::default_steps(config->batch_size)) +
                                      " steps of " + std::to_string(config->batch_size) + " from " +
                                      std::to_string(n) + " sprites" +
                                      (config->time_budget_s > 0
                                           ? ", fewer if they do not fit in " +
                                                 format_duration(config->time_budget_s,
                                                                 /*keep_tenths=*/true) +
                                                 " of training"
                                           : std::string())
                                : std::to_string(n) + " sprites in batches of " +
                                      std::to_string(config->batch_size) + ": " +
                                      train::sprite_classifier_epochs_rule())
                  << "; --epochs sets them" << (generator ? ", --time-budget the time" : "")
                  << ")\n";
        }
        // A warm-up the user did not choose that outlasts the run is a note, not a refusal.
        config->warmup_steps_origin = set_by(sub->get_option("--warmup-steps"));
        if (tensorboard_observer)
          tensorboard_observer->write(
              [&](report::EventWriter& writer) { log_training_samples(writer, data.train); });
        const train::TrainReport report = [&] {
          try {
            return train::Trainer(*config).fit(*task, data, &session.observer());
          } catch (const Error& e) {  // diverged, a step that failed, a disk that filled
            session.record_failure(e);
            throw;
          }
        }();
        if (!report.main_rank) return 0;  // ddp: rank 0 reports
        const int64_t last_epoch = report.start_epoch + static_cast<int64_t>(report.epochs.size());
        if (tensorboard_observer && report.has_test)
          tensorboard_observer->write([&](report::EventWriter& writer) {
            if (report.has_accuracy)
              writer.add_scalar("test/accuracy", report.test.accuracy, last_epoch);
            writer.add_scalar("test/loss", report.test.loss, last_epoch);
          });

        human << std::fixed << std::setprecision(2) << "Train time: " << report.train_seconds
              << " s (" << report.steps << (report.steps == 1 ? " step)\n" : " steps)\n");
        // Where --target-accuracy stopped the run (often inside an epoch), or that it did not.
        if (const auto& hit = report.target_reached)
          human << "Target accuracy " << config::shortest_double_text(config->target_accuracy)
                << " reached at step " << hit->step << " (epoch " << std::setprecision(2)
                << hit->epoch << ") after " << hit->train_seconds
                << " s of training: test accuracy " << std::setprecision(4) << hit->accuracy
                << "\n";
        else if (config->target_accuracy > 0 && report.has_test)
          human << "Target accuracy " << config::shortest_double_text(config->target_accuracy)
                << " not reached\n";
        if (report.peak_memory.bytes >= 0)
          human << "Peak memory: " << std::setprecision(1)
                << static_cast<double>(report.peak_memory.bytes) / (1 << 20) << " MiB ("
                << report.peak_memory.what << ")\n";
        if (!report.thread_changes.empty() && !session.quiet())  // (--json has them too)
          human << "Threads: " << train::describe_thread_changes(report.thread_changes) << "\n";
        human << std::setprecision(4);
        if (!report.epochs.empty() && !report.has_accuracy)
          human << "Final loss: " << report.epochs.back().loss << "\n";
        if (report.has_test)
          human << (report.has_accuracy ? "Test Accuracy: " : "Test loss: ")
                << (report.has_accuracy ? report.test.accuracy : report.test.loss) << "\n";
        human << std::defaultfloat;
        if (!config->save.empty()) human << "Saved checkpoint: " << config->save << "\n";
        // Pictures and summary.json, after the figures. One that cannot be written still lets
        // --json print the run's figures before the error.
        std::optional<IncompleteRun> unrecorded;
        try {
          session.finish(report, config->save);
        } catch (const IncompleteRun& e) {
          unrecorded = e;
        }
        if (*json)
          std::cout << json_text(train_json(report, session.folder())) << "\n" << std::flush;
        if (unrecorded) throw *unrecorded;
        return 0;
      }};
}

}  // namespace spritetorch::cli
