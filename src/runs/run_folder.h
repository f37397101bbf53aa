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
#include <fstream>
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
// --run-dir: creates `folder` (and its parents); an existing folder must be empty. Returns
// whether it made the folder.
bool claim_run_folder(const std::string& folder);

struct RunIdentity {
  std::string task;     // classify | generate
  std::string model;    // ann, cnn, unet, ...
  std::string dataset;  // as given
};

class RunRecorder : public train::TrainObserver {
 public:
  // Opens metrics.jsonl in `folder` (an existing, claimed folder) and writes config.toml.
  RunRecorder(std::string folder, RunIdentity identity, const std::string& config_toml);

  const std::string& folder() const { return folder_; }
  // Writes config.toml again: for settings the CLI decides after the folder is made (a
  // generator's epochs follow from its dataset's size).
  void rewrite_config(const std::string& config_toml);
  // True once training has started (on_start): from then on the folder is a run, finished or not.
  bool started() const { return !device_.empty(); }
  // For a run that failed before it started (bad flags, bad data): removes the files written so
  // far, and the folder itself when `remove_folder` (it was made for this run) and it is empty.
  void discard(bool remove_folder);
  std::string file(const std::string& name) const;

  void on_start(const std::string& device, const train::Settings& settings) override;
  void on_step(const train::StepTick& tick) override {
    global_step_ = (tick.epoch - 1) * tick.steps + tick.step;
  }
  void on_log(const train::StepLog& log) override;
  void on_epoch(const train::EpochReport& report) override;
  // Writes samples/epoch-NNN.png (rows: classes).
  void on_samples(int64_t epoch, const torch::Tensor& sprites, int64_t per_class) override;

  struct Finished {
    std::map<std::string, std::string> pictures;  // name -> file in the folder
    std::vector<std::string> notices;             // pictures skipped or failed, one line each
  };
  // After training: the pictures, the end line of metrics.jsonl and summary.json. `checkpoint`:
  // where the final checkpoint went. `gnuplot_path`: a PATH value to search (nullptr: ours).
  Finished finish(const train::TrainReport& report, const std::string& checkpoint,
                  const char* gnuplot_path = nullptr);

 private:
  void write_line(nlohmann::json line);
  double wall_seconds() const;
  // Runs each script with gnuplot; one notice for a missing gnuplot, one per failure.
  void draw(const std::vector<PlotScript>& scripts, const char* gnuplot_path, Finished& finished);
  nlohmann::json summary_base(const std::string& checkpoint, const Finished& finished) const;
  void write_summary(const nlohmann::json& summary);

  std::string folder_;
  RunIdentity identity_;
  std::ofstream metrics_;
  std::chrono::steady_clock::time_point start_;
  std::string started_;  // ISO 8601 local time
  std::string device_;
  train::Settings settings_;
  CurvePoints curves_;
  std::vector<std::string> sample_sheets_;
  int64_t global_step_ = 0;  // steps since the run's first epoch, at the latest tick
};

// "2024-05-01T14:22:33+0200" for `when`, local time.
std::string iso_time(std::time_t when);

}  // namespace spritetorch::runs
