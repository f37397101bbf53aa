// What `train` shows and keeps: the progress printer (terminal or plain lines, --quiet,
// --verbose) and the run folder (--run-dir, --runs-root, --no-run-dir; docs/runs.md).
#pragma once

#include <CLI/CLI.hpp>

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "common/error.h"
#include "runs/observer_list.h"
#include "runs/progress.h"
#include "runs/run_folder.h"
#include "train/config.h"
#include "train/trainer.h"

namespace spritetorch::cli {

struct RunFlags {
  std::string run_dir;  // exact folder (empty: a fresh one under runs_root)
  std::string runs_root = "runs";
  bool no_run_dir = false;
  bool quiet = false, verbose = false;
};

// Adds --run-dir, --runs-root, --no-run-dir, --quiet, --verbose, --eval-every, --sample-every.
std::shared_ptr<RunFlags> add_run_options(CLI::App* sub, train::TrainConfig& config);
// The note for a --runs-root given on the command line or in a --config file that places nothing:
// with --run-dir (the exact folder), or with --no-run-dir and no TensorBoard events (which go
// under it then). Empty when it places something or came from SPRITETORCH_RUNS_ROOT (a setting
// for every run). A note, not a refusal: a config file kept in a run folder names it always.
std::string unused_runs_root_note(const RunFlags& flags, const CLI::App& sub, bool tensorboard);

class RunSession {
 public:
  // Picks the output style and, unless --no-run-dir or on a ddp rank other than 0, makes the run
  // folder: config.toml from `sub`'s effective flags; config.save defaults to its checkpoint.pt
  // and config.sample_every is applied. json: human output goes to stderr. "Run folder: X" is
  // printed when training starts, so a run refused before then names no folder.
  RunSession(const RunFlags& flags, train::TrainConfig& config, const CLI::App& sub, bool json);
  // Clears a progress line left on the terminal (an error message follows on the same screen);
  // a run that never started (bad flags or data) leaves no folder behind.
  ~RunSession();
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;
  train::TrainObserver& observer() { return *observers_; }
  // Also tell `extra` (e.g. the TensorBoard writer) about the run; it must outlive the session.
  void add_observer(train::TrainObserver* extra) { observers_->add(extra); }
  std::ostream& human() { return human_; }
  // Rewrites the folder's config.toml from `sub`'s flags as they are now (none: nothing).
  void record_config(const CLI::App& sub);
  bool quiet() const { return quiet_; }
  // "note: <line>" on stderr (nothing with --quiet), clear of the progress line.
  void note(const std::string& line);
  // A file of the run that could not be written: "warning: ...", printed under --quiet too, since
  // what is lost is no note on the run's progress.
  void warn(const std::string& line);
  // A run that started and then failed with `error`: its metrics.jsonl says why (`runs` shows it).
  void record_failure(const Error& error);
  // After training: pictures and summary.json; prints the notices and where the run is kept.
  // Throws IncompleteRun when summary.json cannot be written (the model was saved).
  void finish(const train::TrainReport& report, const std::string& checkpoint);
  // The run folder, empty when there is none.
  std::string folder() const { return recorder_ ? recorder_->folder() : std::string(); }

 private:
  void report(const runs::RunRecorder::Finished& finished);

  std::ostream& human_;
  bool quiet_;
  bool made_folder_ = false;  // the folder was created for this run (not an empty --run-dir)
  std::unique_ptr<runs::ProgressPrinter> printer_;
  std::unique_ptr<runs::RunRecorder> recorder_;
  std::unique_ptr<runs::ObserverList> observers_;
  std::unique_ptr<runs::NotesBesideProgress> library_notes_;  // clear of the progress line
};

}  // namespace spritetorch::cli
