#include "runs/run_list.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace spritetorch::runs {

namespace {

namespace fs = std::filesystem;

std::optional<double> number_at(const nlohmann::json& j, const nlohmann::json::json_pointer& at) {
  if (!j.contains(at) || !j.at(at).is_number()) return std::nullopt;
  return j.at(at).get<double>();
}

std::string text_at(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// An unfinished run: what its metrics.jsonl reached. Damaged lines (a run killed mid-write) are
// skipped and named in `problem`.
void read_metrics(const std::string& path, RunEntry& entry) {
  std::error_code error;
  if (!fs::exists(path, error)) {
    entry.problem = "no metrics.jsonl";
    return;
  }
  // A folder or a FIFO of that name: reading it would throw or wait forever.
  if (!fs::is_regular_file(path, error)) {
    entry.problem = "metrics.jsonl is not a regular file";
    return;
  }
  std::ifstream in(path);
  if (!in) {
    entry.problem = "metrics.jsonl cannot be opened";
    return;
  }
  std::string line;
  int64_t number = 0, damaged = 0;
  std::string failure;  // the error of a `failed` line
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      ++damaged;
      continue;
    }
    const std::string kind = text_at(j, "kind");
    if (kind == "start") {
      entry.started = text_at(j, "time");
      entry.task = text_at(j, "task");
      entry.model = text_at(j, "model");
      entry.dataset = text_at(j, "dataset");
      entry.device = text_at(j, "device");
      failure.clear();
    } else if (kind == "epoch") {
      if (j.contains("epoch") && !j["epoch"].is_number_integer()) {  // edited or damaged
        ++damaged;
        continue;
      }
      entry.epochs = j.value("epoch", entry.epochs);
      entry.final_loss = number_at(j, "/values/loss"_json_pointer);
    } else if (kind == "eval") {
      entry.test_accuracy = number_at(j, "/values/accuracy"_json_pointer);
      entry.test_loss = number_at(j, "/values/loss"_json_pointer);
    } else if (kind == "failed") {
      failure = text_at(j, "error");
    }
  }
  if (!failure.empty()) {  // train wrote why it stopped (a later resume into the folder did not)
    entry.status = "failed";
    entry.problem = failure;
  } else {
    entry.problem = "no summary.json (still running, interrupted or failed)";
  }
  if (damaged)
    entry.problem += "; " + std::to_string(damaged) + " damaged line(s) in metrics.jsonl";
}

}  // namespace

RunEntry read_run(const std::string& folder) {
  RunEntry entry;
  entry.path = folder;
  entry.name = fs::path(folder).filename().string();
  const std::string summary_path = (fs::path(folder) / "summary.json").string();
  if (!fs::exists(summary_path)) {
    entry.status = "incomplete";
    read_metrics((fs::path(folder) / "metrics.jsonl").string(), entry);
    return entry;
  }
  entry.status = "corrupt";
  std::error_code error;
  if (!fs::is_regular_file(summary_path, error)) {  // a folder, a FIFO (reading would hang)...
    entry.problem = "summary.json is not a regular file";
    return entry;
  }
  std::ifstream in(summary_path);
  if (!in) {
    entry.problem = "summary.json cannot be opened";
    return entry;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // a read error (libstdc++'s filebuf throws on EIO)
    entry.problem = std::string("summary.json cannot be read: ") + e.what();
    return entry;
  }
  if (!j.is_object()) {
    entry.problem =
        j.is_discarded() ? "summary.json is not valid JSON" : "summary.json is not a JSON object";
    return entry;
  }
  entry.status = text_at(j, "status").empty() ? "corrupt" : text_at(j, "status");
  if (entry.status == "corrupt") entry.problem = "summary.json has no status";
  entry.started = text_at(j, "started");
  entry.task = text_at(j, "task");
  entry.model = text_at(j, "model");
  entry.dataset = text_at(j, "dataset");
  entry.device = text_at(j, "device");
  if (j.contains("epochs") && j["epochs"].is_number_integer())
    entry.epochs = j["epochs"].get<int64_t>();
  entry.test_accuracy = number_at(j, "/test/accuracy"_json_pointer);
  entry.test_loss = number_at(j, "/test/loss"_json_pointer);
  entry.final_loss = number_at(j, "/final_loss"_json_pointer);
  if (!entry.final_loss) entry.final_loss = number_at(j, "/train/loss"_json_pointer);
  entry.train_seconds = number_at(j, "/train_seconds"_json_pointer);
  // A finished run whose folder misses files (metrics lines, sample sheets) says so.
  if (j.contains("not_written") && j["not_written"].is_object() && !j["not_written"].empty()) {
    entry.problem = "not written:";
    for (const auto& [name, reason] : j["not_written"].items())
      entry.problem +=
          " " + name + (reason.is_string() ? " (" + reason.get<std::string>() + ")" : "") + ";";
    entry.problem.pop_back();
  }
  return entry;
}

bool is_run_folder(const std::string& folder) {
  std::error_code error;
  for (const char* file : {"config.toml", "metrics.jsonl", "summary.json"})
    if (fs::exists(fs::path(folder) / file, error)) return true;
  return false;
}

std::vector<RunEntry> list_runs(const std::string& root) {
  std::vector<RunEntry> out;
  std::error_code error;
  if (!fs::is_directory(root, error)) return out;
  std::vector<std::string> folders;
  // Only run folders: a run's own subfolders (plots), or unrelated folders, are not runs. A root
  // that cannot be listed must not read as "no runs".
  fs::directory_iterator items(root, error);
  if (error)
    throw DataError(root, "a folder of run folders this process may read",
                    "it cannot be read (" + error.message() + ")");
  for (fs::directory_iterator end; !error && items != end; items.increment(error)) {
    std::error_code not_a_folder;
    if (items->is_directory(not_a_folder) && is_run_folder(items->path().string()))
      folders.push_back(items->path().string());
  }
  std::sort(folders.begin(), folders.end());
  for (const auto& folder : folders) out.push_back(read_run(folder));
  return out;
}

}  // namespace spritetorch::runs
