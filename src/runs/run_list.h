// What `spritetorch runs` shows: every run folder under a root, with its main figures, read from
// summary.json (finished runs) or metrics.jsonl (unfinished ones). A folder that is damaged or not
// a run at all is listed as such, never a reason to stop.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace spritetorch::runs {

struct RunEntry {
  std::string name;  // folder name
  std::string path;
  std::string status;  // complete | incomplete | failed | corrupt
  // For incomplete / corrupt: what is missing or wrong; for failed: the error it stopped with; for
  // complete: the files its summary.json lists as not written.
  std::string problem;
  std::string started, task, model, dataset, device;
  int64_t epochs = 0;
  std::optional<double> test_accuracy;  // classifiers
  // The held-out loss: a generator's measure of how well it learned (its training loss is noisier:
  // random timesteps); the last evaluation's for an unfinished run.
  std::optional<double> test_loss;
  std::optional<double> final_loss;  // generators (or the last epoch's loss of an unfinished run)
  std::optional<double> train_seconds;
};

// The run folders directly under `root`, oldest first (names start with the date). A missing
// root gives an empty list.
std::vector<RunEntry> list_runs(const std::string& root);
// Whether `folder` is a run's folder: train writes config.toml and metrics.jsonl into it at the
// start, summary.json at the end. list_runs lists only those.
bool is_run_folder(const std::string& folder);
// One folder.
RunEntry read_run(const std::string& folder);

}  // namespace spritetorch::runs
