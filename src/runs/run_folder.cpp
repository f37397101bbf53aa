#include "runs/run_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/json_text.h"
#include "io/png.h"
#include "runs/gnuplot.h"

namespace spritetorch::runs {

namespace {

namespace fs = std::filesystem;

// Folder-name safe: letters, digits, '.', '_' and '-'; anything else becomes '_'.
// At most 64 bytes: a folder name must fit in 255 with the stamp and the task.
std::string name_part(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 64))
    out +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return out.empty() ? "run" : out;
}

// JSON has no NaN or infinity: null instead.
nlohmann::json finite(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

std::string summary_checkpoint(const std::string& folder, const std::string& checkpoint) {
  if (checkpoint.empty()) return {};
  const auto relative = fs::path(checkpoint).lexically_proximate(folder);
  // Inside the folder: relative, so the folder can move; elsewhere: as given.
  return !relative.empty() && relative.begin()->string() != ".." ? relative.string() : checkpoint;
}

// gnuplot exits 0 on a full disk and leaves a cut PNG: a whole one ends with the IEND chunk.
bool whole_png(const std::string& path) {
  static const unsigned char kIend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() < 8 + 25 + 12) return false;  // signature, IHDR, IEND at least
  unsigned char tail[12];
  in.seekg(-12, std::ios::end);
  in.read(reinterpret_cast<char*>(tail), sizeof tail);
  return in && std::memcmp(tail, kIend, sizeof tail) == 0;
}

}  // namespace

std::string iso_time(std::time_t when) {
  std::tm local{};
  localtime_r(&when, &local);
  char buffer[40];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S%z", &local);
  return buffer;
}

std::string create_run_folder(const std::string& root, const std::string& task,
                              const std::string& model, std::time_t now) {
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d-%H%M%S", &local);
  const std::string base = std::string(stamp) + "-" + name_part(task) + "-" + name_part(model);
  std::error_code error;
  fs::create_directories(root, error);
  if (error || !fs::is_directory(root))
    throw Error("cannot create the runs folder " + root + ": " + error.message(),
                "choose another with --runs-root DIR (or SPRITETORCH_RUNS_ROOT), or --no-run-dir");
  for (int attempt = 1; attempt < 1000; ++attempt) {
    const fs::path folder =
        fs::path(root) / (attempt == 1 ? base : base + "-" + std::to_string(attempt));
    // create_directory is atomic: false when the name exists (another run, same second).
    if (fs::create_directory(folder, error)) return folder.string();
    if (error) throw Error("cannot create run folder " + folder.string() + ": " + error.message());
  }
  throw Error("too many runs named " + base + " in " + root);
}

bool claim_run_folder(const std::string& folder) {
  std::error_code error;
  bool made = false;
  if (fs::exists(folder, error)) {
    if (!fs::is_directory(folder))
      throw Error("--run-dir " + folder + " exists and is not a folder");
    if (!fs::is_empty(folder))
      throw Error(
          "--run-dir " + folder + " exists and is not empty: refusing to mix two runs",
          "give a new folder, or leave out --run-dir for a fresh runs/<date>-<time>-... folder");
  } else {
    fs::path path(folder);
    if (!path.has_filename()) path = path.parent_path();  // "runs/a/": the folder is "runs/a"
    if (path.has_parent_path()) fs::create_directories(path.parent_path(), error);
    // create_directory is atomic: of two runs starting at once, one makes the folder.
    if (!error) made = fs::create_directory(path, error);
    if (error) throw Error("cannot create --run-dir " + folder + ": " + error.message());
  }
  // The claim itself: metrics.jsonl made with O_EXCL. Two runs given the same empty folder at once
  // both saw it empty; only one makes the file, and the other leaves the folder to it untouched
  // (removing "its" config.toml on the way out would remove the winner's).
  const std::string metrics = (fs::path(folder) / "metrics.jsonl").string();
  const int fd = ::open(metrics.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST)
    throw Error("--run-dir " + folder + " was taken by another run starting at the same time",
                "give each run its own folder, or leave out --run-dir");
  if (fd < 0) throw Error("cannot write " + metrics + ": " + std::strerror(errno));
  ::close(fd);
  return made;
}

RunRecorder::RunRecorder(std::string folder, RunIdentity identity, const std::string& config_toml)
    : folder_(std::move(folder)),
      identity_(std::move(identity)),
      start_(std::chrono::steady_clock::now()),
      started_(iso_time(std::time(nullptr))) {
  rewrite_config(config_toml);
  metrics_ = ::open(file("metrics.jsonl").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (metrics_ < 0)
    throw Error("cannot write " + file("metrics.jsonl") + ": " + std::strerror(errno));
}

RunRecorder::~RunRecorder() {
  if (metrics_ >= 0) ::close(metrics_);
}

void RunRecorder::rewrite_config(const std::string& config_toml) {
  // Atomic: a config.toml cut short would be read back by --config with defaults for the rest.
  write_file_atomically(file("config.toml"), config_toml);
}

void RunRecorder::lost(const std::string& name, const std::string& reason) {
  const bool first = not_written_.empty();
  // One note for the sheets: a full disk would fail every epoch's.
  const bool sheet = name.rfind("samples/", 0) == 0;
  bool said = false;
  for (const auto& [earlier, why] : not_written_)
    said = said || (sheet && earlier.rfind("samples/", 0) == 0);
  not_written_[name] = reason;
  if (note_ && !said)
    note_("cannot write " + file(name) + ": " + reason +
          (first ? "; training goes on, and summary.json lists what is missing" : ""));
}

void RunRecorder::discard(bool remove_folder) {
  if (metrics_ >= 0) ::close(metrics_);
  metrics_ = -1;
  std::error_code ignored;  // best effort: this runs while another error is on its way out
  fs::remove(file("metrics.jsonl"), ignored);
  fs::remove(file("config.toml"), ignored);
  if (remove_folder) fs::remove(folder_, ignored);  // only if empty
}

std::string RunRecorder::file(const std::string& name) const {
  return (fs::path(folder_) / name).string();
}

double RunRecorder::wall_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void RunRecorder::write_line(nlohmann::json line) {
  line["wall_s"] = std::round(wall_seconds() * 1000.0) / 1000.0;
  // After a failed write the file stays the lines before it: later ones are counted, not written
  // after a gap.
  if (metrics_lost_ > 0 || metrics_ < 0) {
    ++metrics_lost_;
    not_written_["metrics.jsonl"] = metrics_reason_ + ": " + std::to_string(metrics_lost_) +
                                    " lines lost from step " + std::to_string(metrics_lost_from_);
    return;
  }
  // One line per event, written at once: `tail -f metrics.jsonl` follows a run, and a killed run
  // keeps every line it reached.
  const std::string text = json_text(line) + "\n";
  // No half line: `runs` would count it damaged, and the next writer would append to it.
  if (const int error = append_whole(metrics_, text, metrics_bytes_)) {
    metrics_reason_ = std::strerror(error);
    metrics_lost_from_ = line.value("step", int64_t{0});
    lost("metrics.jsonl", metrics_reason_ + "; the lines from step " +
                              std::to_string(metrics_lost_from_) + " on are lost");
    metrics_lost_ = 1;
    not_written_["metrics.jsonl"] =
        metrics_reason_ + ": 1 line lost from step " + std::to_string(metrics_lost_from_);
    return;
  }
  metrics_bytes_ += static_cast<int64_t>(text.size());
}

void RunRecorder::on_start(const std::string& device, const train::Settings& settings) {
  device_ = device;
  settings_ = settings;
  nlohmann::json settings_json = nlohmann::json::object();
  for (const auto& [key, value] : settings) settings_json[key] = value;
  write_line({{"kind", "start"},
              {"schema", kMetricsSchema},
              {"step", 0},
              {"epoch", 0},
              {"time", started_},
              {"task", identity_.task},
              {"model", identity_.model},
              {"dataset", identity_.dataset},
              {"device", device},
              {"values", nlohmann::json::object()},
              {"settings", settings_json}});
}

void RunRecorder::record_failure(const std::string& error, const std::string& hint) {
  if (!started()) return;
  nlohmann::json line{{"kind", "failed"},
                      {"step", global_step_},
                      {"epoch", epoch_},
                      {"values", nlohmann::json::object()},
                      {"error", error}};
  if (!hint.empty()) line["hint"] = hint;
  write_line(std::move(line));
}

void RunRecorder::on_log(const train::StepLog& log) {
  write_line({{"kind", "log"},
              {"step", log.global_step},
              {"epoch", log.epoch},
              {"epoch_step", log.step},
              {"steps_per_epoch", log.steps},
              {"values", {{"loss", finite(log.running_loss)}, {"lr", log.lr}}}});
  if (log.steps > 0)
    curves_.logs.push_back({static_cast<double>(log.epoch - 1) +
                                static_cast<double>(log.step) / static_cast<double>(log.steps),
                            log.running_loss});
}

void RunRecorder::on_epoch(const train::EpochReport& r) {
  global_step_ = r.global_step;  // a resumed epoch may have had no step in this process
  nlohmann::json values = {{"loss", finite(r.loss)},
                           {"seconds", r.seconds},
                           {"images_per_second", finite(r.images_per_second)},
                           {"samples", r.samples}};
  if (r.has_accuracy) values["accuracy"] = finite(r.accuracy);  // a generator has none to give
  write_line({{"kind", "epoch"}, {"step", global_step_}, {"epoch", r.epoch}, {"values", values}});
  // A run stopped within the epoch reports the evaluation it stopped at, which on_eval wrote.
  const bool evaluated_here = last_eval_step_ == global_step_;
  if (r.has_test && !evaluated_here) {
    write_eval_line(
        r.test_loss, r.has_accuracy, r.test_accuracy,
        {{"kind", "eval"}, {"split", "test"}, {"step", global_step_}, {"epoch", r.epoch}});
    curves_.tests.push_back({static_cast<double>(r.epoch), r.test_loss, r.test_accuracy});
  }
  curves_.epochs.push_back({r.epoch, r.loss, r.accuracy, r.has_test, r.test_loss, r.test_accuracy});
}

void RunRecorder::on_eval(const train::EvalPoint& point, const train::StepTick& at) {
  last_eval_step_ = global_step_;
  write_eval_line(point.loss, point.has_accuracy, point.accuracy,
                  {{"kind", "eval"},
                   {"split", "test"},
                   {"step", global_step_},
                   {"epoch", at.epoch},
                   {"epoch_step", at.step},
                   {"steps_per_epoch", at.steps}});
  curves_.tests.push_back({point.epoch, point.loss, point.accuracy});
}

void RunRecorder::write_eval_line(double loss, bool has_accuracy, double accuracy,
                                  nlohmann::json line) {
  nlohmann::json values = {{"loss", finite(loss)}};
  if (has_accuracy) values["accuracy"] = finite(accuracy);  // a generator has none to give
  line["values"] = std::move(values);
  write_line(std::move(line));
}

void RunRecorder::on_samples(int64_t epoch, const torch::Tensor& sprites, int64_t per_class) {
  char name[40];
  std::snprintf(name, sizeof name, "samples/epoch-%03lld.png", static_cast<long long>(epoch));
  // A sheet is an extra: written whole (atomically) or not at all, and never the run's end.
  try {
    std::error_code error;
    fs::create_directories(file("samples"), error);
    if (error) throw Error("cannot write " + file(name) + ": " + error.message());
    io::write_png(file(name), io::make_sample_sheet(sprites, per_class));
  } catch (const Error& e) {
    const std::string what = e.what(), prefix = "cannot write " + file(name) + ": ";
    lost(name, what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what);
    return;
  }
  sample_sheets_.push_back(name);
  write_line({{"kind", "samples"},
              {"step", global_step_},
              {"epoch", epoch},
              {"path", name},
              {"values", {{"count", sprites.size(0)}, {"per_class", per_class}}}});
}

void RunRecorder::draw(const std::vector<PlotScript>& scripts, const char* gnuplot_path,
                       Finished& finished) {
  std::vector<PlotScript> todo;
  for (const auto& s : scripts)
    if (!s.script.empty()) todo.push_back(s);
  if (todo.empty()) return;
  const auto gnuplot = find_gnuplot(gnuplot_path);
  if (!gnuplot) {
    std::string names;
    for (const auto& s : todo) names += (names.empty() ? "" : ", ") + s.picture;
    finished.notices.push_back("gnuplot not found: skipping " + names +
                               " (apt-get install gnuplot-nox; then `cd " + folder_ +
                               " && gnuplot plots/*.gp` draws them from the data kept in plots/)");
    return;
  }
  // Each script logs beside itself (plots/curves.gp -> plots/curves.log): they run at once. Each
  // picture is drawn under a hidden name and renamed when whole: a run killed while gnuplot draws
  // leaves no empty curves.png to pass for a picture.
  std::vector<GnuplotJob> jobs;
  const auto drawing_name = [](const std::string& picture) {
    const fs::path path(picture);
    return (path.parent_path() / ("." + path.filename().string() + ".drawing")).string();
  };
  for (const auto& s : todo)
    jobs.push_back(
        {s.script, s.script.substr(0, s.script.rfind('.')) + ".log", drawing_name(s.picture)});
  const auto results = run_gnuplots(*gnuplot, jobs, folder_);
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto& s = todo[i];
    const auto& result = results[i];
    const std::string drawn = file(jobs[i].picture);
    std::error_code error;
    if (result.ok && whole_png(drawn)) {
      fs::rename(drawn, file(s.picture), error);
      if (!error) {
        finished.pictures[s.picture.substr(0, s.picture.rfind('.'))] = s.picture;
        continue;
      }
      finished.notices.push_back("skipping " + s.picture + ": " + error.message());
    } else if (result.ok && fs::exists(drawn, error)) {
      // a cut picture must not pass for the whole one
      finished.notices.push_back("skipping " + s.picture +
                                 ": gnuplot left it incomplete (is the disk full?); removed it");
    } else {
      // A gnuplot stopped at its time limit may have left part of the picture.
      finished.notices.push_back("skipping " + s.picture + ": " +
                                 (result.ok ? "gnuplot wrote no picture" : result.message));
    }
    fs::remove(drawn, error);
  }
}

nlohmann::json RunRecorder::summary_base(const std::string& checkpoint,
                                         const Finished& finished) const {
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [key, value] : settings_) settings[key] = value;
  nlohmann::json pictures = nlohmann::json::object();
  for (const auto& [name, path] : finished.pictures) pictures[name] = path;
  return {{"schema", kMetricsSchema},
          {"status", "complete"},
          {"task", identity_.task},
          {"model", identity_.model},
          {"dataset", identity_.dataset},
          {"device", device_},
          {"started", started_},
          {"finished", iso_time(std::time(nullptr))},
          {"wall_s", wall_seconds()},
          {"settings", settings},
          {"pictures", pictures},
          {"checkpoint", summary_checkpoint(folder_, checkpoint)},
          {"config", "config.toml"},
          {"metrics", "metrics.jsonl"},
          {"spritetorch_version", SPRITETORCH_VERSION}};
}

void RunRecorder::write_summary(const nlohmann::json& summary) {
  // Atomic: `runs` never sees half a summary (its presence marks a finished run).
  write_file_atomically(file("summary.json"), json_text(summary, 2) + "\n");
}

RunRecorder::Finished RunRecorder::finish(const train::TrainReport& report,
                                          const std::string& checkpoint, const char* gnuplot_path) {
  Finished finished;
  const int64_t epochs = report.start_epoch + static_cast<int64_t>(report.epochs.size());
  curves_.accuracy = report.has_accuracy;
  const bool classes = report.has_accuracy && report.has_test;  // a confusion matrix to draw
  nlohmann::json summary = summary_base(checkpoint, finished);
  summary["task"] = report.task;
  summary["epochs"] = epochs;
  summary["steps"] = report.steps;
  summary["train_seconds"] = report.train_seconds;
  summary["eval_seconds"] = report.eval_seconds;
  if (report.budget) summary["time_budget"] = train::budget_json(*report.budget);
  if (report.peak_memory.bytes >= 0)
    summary["peak_memory"] = train::peak_memory_json(report.peak_memory);
  if (!report.thread_changes.empty())
    summary["thread_changes"] = train::thread_changes_json(report.thread_changes);
  nlohmann::json end_values = {{"train_seconds", report.train_seconds}};
  if (report.has_test) {
    summary["test"] = {{"loss", finite(report.test.loss)}, {"samples", report.test.samples}};
    end_values["test_loss"] = finite(report.test.loss);
  }
  if (classes) {
    nlohmann::json per_class = nlohmann::json::object();
    for (size_t k = 0; k < report.class_names.size() && k < report.test.per_class_accuracy.size();
         ++k)
      per_class[report.class_names[k]] = finite(report.test.per_class_accuracy[k]);
    summary["test"]["accuracy"] = finite(report.test.accuracy);
    summary["test"]["per_class_accuracy"] = per_class;
    summary["test"]["misclassified"] = report.misclassified.total;
    end_values["test_accuracy"] = finite(report.test.accuracy);
  }
  if (!report.epochs.empty()) {
    summary["train"] = {{"loss", finite(report.epochs.back().loss)}};
    if (report.has_accuracy) summary["train"]["accuracy"] = finite(report.epochs.back().accuracy);
    if (!report.has_accuracy) {
      summary["final_loss"] = finite(report.epochs.back().loss);
      end_values["loss"] = finite(report.epochs.back().loss);
    }
  }
  if (!sample_sheets_.empty()) {
    summary["sample_seconds"] = report.sample_seconds;
    summary["samples"] = sample_sheets_;
    summary["pictures"]["samples"] = sample_sheets_.back();
  }
  write_line({{"kind", "end"}, {"step", report.steps}, {"epoch", epochs}, {"values", end_values}});
  // What the folder misses (after the end line, which may be among it): `runs` shows it.
  if (!not_written_.empty()) {
    summary["not_written"] = nlohmann::json::object();
    for (const auto& [name, reason] : not_written_) summary["not_written"][name] = reason;
  }
  // Written before the pictures, which gnuplot may take a minute to draw: a run killed meanwhile
  // is complete with its checkpoint, and lists no pictures. Rewritten with them once drawn.
  write_summary(summary);

  std::string why_not;
  // The pictures are extras: a disk that fills up or a folder that goes away now is a note, not a
  // failure of a run whose summary.json is already written.
  try {
    std::vector<PlotScript> scripts = {
        write_curves_plot(folder_, curves_, fs::path(folder_).filename().string())};
    if (classes) {
      const auto misclassified =
          write_misclassified_plot(folder_, report.misclassified, report.class_names, &why_not);
      scripts.push_back(write_confusion_plot(folder_, report.test.confusion, report.class_names));
      scripts.push_back(misclassified);
      if (misclassified.script.empty())
        why_not = "no misclassified.png: " + why_not;
      else
        why_not.clear();
    }
    draw(scripts, gnuplot_path, finished);
  } catch (const Error& e) {
    why_not = std::string("the pictures were not drawn: ") + e.what();
  }
  if (!why_not.empty()) finished.notices.push_back(why_not);

  for (const auto& [name, path] : finished.pictures) summary["pictures"][name] = path;
  summary["finished"] = iso_time(std::time(nullptr));
  summary["wall_s"] = wall_seconds();
  if (!finished.pictures.empty()) {
    try {
      write_summary(summary);
    } catch (const Error& e) {  // the summary written above stands: the run is complete
      finished.notices.push_back(std::string("summary.json does not name the pictures: ") +
                                 e.what());
    }
  }
  drawn_ = finished;
  return finished;
}

}  // namespace spritetorch::runs
