// A training run's folder: runs/<date>-<time>-<task>-<model>/ by default (docs/runs.md) with
//   config.toml     the effective flags (written by the CLI, which owns them)
//   metrics.jsonl   one JSON object per line: start, log, epoch, eval, samples, end
//   summary.json    the final figures; written last, so its absence means the run did not finish
//   checkpoint.pt   unless --save names another place; periodic checkpoints beside it
//   curves.png, confusion.png, misclassified.png (gnuplot), samples/epoch-NNN.png (generators)
// RunRecorder is the TrainObserver that fills it. Only rank 0 of a ddp run makes one.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runs/plots.h"
#include "train/trainer.h"

namespace spritetorch::runs {

constexpr int kMetricsSchema = 1;  // "schema" of metrics.jsonl's start line and of summary.json

// Makes a fresh folder <root>/<YYYY-MM-DD-HHMMSS>-<task>-<model> (local time `now`); when that name
// is taken, -2, -3, ... are appended: a run never writes into another run's folder.
std::string create_run_folder(const std::string& root, const std::string& task,
                              const std::string& model, std::time_t now);
// --run-dir: creates `folder` (and its parents); an existing folder must be empty. The folder is
// claimed by making its metrics.jsonl (O_EXCL), so that of two runs given it at once one starts and
// the other is refused. Returns whether it made the folder.
bool claim_run_folder(const std::string& folder);

struct RunIdentity {
  std::string task;     // classify | generate
  std::string model;    // ann, cnn, unet, ...
  std::string dataset;  // as given
};

// The folder's files but summary.json are extras: one that cannot be written (a sample sheet, a
// metrics line, a picture) is a note, and the training goes on; summary.json's "not_written" says
// what is missing.
class RunRecorder : public train::TrainObserver {
 public:
  using Note = std::function<void(const std::string&)>;
  // Opens metrics.jsonl in `folder` (an existing, claimed folder) and writes config.toml.
  RunRecorder(std::string folder, RunIdentity identity, const std::string& config_toml);
  ~RunRecorder() override;
  RunRecorder(const RunRecorder&) = delete;
  RunRecorder& operator=(const RunRecorder&) = delete;
  // Where the notes of a failed write during training go, one line each (none: they are only
  // kept, and summary.json lists them).
  void set_note(Note note) { note_ = std::move(note); }

  const std::string& folder() const { return folder_; }
  // Writes config.toml again: for settings the CLI decides after the folder is made (a
  // generator's epochs follow from its dataset's size). Atomically: a failure leaves the previous
  // one (or none) and throws Error naming the file and the reason.
  void rewrite_config(const std::string& config_toml);
  // True once training has started (on_start): from then on the folder is a run, finished or not.
  bool started() const { return !device_.empty(); }
  // For a run that failed before it started (bad flags, bad data): removes the files written so
  // far, and the folder itself when `remove_folder` (it was made for this run) and it is empty.
  void discard(bool remove_folder);
  std::string file(const std::string& name) const;

  void on_start(const std::string& device, const train::Settings& settings) override;
  void on_step(const train::StepTick& tick) override {
    global_step_ = tick.global_step;
    epoch_ = tick.epoch;
  }
  void on_log(const train::StepLog& log) override;
  void on_epoch(const train::EpochReport& report) override;
  // An eval line within the epoch (with its epoch_step), and a point of the test curves.
  void on_eval(const train::EvalPoint& point, const train::StepTick& at) override;
  // Writes samples/epoch-NNN.png (rows: classes).
  void on_samples(int64_t epoch, const torch::Tensor& sprites, int64_t per_class) override;

  struct Finished {
    std::map<std::string, std::string> pictures;  // name -> file in the folder
    std::vector<std::string> notices;             // pictures skipped or failed, one line each
  };
  // A run that started and then failed (diverged, a step that threw, a disk that filled): a
  // `failed` line in metrics.jsonl with the error and its hint, so that `runs` says why the run has
  // no summary.json. Nothing before the run started.
  void record_failure(const std::string& error, const std::string& hint);
  // After training: the pictures, the end line of metrics.jsonl and summary.json. `checkpoint`:
  // where the final checkpoint went. `gnuplot_path`: a PATH value to search (nullptr: ours).
  // Throws Error naming summary.json and the reason when that cannot be written.
  Finished finish(const train::TrainReport& report, const std::string& checkpoint,
                  const char* gnuplot_path = nullptr);
  // What finish() drew and noted, also when summary.json then failed.
  const Finished& drawn() const { return drawn_; }

 private:
  void write_line(nlohmann::json line);
  // An `eval` line: `line` (kind, step, epoch, ...) with the test loss, and accuracy where the
  // task has one, as its values.
  void write_eval_line(double loss, bool has_accuracy, double accuracy, nlohmann::json line);
  double wall_seconds() const;
  // Runs each script with gnuplot; one notice for a missing gnuplot, one per failure.
  void draw(const std::vector<PlotScript>& scripts, const char* gnuplot_path, Finished& finished);
  nlohmann::json summary_base(const std::string& checkpoint, const Finished& finished) const;
  void write_summary(const nlohmann::json& summary);
  // A file of the folder that could not be written: noted once per file, listed in summary.json.
  void lost(const std::string& name, const std::string& reason);

  std::string folder_;
  RunIdentity identity_;
  int metrics_ = -1;                // metrics.jsonl's descriptor
  int64_t metrics_bytes_ = 0;       // whole lines in it
  int64_t metrics_lost_ = 0;        // lines not written, after the first failure
  int64_t metrics_lost_from_ = -1;  // the step of the first of them
  std::string metrics_reason_;
  std::map<std::string, std::string> not_written_;  // file -> reason
  Note note_;
  Finished drawn_;
  std::chrono::steady_clock::time_point start_;
  std::string started_;  // ISO 8601 local time
  std::string device_;
  train::Settings settings_;
  int64_t last_eval_step_ = -1;  // global_step_ at the latest on_eval
  CurvePoints curves_;
  std::vector<std::string> sample_sheets_;
  int64_t global_step_ = 0;  // steps since the run's first epoch, at the latest tick
  int64_t epoch_ = 0;        // 1-based, at the latest tick (0 before the first step)
};

// "2024-05-01T14:22:33+0200" for `when`, local time.
std::string iso_time(std::time_t when);

}  // namespace spritetorch::runs
