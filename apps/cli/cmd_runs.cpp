// `spritetorch runs`: the run folders under runs/ (or --dir) as a table or JSON, with their main
// figures. Unfinished and damaged folders are listed as such (runs/run_list.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checks.h"
#include "commands.h"
#include "common/error.h"
#include "common/json_text.h"
#include "config_file.h"
#include "runs/run_list.h"

namespace spritetorch::cli {

namespace {

std::string figure(const std::optional<double>& v, int digits) {
  if (!v) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, *v);
  return buffer;
}

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

void print_table(std::ostream& out, const std::vector<runs::RunEntry>& entries) {
  std::vector<std::vector<std::string>> rows = {{"run", "started", "task", "model", "dataset",
                                                 "epochs", "test acc", "test loss", "loss",
                                                 "train s", "status"}};
  for (const auto& e : entries) {
    std::string started =
        e.started.size() >= 16 ? e.started.substr(0, 10) + " " + e.started.substr(11, 5) : "-";
    std::string status = e.status + (e.problem.empty() ? "" : ": " + e.problem);
    rows.push_back({e.name, started, e.task.empty() ? "-" : e.task, e.model.empty() ? "-" : e.model,
                    e.dataset.empty() ? "-" : e.dataset, std::to_string(e.epochs),
                    figure(e.test_accuracy, 4), figure(e.test_loss, 4), figure(e.final_loss, 4),
                    figure(e.train_seconds, 1), status});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c + 1 < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c)
      out << row[c] << (c + 1 < row.size() ? std::string(width[c] - row[c].size() + 2, ' ') : "\n");
  }
}

}  // namespace

Subcommand add_runs_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "runs", "List the training runs kept in run folders, with their main figures");
  struct Flags {
    std::string dir = "runs";
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  mirror_environment(
      sub->add_option("--dir", f->dir, "Folder holding the run folders (train --runs-root)")
          ->capture_default_str()
          ->check(kPath),
      "SPRITETORCH_RUNS_ROOT");
  sub->add_flag("--json", f->json, "Print a JSON array, one object per run");
  return {sub, [sub, f]() {
            std::error_code ec;
            // A folder named on purpose (flag or variable) that is not there is a typo, not an
            // empty list; the default folder is absent until the first run.
            if (sub->count("--dir") > 0 && !std::filesystem::exists(f->dir, ec))
              throw DataError(f->dir, "a folder of run folders (--dir)", "no such folder",
                              "train --runs-root FOLDER keeps its run folders there");
            if (std::filesystem::exists(f->dir, ec) && !std::filesystem::is_directory(f->dir, ec))
              throw DataError(f->dir, "a folder of run folders (--dir)", "a file");
            if (runs::is_run_folder(f->dir))
              throw DataError(f->dir, "a folder of run folders (--dir)", "a run folder itself",
                              "spritetorch runs --dir " +
                                  std::filesystem::absolute(f->dir).parent_path().string());
            const auto entries = runs::list_runs(f->dir);
            if (f->json) {
              nlohmann::json out = nlohmann::json::array();
              for (const auto& e : entries)
                out.push_back({{"name", e.name},
                               {"path", e.path},
                               {"status", e.status},
                               {"problem", e.problem},
                               {"started", e.started},
                               {"task", e.task},
                               {"model", e.model},
                               {"dataset", e.dataset},
                               {"device", e.device},
                               {"epochs", e.epochs},
                               {"test_accuracy", optional_json(e.test_accuracy)},
                               {"test_loss", optional_json(e.test_loss)},
                               {"loss", optional_json(e.final_loss)},
                               {"train_seconds", optional_json(e.train_seconds)}});
              std::cout << json_text(out) << "\n";
              return 0;
            }
            if (entries.empty()) {
              std::cout << "No runs in " << f->dir
                        << (std::filesystem::exists(f->dir, ec) ? "" : ": no such folder")
                        << " (spritetorch train keeps one folder per run there)\n";
              return 0;
            }
            print_table(std::cout, entries);
            return 0;
          }};
}

}  // namespace spritetorch::cli
