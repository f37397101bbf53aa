#include "run_session.h"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "checks.h"
#include "common/error.h"
#include "config_file.h"
#include "data/sprite_sources.h"
#include "distributed/dist_env.h"
#include "train/checkpoint.h"

namespace spritetorch::cli {

namespace {

// The model the trainer will build, for the folder name (train::default_model and, resuming, the
// checkpoint's model: train/classifier_task.h).
std::string model_for_name(const train::TrainConfig& config) {
  if (config.task == train::TaskKind::kGenerate) return "unet";
  // A TorchScript model by its file's stem: the whole path made the name too long to create.
  if (config.model.rfind("script:", 0) == 0)
    return "script-" + std::filesystem::path(config.model.substr(7)).stem().string();
  if (!config.model.empty()) return config.model;
  if (!config.resume.empty()) {  // the trainer reads (and checks) the whole file once, later
    const auto meta = train::peek_checkpoint_meta(config.resume);
    return meta ? meta->value("model", std::string("resumed")) : std::string("resumed");
  }
  return train::default_model(config);
}

// ddp ranks other than 0 keep no folder (rank 0 writes for all, as with checkpoints).
bool main_rank() { return distributed::is_main_rank(distributed::process_env()); }

}  // namespace

std::shared_ptr<RunFlags> add_run_options(CLI::App* sub, train::TrainConfig& config) {
  auto flags = std::make_shared<RunFlags>();
  const std::string group = "Progress and run folders (docs/runs.md)";
  // --run-dir and --no-run-dir, --quiet and --verbose exclude each other: both on the command
  // line is an error, and one there beats the other from a --config file (resolve_config).
  auto* run_dir =
      sub->add_option("--run-dir", flags->run_dir,
                      "Keep this run in exactly this folder (new or empty) [default: a fresh "
                      "<runs-root>/<date>-<time>-<task>-<model>]")
          ->check(kPath)
          ->group(group)
          ->configurable(false);  // a replayed config must not aim a second run at the same folder
  mirror_environment(sub->add_option("--runs-root", flags->runs_root, "Where fresh run folders go")
                         ->check(kPath)
                         ->capture_default_str()
                         ->group(group),
                     "SPRITETORCH_RUNS_ROOT");
  sub->add_flag("--no-run-dir", flags->no_run_dir,
                "Keep no run folder (scripted runs; --save still writes its checkpoint)")
      ->excludes(run_dir)
      ->group(group);
  auto* quiet =
      sub->add_flag("--quiet,-q", flags->quiet, "Print only the results and errors")->group(group);
  sub->add_flag(
         "--verbose", flags->verbose,
         "Also print the running loss every --log-every steps on a terminal, and more detail")
      ->excludes(quiet)
      ->group(group);
  sub->add_option("--eval-every", config.eval_every,
                  "Evaluate the test set every N epochs for the test curves, outside the timed "
                  "training (0: after the last epoch only) [a --task generate run whose epochs "
                  "follow from its data: epochs / 50]")
      ->check(kNonNegative)
      ->capture_default_str()
      ->group(group);
  sub->add_option("--eval-every-steps", config.eval_every_steps,
                  "Also evaluate the test set every N optimizer steps within epochs, outside the "
                  "timed training (0: never; the test curves gain points, --target-accuracy "
                  "stops sooner; refused without a test set)")
      ->check(kNonNegative)
      ->capture_default_str()
      ->group(group);
  sub->add_option(
         "--sample-every", config.sample_every,
         "--task generate: a sample sheet samples/epoch-NNN.png every N epochs in the run "
         "folder (0: none) [default: 1 with a run folder; epochs / 10 where the epochs follow from "
         "the data]")
      ->check(kNonNegative)
      ->group(group);
  return flags;
}

std::string unused_runs_root_note(const RunFlags& flags, const CLI::App& sub, bool tensorboard) {
  const CLI::Option* root = sub.get_option_no_throw("--runs-root");
  if (root == nullptr || !given_on_command_line(root)) return "";  // config.toml lists it
  if (!flags.run_dir.empty())
    return "--runs-root places fresh run folders; --run-dir names this run's folder exactly";
  if (flags.no_run_dir && !tensorboard)
    return "--runs-root places run folders (and --tensorboard's events without one); "
           "--no-run-dir keeps none";
  return "";
}

RunSession::RunSession(const RunFlags& flags, train::TrainConfig& config, const CLI::App& sub,
                       bool json)
    : human_(json ? std::cerr : std::cout), quiet_(flags.quiet) {
  const bool keep = !flags.no_run_dir && main_rank();
  // (Another task's run is refused --sample-every by make_task, with that reason.)
  if (flags.no_run_dir && config.sample_every > 0 && config.task == train::TaskKind::kGenerate) {
    const CLI::Option* sample_every = sub.get_option_no_throw("--sample-every");
    if (sample_every != nullptr && given_on_command_line(sample_every))
      throw Error(
          "--sample-every writes sample sheets into the run folder; --no-run-dir keeps none",
          "drop --no-run-dir to keep the sheets, or --sample-every");
    // From a --config file: a run folder's config.toml names it always, as it does --runs-root.
    const std::string origin = origin_note(sub, "--sample-every");  // where the file says it
    if (!flags.quiet)
      std::cerr << "note: --no-run-dir draws no sample sheets, which go into the run folder"
                << (origin.empty() ? std::string() : " (" + origin + ")") << "\n";
    config.sample_every = 0;
  }
  if (keep) {
    const std::string config_toml =
        sub.config_to_str(/*default_also=*/true, /*write_description=*/true);
    std::string folder;
    if (!flags.run_dir.empty()) {
      made_folder_ = runs::claim_run_folder(flags.run_dir);
      folder = flags.run_dir;
    } else {
      folder = runs::create_run_folder(flags.runs_root, choice_name(config.task),
                                       model_for_name(config), std::time(nullptr));
      made_folder_ = true;
    }
    if (config.save.empty())
      config.save = (std::filesystem::path(folder) / "checkpoint.pt").string();
    if (config.task == train::TaskKind::kGenerate && sub.count("--sample-every") == 0)
      config.sample_every = 1;
    try {
      recorder_ = std::make_unique<runs::RunRecorder>(
          folder,
          runs::RunIdentity{choice_name(config.task), model_for_name(config), config.dataset},
          config_toml);
    } catch (const Error&) {
      // No recorder to discard(): a folder without its config.toml must not be listed as a run.
      std::error_code ignored;
      std::filesystem::remove(std::filesystem::path(folder) / "config.toml", ignored);
      std::filesystem::remove(std::filesystem::path(folder) / "metrics.jsonl", ignored);
      if (made_folder_) std::filesystem::remove(folder, ignored);  // only if empty
      throw;
    }
    recorder_->set_note([this](const std::string& line) { warn(line); });
  }
  runs::ProgressOptions options;
  options.style = runs::detect_terminal(json ? 2 : 1);
  if (options.style.redraw)
    options.columns = [fd = json ? 2 : 1] { return runs::terminal_columns(fd); };
  options.verbosity = flags.quiet     ? runs::Verbosity::kQuiet
                      : flags.verbose ? runs::Verbosity::kVerbose
                                      : runs::Verbosity::kNormal;
  options.run_folder = recorder_ ? recorder_->folder() : std::string();
  printer_ = std::make_unique<runs::ProgressPrinter>(human_, options);
  observers_ = std::make_unique<runs::ObserverList>(
      std::vector<train::TrainObserver*>{printer_.get(), recorder_.get()});
  library_notes_ = std::make_unique<runs::NotesBesideProgress>(*printer_, std::cerr);
}

void RunSession::note(const std::string& line) {
  if (quiet_) return;
  printer_->finish_line();  // not in the middle of a progress line
  std::cerr << "note: " << line << "\n" << std::flush;
}

void RunSession::warn(const std::string& line) {
  if (printer_) printer_->finish_line();
  std::cerr << "warning: " << line << "\n" << std::flush;
}

void RunSession::record_config(const CLI::App& sub) {
  if (recorder_)
    recorder_->rewrite_config(sub.config_to_str(/*default_also=*/true, /*write_description=*/true));
}

RunSession::~RunSession() {
  printer_->finish_line();
  if (recorder_ && !recorder_->started()) recorder_->discard(made_folder_);
}

void RunSession::record_failure(const Error& error) {
  if (recorder_) recorder_->record_failure(error.what(), error.hint());
}

void RunSession::report(const runs::RunRecorder::Finished& finished) {
  printer_->finish_line();
  // --quiet means results and errors only; summary.json's "pictures" still says what exists.
  if (!quiet_)
    for (const auto& notice : finished.notices) std::cerr << "note: " << notice << "\n";
  if (recorder_ && !quiet_) {
    human_ << "Run kept in " << recorder_->folder() << ":";
    for (const auto& [name, path] : finished.pictures) human_ << " " << path;
    human_ << " summary.json metrics.jsonl\n";
  }
}

void RunSession::finish(const train::TrainReport& report_in, const std::string& checkpoint) {
  if (!recorder_ || !report_in.main_rank) return;
  try {
    report(recorder_->finish(report_in, checkpoint));
  } catch (const Error& e) {
    printer_->finish_line();
    if (!quiet_)  // the pictures' notes too: a full disk may have cost them as well
      for (const auto& notice : recorder_->drawn().notices) std::cerr << "note: " << notice << "\n";
    // The model is where it was asked to go; only the run's record is not: exit 1, not 2.
    throw IncompleteRun(
        std::string(e.what()) +
            (checkpoint.empty() ? std::string("; the run finished")
                                : "; the run finished and its model was saved to " + checkpoint),
        make_room_hint(e.what()) + "; `spritetorch runs` lists " + recorder_->folder() +
            " as incomplete, and its metrics.jsonl keeps what the run wrote");
  }
}

}  // namespace spritetorch::cli
