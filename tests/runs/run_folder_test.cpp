// Run folders end to end: a tiny real training run recorded into one (files, metrics.jsonl schema,
// summary.json, pictures when gnuplot is there, a notice when it is not), generator sample sheets,
// folder naming and claiming, gnuplot quoting, and `runs` listing damaged folders.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "diffusion/generator.h"
#include "io/png.h"
#include "runs/gnuplot.h"
#include "runs/observer_list.h"
#include "runs/plots.h"
#include "runs/run_folder.h"
#include "runs/run_list.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/run_state.h"
#include "train/trainer.h"

namespace spritetorch::runs {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

std::vector<nlohmann::json> metrics_lines(const std::string& folder) {
  std::ifstream in(folder + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line))
    lines.push_back(nlohmann::json::parse(line));  // throws if not JSON
  return lines;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// 2 epochs of the sprite CNN on 240 procedural sprites: seconds on the CPU, and real images.
train::TrainConfig tiny_sprite_run(const std::string& folder) {
  train::TrainConfig config;
  config.device = "cpu";
  config.dataset = "sprites";
  config.sprites.count = 240;
  config.sprites.holdout = 0.25;
  config.epochs = 2;
  config.batch_size = 32;
  config.log_every = 2;
  config.save = folder + "/checkpoint.pt";
  return config;
}

struct RecordedRun {
  train::TrainReport report;
  RunRecorder::Finished finished;
};

RecordedRun record(const std::string& folder, const char* gnuplot_path) {
  claim_run_folder(folder);
  auto config = tiny_sprite_run(folder);
  RunRecorder recorder(folder, {"classify", "cnn", "sprites"}, "epochs = 2\n");
  ObserverList observers({&recorder, nullptr});
  RecordedRun run;
  run.report = run_training(config, &observers);
  run.finished = recorder.finish(run.report, config.save, gnuplot_path);
  return run;
}

TEST(RunFolder, ATinyRunKeepsConfigMetricsSummaryCheckpointAndPictures) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  const auto run = record(folder, nullptr);
  for (const char* name : {"config.toml", "metrics.jsonl", "summary.json", "checkpoint.pt"})
    EXPECT_TRUE(fs::exists(folder + "/" + name)) << name;
  EXPECT_FALSE(fs::exists(folder + "/summary.json.partial"));

  // metrics.jsonl: every line an object with the required keys; each kind where it belongs.
  const auto lines = metrics_lines(folder);
  std::map<std::string, int> kinds;
  int64_t last_step = -1;
  for (const auto& line : lines) {
    for (const char* key : {"kind", "step", "epoch", "wall_s", "values"})
      ASSERT_TRUE(line.contains(key)) << line;
    EXPECT_TRUE(line["values"].is_object()) << line;
    EXPECT_GE(line["step"].get<int64_t>(), last_step) << "steps never go back: " << line;
    last_step = line["step"].get<int64_t>();
    ++kinds[line["kind"].get<std::string>()];
  }
  const int64_t steps_per_epoch = (180 + 31) / 32;  // 240 sprites, 25% held out, batch 32: 6 steps
  EXPECT_EQ(lines.front()["kind"], "start");
  EXPECT_EQ(lines.front()["settings"]["device"], run.report.device);
  EXPECT_EQ(kinds["log"], 2 * (steps_per_epoch / 2));
  EXPECT_EQ(kinds["epoch"], 2);
  EXPECT_EQ(kinds["eval"], 2);  // --eval-every 1: the test curve has a point per epoch
  EXPECT_EQ(lines.back()["kind"], "end");
  EXPECT_EQ(lines.back()["step"], 2 * steps_per_epoch);
  for (const auto& line : lines) {
    if (line["kind"] == "log") {
      EXPECT_TRUE(line["values"]["loss"].is_number()) << line;
      EXPECT_DOUBLE_EQ(line["values"]["lr"].get<double>(), 0.001) << line;  // the default, constant
    }
    if (line["kind"] == "epoch") {
      EXPECT_TRUE(line["values"]["loss"].is_number()) << line;
      EXPECT_TRUE(line["values"]["accuracy"].is_number()) << line;
    }
  }

  const auto summary = read_json(folder + "/summary.json");
  EXPECT_EQ(summary["status"], "complete");
  EXPECT_EQ(summary["epochs"], 2);
  EXPECT_EQ(summary["checkpoint"], "checkpoint.pt");  // relative: the folder can move
  EXPECT_DOUBLE_EQ(summary["test"]["accuracy"].get<double>(), run.report.test.accuracy);
  EXPECT_EQ(summary["test"]["samples"], 60);
  EXPECT_GT(summary["train_seconds"].get<double>(), 0.0);

  // The final evaluation's misclassified samples came with it (no second pass).
  ASSERT_TRUE(run.report.misclassified.inputs.defined());
  const int64_t wrong = 60 - run.report.test.confusion.diagonal().sum().item<int64_t>();
  EXPECT_EQ(run.report.misclassified.total, wrong);
  EXPECT_EQ(run.report.misclassified.inputs.size(0),
            std::min<int64_t>(wrong, train::kMisclassifiedKept));

  if (!find_gnuplot())
    GTEST_SKIP() << "gnuplot not installed (apt-get install gnuplot-nox): pictures not checked";
  EXPECT_TRUE(run.finished.notices.empty() || wrong == 0) << run.finished.notices.front();
  const auto curves = io::read_png(folder + "/curves.png");
  EXPECT_EQ(curves.size(0), 480);
  EXPECT_EQ(curves.size(1), 1280);
  const auto confusion = io::read_png(folder + "/confusion.png");
  EXPECT_EQ(confusion.size(0), 4 * 64 + 220);  // 4 classes, 64-pixel cells
  EXPECT_EQ(summary["pictures"]["curves"], "curves.png");
  EXPECT_EQ(summary["pictures"]["confusion"], "confusion.png");
  if (wrong > 0) {
    const auto grid = io::read_png(folder + "/misclassified.png");
    EXPECT_GT(grid.size(0), 112);
    EXPECT_EQ(summary["pictures"]["misclassified"], "misclassified.png");
  }
  // Drawn under hidden names and renamed: none is left; a redraw by hand writes the picture itself.
  for (const auto& entry : fs::directory_iterator(folder))
    EXPECT_EQ(entry.path().filename().string().find(".drawing"), std::string::npos) << entry.path();
  fs::remove(folder + "/curves.png");
  ASSERT_EQ(
      std::system(("cd '" + folder + "' && '" + *find_gnuplot() + "' plots/curves.gp").c_str()), 0);
  EXPECT_EQ(io::read_png(folder + "/curves.png").size(1), 1280);
}

// The data rows of a plots/*.dat file, each as its numbers.
std::vector<std::vector<double>> plot_rows(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    rows.emplace_back();
    for (double v = 0; fields >> v;) rows.back().push_back(v);
  }
  return rows;
}

std::vector<nlohmann::json> eval_lines(const std::string& folder) {
  std::vector<nlohmann::json> evals;
  for (const auto& line : metrics_lines(folder))
    if (line["kind"] == "eval") evals.push_back(line);
  return evals;
}

TEST(RunFolder, EvaluationsWithinEpochsAreEvalLinesAndTestCurvePoints) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  claim_run_folder(folder);
  auto config = tiny_sprite_run(folder);
  config.eval_every_steps = 2;  // 6 steps an epoch: steps 2 and 4 within each, 6 at its end
  RunRecorder recorder(folder, {"classify", "cnn", "sprites"}, "epochs = 2\n");
  const auto report = run_training(config, &recorder);
  recorder.finish(report, config.save, "/nonexistent-bin");

  const auto evals = eval_lines(folder);
  ASSERT_EQ(report.evals.size(), 6u);
  ASSERT_EQ(evals.size(), report.evals.size()) << "one eval line per evaluation, none twice";
  const std::vector<int64_t> steps = {2, 4, 6, 8, 10, 12};
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i]["step"], steps[i]) << evals[i];
    EXPECT_DOUBLE_EQ(evals[i]["values"]["accuracy"].get<double>(), report.evals[i].accuracy);
    const bool within = steps[i] % 6 != 0;
    EXPECT_EQ(evals[i].contains("epoch_step"), within) << evals[i];
    if (within) {
      EXPECT_EQ(evals[i]["epoch_step"], steps[i] % 6) << evals[i];
    }
    EXPECT_EQ(evals[i]["epoch"], (steps[i] - 1) / 6 + 1) << evals[i];
  }
  // The test curve has every evaluation, at its fractional epoch; the epoch rows stay per epoch.
  // (The data files keep 6 significant digits.)
  const auto tests = plot_rows(folder + "/plots/curves_tests.dat");
  ASSERT_EQ(tests.size(), 6u);
  for (size_t i = 0; i < tests.size(); ++i) {
    EXPECT_NEAR(tests[i][0], static_cast<double>(steps[i]) / 6.0, 1e-5);
    EXPECT_NEAR(tests[i][2], report.evals[i].accuracy, 1e-5);
  }
  EXPECT_EQ(plot_rows(folder + "/plots/curves_epochs.dat").size(), 2u);
  std::ifstream script(folder + "/plots/curves.gp");
  const std::string gp((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
  EXPECT_NE(gp.find("curves_tests.dat"), std::string::npos) << gp;
}

TEST(RunFolder, ATargetReachedWithinAnEpochIsItsOwnEvalLineOnce) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  claim_run_folder(folder);
  auto config = tiny_sprite_run(folder);
  config.eval_every_steps = 2;
  config.target_accuracy = 0.01;  // reached at the first evaluation: step 2 of epoch 1
  RunRecorder recorder(folder, {"classify", "cnn", "sprites"}, "epochs = 2\n");
  const auto report = run_training(config, &recorder);
  recorder.finish(report, config.save, "/nonexistent-bin");
  ASSERT_TRUE(report.stopped_at_target);
  ASSERT_EQ(report.target_reached->step, 2);

  const auto evals = eval_lines(folder);
  ASSERT_EQ(evals.size(), 1u) << "the epoch it stopped in reports the same evaluation";
  EXPECT_EQ(evals[0]["step"], 2);
  EXPECT_EQ(evals[0]["epoch_step"], 2);
  EXPECT_DOUBLE_EQ(evals[0]["values"]["accuracy"].get<double>(), report.target_reached->accuracy);
  const auto tests = plot_rows(folder + "/plots/curves_tests.dat");
  ASSERT_EQ(tests.size(), 1u);
  EXPECT_NEAR(tests[0][0], 2.0 / 6.0, 1e-5);
}

// The dummy data's MLP (4096 samples, 64 steps an epoch of 64): milliseconds an epoch.
train::TrainConfig dummy_run(const std::string& save) {
  train::TrainConfig config;
  config.device = "cpu";
  config.model = "simplenn";
  config.dataset = "dummy";
  config.optimizer = "sgd";
  config.lr = 0.1;
  config.log_every = 16;
  config.save = save;
  return config;
}

// `config` recorded into `folder`: its metrics.jsonl lines, after the summary's steps are checked
// against the report's.
std::vector<nlohmann::json> record_resumed(const std::string& folder,
                                           const train::TrainConfig& config) {
  claim_run_folder(folder);
  RunRecorder recorder(folder, {"classify", "simplenn", "dummy"}, "");
  const auto report = run_training(config, &recorder);
  recorder.finish(report, config.save, nullptr);
  EXPECT_EQ(read_json(folder + "/summary.json")["steps"], report.steps);
  return metrics_lines(folder);
}

// A resumed run's metrics.jsonl counts the run's steps as summary.json does (TrainReport::steps),
// whatever the checkpoint: one at an epoch's last step (that epoch's lines carry its global step,
// and its speed is 0 images/s: this process trained none of it), one mid-epoch (the epoch's speed
// is that of the samples trained since), and a final one resumed with another --batch-size.
TEST(RunFolder, AResumedRunRecordsTheRunsStepsAndItsOwnSpeed) {
  ScratchDir dir;
  train::TrainConfig first = dummy_run(dir.file("first.pt"));
  first.epochs = 2;
  first.checkpoint_every = 32;
  run_training(first);

  train::TrainConfig at_end = dummy_run(dir.file("a.pt"));
  at_end.epochs = 3;
  at_end.resume = train::periodic_checkpoint_path(first.save, 64);  // epoch 1's last step
  for (const auto& line : record_resumed(dir.file("a"), at_end)) {
    const std::string kind = line["kind"];
    int64_t step = -1;  // the line's global step, where it is known
    if (kind == "epoch" || kind == "eval") step = 64 * line["epoch"].get<int64_t>();
    if (kind == "log")
      step = 64 * (line["epoch"].get<int64_t>() - 1) + line["epoch_step"].get<int64_t>();
    if (kind == "end") step = 3 * 64;
    if (step >= 0) {
      EXPECT_EQ(line["step"], step) << line;
    }
    const bool resumed_epoch = kind == "epoch" && line["epoch"] == 1;
    if (resumed_epoch) {
      EXPECT_EQ(line["values"]["images_per_second"], 0) << line;
    }
  }

  train::TrainConfig within = dummy_run(dir.file("w.pt"));
  within.epochs = 2;
  within.resume = train::periodic_checkpoint_path(first.save, 96);  // halfway through epoch 2
  int epochs_seen = 0;
  for (const auto& line : record_resumed(dir.file("w"), within)) {
    if (line["kind"] != "epoch") continue;
    ++epochs_seen;
    const auto& values = line["values"];
    EXPECT_EQ(values["samples"], 4096) << line;  // the epoch's, the restored half included
    // This process's 32 steps of 64 samples over its seconds.
    EXPECT_NEAR(values["images_per_second"].get<double>() * values["seconds"].get<double>(),
                32 * 64, 1e-6 * 32 * 64)
        << line;
  }
  EXPECT_EQ(epochs_seen, 1);

  train::TrainConfig smaller = dummy_run(dir.file("s.pt"));
  smaller.epochs = 3;
  smaller.batch_size = 32;  // 128 steps an epoch from the third on
  smaller.resume = first.save;
  for (const auto& line : record_resumed(dir.file("s"), smaller)) {
    const std::string kind = line["kind"];
    if (kind == "log") {
      EXPECT_EQ(line["step"], 2 * 64 + line["epoch_step"].get<int64_t>()) << line;
    }
    if (kind == "epoch" || kind == "eval" || kind == "end") {
      EXPECT_EQ(line["step"], 2 * 64 + 128) << line;
    }
  }
}

TEST(RunFolder, WithoutGnuplotTheRunFinishesWithOneNotice) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  const auto run = record(folder, "/nonexistent-bin");
  ASSERT_GE(run.finished.notices.size(), 1u);
  EXPECT_NE(run.finished.notices[0].find("gnuplot not found: skipping curves.png, confusion.png"),
            std::string::npos)
      << run.finished.notices[0];
  EXPECT_NE(run.finished.notices[0].find("apt-get install gnuplot-nox"), std::string::npos);
  for (const auto& n : run.finished.notices) EXPECT_EQ(n.find("failed"), std::string::npos) << n;
  EXPECT_TRUE(run.finished.pictures.empty());
  EXPECT_FALSE(fs::exists(folder + "/curves.png"));
  EXPECT_TRUE(fs::exists(folder + "/plots/curves.gp"));  // drawable later
  EXPECT_EQ(read_json(folder + "/summary.json")["status"], "complete");
}

TEST(RunFolder, GeneratorRunsKeepASampleSheetPerEpoch) {
  ScratchDir dir;
  const std::string folder = dir.file("gen");
  claim_run_folder(folder);
  auto config = tiny_sprite_run(folder);
  config.task = train::TaskKind::kGenerate;
  config.unet_base = 8;
  config.batch_size = 16;
  config.sample_every = 1;
  RunRecorder recorder(folder, {"generate", "unet", "sprites"}, "");
  const auto report = run_training(config, &recorder);
  recorder.finish(report, config.save, "/nonexistent-bin");
  for (const char* sheet : {"samples/epoch-001.png", "samples/epoch-002.png"}) {
    ASSERT_TRUE(fs::exists(folder + "/" + sheet)) << sheet;
    const auto png = io::read_png(folder + "/" + sheet);
    // 4 classes x 8 sprites of 16 px, 1 px padding, scaled x4.
    EXPECT_EQ(png.size(0), (4 * 17 + 1) * 4);
    EXPECT_EQ(png.size(1), (8 * 17 + 1) * 4);
  }
  const auto summary = read_json(folder + "/summary.json");
  EXPECT_EQ(summary["samples"].size(), 2u);
  EXPECT_EQ(summary["pictures"]["samples"], "samples/epoch-002.png");
  EXPECT_TRUE(fs::exists(folder + "/checkpoint.pt"));
  std::set<std::string> kinds;
  for (const auto& line : metrics_lines(folder)) {
    kinds.insert(line["kind"].get<std::string>());
    // Epoch and test lines: a loss, and no accuracy (there are no classes to be right about).
    if (line["kind"] == "epoch" || line["kind"] == "eval") {
      EXPECT_TRUE(line["values"]["loss"].is_number()) << line;
      EXPECT_FALSE(line["values"].contains("accuracy")) << line;
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"start", "log", "epoch", "eval", "samples", "end"}));
  EXPECT_TRUE(summary["test"]["loss"].is_number());  // the held-out denoising loss
  EXPECT_FALSE(summary["test"].contains("accuracy"));
}

// The folder's extras on a full disk: a metrics.jsonl that is /dev/full (every write fails with
// ENOSPC) is one note naming it and the reason; training, the checkpoint and summary.json go on,
// and summary.json and `runs` say what was lost.
TEST(RunFolder, MetricsThatCannotBeWrittenAreOneNoteAndTheSummarySaysSo) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  claim_run_folder(folder);
  fs::remove(folder + "/metrics.jsonl");  // the claim's
  fs::create_symlink("/dev/full", folder + "/metrics.jsonl");
  auto config = tiny_sprite_run(folder);
  RunRecorder recorder(folder, {"classify", "cnn", "sprites"}, "epochs = 2\n");
  std::vector<std::string> notes;
  recorder.set_note([&](const std::string& line) { notes.push_back(line); });
  const auto report = run_training(config, &recorder);
  recorder.finish(report, config.save, "/nonexistent-bin");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("cannot write " + folder + "/metrics.jsonl: No space left on device"),
            std::string::npos)
      << notes[0];
  EXPECT_TRUE(fs::exists(config.save));
  const auto summary = read_json(folder + "/summary.json");
  EXPECT_EQ(summary["status"], "complete");
  const std::string lost = summary["not_written"]["metrics.jsonl"].get<std::string>();
  // start, 2 x 3 log lines, 2 x (epoch, eval), end: every one lost, from the first step.
  EXPECT_EQ(lost, "No space left on device: 12 lines lost from step 0");
  const RunEntry entry = read_run(folder);
  EXPECT_EQ(entry.status, "complete");
  EXPECT_NE(entry.problem.find("not written: metrics.jsonl (No space left on device"),
            std::string::npos)
      << entry.problem;
}

// A run that diverges has no summary.json; its metrics.jsonl's last line says why, and `runs` lists
// it as failed with that error instead of "still running, interrupted or failed".
TEST(RunFolder, ARunThatFailedSaysWhyInItsMetricsAndRunsListsItAsFailed) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  claim_run_folder(folder);
  auto config = tiny_sprite_run(folder);
  config.optimizer = "sgd";
  config.lr = 1e30;
  RunRecorder recorder(folder, {"classify", "cnn", "sprites"}, "epochs = 2\n");
  try {
    run_training(config, &recorder);
    FAIL() << "a run at lr 1e30 trained";
  } catch (const Error& e) {
    recorder.record_failure(e.what(), e.hint());
  }
  const auto lines = metrics_lines(folder);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["kind"], "failed");
  const std::string error = lines.back()["error"].get<std::string>();
  EXPECT_EQ(error.rfind("training diverged: ", 0), 0u) << error;
  EXPECT_NE(lines.back()["hint"].get<std::string>().find("lower --lr"), std::string::npos);
  EXPECT_FALSE(fs::exists(folder + "/summary.json"));
  const RunEntry entry = read_run(folder);
  EXPECT_EQ(entry.status, "failed");
  EXPECT_EQ(entry.problem, error);

  // A recorder whose run never started writes nothing: the folder is discarded instead.
  const std::string unstarted = dir.file("unstarted");
  claim_run_folder(unstarted);
  RunRecorder never(unstarted, {"classify", "cnn", "sprites"}, "epochs = 2\n");
  never.record_failure("bad flags", "");
  EXPECT_TRUE(metrics_lines(unstarted).empty());
}

// A sample sheet that cannot be written (here samples/ is a file, so no sheet has a folder) is a
// note, once for the run, and the generator trains on; the summary lists every sheet missing.
// A generator of more classes than a sheet holds (64) draws 64 of them spread evenly, one each,
// laid out 8 a row: a sheet of 500 classes was one column 34,000 pixels tall.
TEST(RunFolder, AGeneratorOfManyClassesKeepsItsSheetTo64SpritesEightARow) {
  struct Sheets : train::TrainObserver {
    std::vector<torch::Tensor> sprites;
    std::vector<int64_t> per_class;
    void on_samples(int64_t, const torch::Tensor& s, int64_t p) override {
      sprites.push_back(s);
      per_class.push_back(p);
    }
  } sheets;
  train::TrainConfig config;
  config.device = "cpu";
  config.task = train::TaskKind::kGenerate;
  config.unet_base = 8;
  config.epochs = 1;
  config.batch_size = 100;
  config.sample_every = 1;
  const int64_t classes = 100;
  train::Datasets data;
  torch::manual_seed(3);
  data.train.inputs = torch::randint(256, {classes, 4, 16, 16}, torch::kUInt8);
  data.train.labels = torch::arange(classes, torch::kInt64);
  for (int64_t k = 0; k < classes; ++k) data.train.class_names.push_back("c" + std::to_string(k));
  run_training(config, data, &sheets);
  ASSERT_EQ(sheets.sprites.size(), 1u);
  EXPECT_EQ(sheets.sprites[0].size(0), 64);
  EXPECT_EQ(sheets.per_class[0], 1);
  const auto sheet = io::make_sample_sheet(sheets.sprites[0], sheets.per_class[0]);
  EXPECT_EQ(sheet.size(1), (8 * 17 + 1) * 4);  // 8 columns of 16-pixel sprites, scaled x4
  EXPECT_EQ(sheet.size(0), (8 * 17 + 1) * 4);
}

// The confusion picture of many classes stays a bounded script: no count per cell past 30 classes
// (500 classes wrote 250,000 labels, 13.6 MB, more than gnuplot's minute), every n-th class named.
TEST(RunFolder, TheConfusionScriptOfManyClassesStaysSmall) {
  ScratchDir dir;
  const int64_t k = 500;
  const auto confusion = torch::eye(k, torch::kInt64) * 2;
  std::vector<std::string> names;
  for (int64_t i = 0; i < k; ++i) names.push_back("class" + std::to_string(i));
  const auto script = write_confusion_plot(dir.path().string(), confusion, names);
  std::ifstream in(dir.path().string() + "/" + script.script);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  EXPECT_LT(text.size(), 20000u);
  EXPECT_EQ(text.find("set label"), std::string::npos);
  EXPECT_NE(text.find("'class480' 480"), std::string::npos);  // every 16th class named
  EXPECT_EQ(text.find("'class481'"), std::string::npos);
  // A few classes keep their counts.
  const auto few = write_confusion_plot(dir.file("few"), torch::eye(4, torch::kInt64), names);
  std::ifstream in_few(dir.file("few") + "/" + few.script);
  const std::string few_text(std::istreambuf_iterator<char>(in_few), {});
  EXPECT_NE(few_text.find("set label '1' at 0,0"), std::string::npos) << few_text;
}

TEST(RunFolder, SampleSheetsThatCannotBeWrittenAreANoteAndTrainingGoesOn) {
  ScratchDir dir;
  const std::string folder = dir.file("gen");
  claim_run_folder(folder);
  std::ofstream(folder + "/samples") << "in the way";
  auto config = tiny_sprite_run(folder);
  config.task = train::TaskKind::kGenerate;
  config.unet_base = 8;
  config.batch_size = 16;
  config.sample_every = 1;
  RunRecorder recorder(folder, {"generate", "unet", "sprites"}, "");
  std::vector<std::string> notes;
  recorder.set_note([&](const std::string& line) { notes.push_back(line); });
  const auto report = run_training(config, &recorder);
  recorder.finish(report, config.save, "/nonexistent-bin");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("cannot write " + folder + "/samples/epoch-001.png: "), std::string::npos)
      << notes[0];
  EXPECT_TRUE(fs::exists(config.save));
  EXPECT_EQ(report.epochs.size(), 2u);
  const auto summary = read_json(folder + "/summary.json");
  EXPECT_FALSE(summary.contains("samples"));
  EXPECT_FALSE(summary["pictures"].contains("samples"));
  EXPECT_TRUE(summary["not_written"].contains("samples/epoch-001.png"));
  EXPECT_TRUE(summary["not_written"].contains("samples/epoch-002.png"));
  for (const auto& line : metrics_lines(folder)) EXPECT_NE(line["kind"], "samples") << line;
}

// summary.json that cannot be written: an Error naming it (not its temporary) and the reason, and
// no file of it left behind.
TEST(RunFolder, ASummaryThatCannotBeWrittenNamesItselfAndLeavesNoPartialFile) {
  ScratchDir dir;
  const std::string folder = dir.file("run");
  claim_run_folder(folder);
  auto config = tiny_sprite_run(folder);
  config.epochs = 1;
  RunRecorder recorder(folder, {"classify", "cnn", "sprites"}, "");
  const auto report = run_training(config, &recorder);
  // write_file_atomically's temporary, made a link to /dev/full: the write fails with ENOSPC.
  fs::create_symlink("/dev/full", folder + "/.summary.json.tmp-" + std::to_string(::getpid()));
  try {
    recorder.finish(report, config.save, "/nonexistent-bin");
    FAIL() << "summary.json was written";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot write " + folder + "/summary.json: No space left on device");
  }
  for (const auto& item : fs::directory_iterator(folder))
    EXPECT_EQ(item.path().filename().string().find("summary"), std::string::npos) << item.path();
  // The summary goes first: nothing was drawn after it failed.
  EXPECT_TRUE(recorder.drawn().notices.empty());
  EXPECT_EQ(read_run(folder).status, "incomplete");
  EXPECT_TRUE(fs::exists(config.save));
}

// A folder holding a stand-in "gnuplot": a shell script that sets $out to the picture it is told
// to draw (`-e "picture='...'" SCRIPT`), then runs `body`. Returns the folder.
std::string fake_gnuplot_bin(const ScratchDir& dir, const std::string& body) {
  const std::string bin = dir.file("bin");
  fs::create_directories(bin);
  std::ofstream(bin + "/gnuplot")
      << "#!/bin/sh\n"
         "out=$(printf '%s' \"$2\" | sed -n \"s/^picture='\\(.*\\)'$/\\1/p\")\n"
      << body;
  fs::permissions(bin + "/gnuplot", fs::perms::owner_all);
  return bin;
}

// gnuplot exits 0 on a full disk, leaving a cut PNG: it is not counted as drawn, and is removed.
TEST(RunFolder, APictureGnuplotLeftIncompleteIsANoteAndRemoved) {
  ScratchDir dir;
  const std::string bin = fake_gnuplot_bin(
      dir, "printf '\\211PNG\\r\\n\\032\\n0123456789012345678901234567890123456789' > \"$out\"\n");
  const std::string folder = dir.file("run");
  const auto run = record(folder, bin.c_str());
  EXPECT_TRUE(run.finished.pictures.empty());
  bool noted = false;
  for (const auto& n : run.finished.notices)
    noted = noted || n.find("skipping curves.png: gnuplot left it incomplete") != std::string::npos;
  EXPECT_TRUE(noted) << ::testing::PrintToString(run.finished.notices);
  EXPECT_FALSE(fs::exists(folder + "/curves.png"));
  EXPECT_FALSE(fs::exists(folder + "/confusion.png"));
  EXPECT_TRUE(read_json(folder + "/summary.json")["pictures"].empty());
}

// gnuplot may take a minute: a run killed while it draws must still be complete, with its
// checkpoint. The summary is there before the first picture starts, and names the pictures after.
TEST(RunFolder, TheSummaryIsWrittenBeforeThePicturesAndAgainWithThem) {
  ScratchDir dir;
  const std::string bin = fake_gnuplot_bin(
      dir,
      "[ -e summary.json ] && cp summary.json \"while-$(basename \"$out\" .png.drawing).json\"\n"
      "printf '\\211PNG\\r\\n\\032\\n0123456789012345678901234567890123456789"
      "\\0\\0\\0\\0IEND\\256B`\\202' > \"$out\"\n");
  const std::string folder = dir.file("run");
  const auto run = record(folder, bin.c_str());
  // Each picture is drawn under a hidden name (.curves.png.drawing) and renamed when whole.
  const auto during = read_json(folder + "/while-.curves.json");
  EXPECT_EQ(during["status"], "complete");
  EXPECT_EQ(during["checkpoint"], "checkpoint.pt");
  EXPECT_TRUE(during["pictures"].empty()) << during["pictures"];
  const auto after = read_json(folder + "/summary.json");
  EXPECT_EQ(after["pictures"]["curves"], "curves.png");
  EXPECT_EQ(after["pictures"]["confusion"], "confusion.png");
  EXPECT_TRUE(fs::exists(folder + "/curves.png"));
  EXPECT_FALSE(fs::exists(folder + "/.curves.png.drawing"));
  EXPECT_EQ(after["test"], during["test"]);
  EXPECT_GE(after["wall_s"].get<double>(), during["wall_s"].get<double>());
}

TEST(RunFolder, FreshNamesNeverCollideAndAClaimedFolderMustBeEmpty) {
  ScratchDir dir;
  const std::time_t when = 1700000000;
  const std::string a = create_run_folder(dir.file("runs"), "classify", "ann", when);
  const std::string b = create_run_folder(dir.file("runs"), "classify", "ann", when);
  EXPECT_NE(a, b);
  EXPECT_EQ(b, a + "-2");
  EXPECT_NE(fs::path(a).filename().string().find("-classify-ann"), std::string::npos);
  // A name part with a path in it stays one folder name, directly under the root.
  EXPECT_EQ(fs::path(create_run_folder(dir.file("runs"), "x/../y", "m", when)).parent_path(),
            fs::path(dir.file("runs")));
  // A long model name (a TorchScript file's path) is cut: the folder can still be made.
  const std::string long_model = std::string(300, 'm');
  const auto long_folder =
      fs::path(create_run_folder(dir.file("runs"), "classify", long_model, when));
  EXPECT_TRUE(fs::is_directory(long_folder));
  EXPECT_LT(long_folder.filename().string().size(), 100u);
  EXPECT_TRUE(claim_run_folder(dir.file("new/deeper")));  // made
  std::ofstream(a + "/metrics.jsonl") << "{}\n";
  EXPECT_THROW(claim_run_folder(a), Error);
  EXPECT_FALSE(claim_run_folder(b));  // exists, empty: used, not made
}

// Runs given one --run-dir at once: each checked that the folder was new or empty before any
// wrote to it, so the claim must be one atomic step that exactly one of them wins.
TEST(RunFolder, OfRunsClaimingOneFolderAtOnceExactlyOneGetsIt) {
  ScratchDir dir;
  fs::create_directory(dir.file("empty"));
  for (const std::string& folder : {dir.file("fresh/run/"), dir.file("empty")}) {
    std::atomic<int> won{0}, refused{0}, made{0};
    std::vector<std::thread> runs;
    for (int i = 0; i < 8; ++i)
      runs.emplace_back([&] {
        try {
          made += claim_run_folder(folder) ? 1 : 0;
          ++won;
        } catch (const Error& e) {
          const std::string why = e.what();  // taken meanwhile, or seen taken
          EXPECT_TRUE(why.find("another run") != std::string::npos ||
                      why.find("refusing to mix two runs") != std::string::npos)
              << why;
          ++refused;
        }
      });
    for (auto& run : runs) run.join();
    EXPECT_EQ(won.load(), 1) << folder;
    EXPECT_EQ(refused.load(), 7) << folder;
    EXPECT_EQ(made.load(), folder == dir.file("empty") ? 0 : 1) << folder;
    EXPECT_TRUE(fs::exists(fs::path(folder) / "metrics.jsonl"));
  }
}

TEST(Gnuplot, QuotedStringsCannotEndTheLiteralOrTheCommand) {
  EXPECT_EQ(gnuplot_quote("plain"), "'plain'");
  EXPECT_EQ(gnuplot_quote("it's"), "'it''s'");
  EXPECT_EQ(gnuplot_quote("a\nsystem('rm')"), "'a system(''rm'')'");
  EXPECT_FALSE(find_gnuplot("/nonexistent-bin").has_value());
}

// run_gnuplots with a stand-in "gnuplot" that runs its script argument with /bin/sh, in the
// working directory it was given.
struct FakeGnuplot {
  ScratchDir dir;
  std::string exe = dir.file("gnuplot");
  FakeGnuplot() {
    std::ofstream(exe) << "#!/bin/sh\nexec /bin/sh \"$1\"\n";
    fs::permissions(exe, fs::perms::owner_all);
  }
  void script(const std::string& name, const std::string& text) const {
    std::ofstream(dir.file(name)) << text;
  }
};

// Each script waits (up to 20 s) until all three have started: run one after another, the first
// would give up and fail. Each one's output goes to its own log only.
TEST(Gnuplot, RunsTheScriptsAtOnceEachWithItsOwnLog) {
  FakeGnuplot fake;
  std::vector<GnuplotJob> jobs;
  for (const std::string name : {"a", "b", "c"}) {
    fake.script(name + ".gp",
                "touch started-" + name + "\necho drew " + name +
                    "\nfor i in $(seq 200); do\n"
                    "  [ -e started-a ] && [ -e started-b ] && [ -e started-c ] && exit 0\n"
                    "  sleep 0.1\ndone\nexit 1\n");
    jobs.push_back({name + ".gp", name + ".log", ""});
  }
  const auto results = run_gnuplots(fake.exe, jobs, fake.dir.path().string());
  ASSERT_EQ(results.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(results[i].ok) << jobs[i].script << ": " << results[i].message;
    std::ifstream log(fake.dir.file(jobs[i].log_file));
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "drew " + jobs[i].script.substr(0, 1) + "\n");
  }
}

// A failing script is reported with its exit status and its own log's last line, a script past
// the timeout is stopped, and the others' results stand.
TEST(Gnuplot, ReportsEachFailureWithItsOwnLogAndStopsOneThatHangs) {
  FakeGnuplot fake;
  fake.script("ok.gp", "echo fine\n");
  fake.script("bad.gp", "echo 'line 3: undefined variable: x' >&2\nexit 3\n");
  fake.script("hang.gp", "exec sleep 30\n");
  const auto results = run_gnuplots(
      fake.exe, {{"ok.gp", "ok.log", ""}, {"bad.gp", "bad.log", ""}, {"hang.gp", "hang.log", ""}},
      fake.dir.path().string(), /*timeout_s=*/2);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok) << results[0].message;
  EXPECT_FALSE(results[1].ok);
  EXPECT_EQ(results[1].message,
            "gnuplot bad.gp failed (exit status 3): line 3: undefined variable: x");
  EXPECT_FALSE(results[2].ok);
  EXPECT_EQ(results[2].message, "gnuplot hang.gp took longer than 2 s and was stopped");
}

TEST(RunList, ListsCompleteIncompleteAndCorruptFoldersWithoutFailing) {
  ScratchDir dir;
  const std::string root = dir.file("runs");
  fs::create_directories(root + "/2024-01-01-000000-classify-ann");
  std::ofstream(root + "/2024-01-01-000000-classify-ann/summary.json")
      << R"({"status":"complete","task":"classify","model":"ann","dataset":"fashion-mnist","epochs":5,)"
      << R"("started":"2024-01-01T00:00:00+0000","test":{"accuracy":0.87,"loss":0.41},"train":{"loss":0.3},"train_seconds":12.5})";
  fs::create_directories(root + "/2024-01-02-000000-classify-cnn");
  std::ofstream(root + "/2024-01-02-000000-classify-cnn/metrics.jsonl")
      << R"({"kind":"start","step":0,"epoch":0,"wall_s":0,"values":{},"task":"classify","model":"cnn"})"
      << "\n"
      << R"({"kind":"epoch","step":10,"epoch":1,"wall_s":1,"values":{"loss":0.5}})"
      << "\n"
      << R"({"kind":"eval","split":"test","step":10,"epoch":1,"values":{"loss":0.0314}})"
      << "\n"
      << R"({"kind":"epoch","step":20,"epoch":"two","values":{"loss":0.4}})"  // edited by hand
      << "\n"
      << R"({"kind":"epo)";  // killed mid-line
  fs::create_directories(root + "/2024-01-03-000000-classify-ann");
  std::ofstream(root + "/2024-01-03-000000-classify-ann/summary.json") << "{ not json";
  fs::create_directories(root + "/zz-empty");
  fs::create_directories(root + "/zz-pictures");  // a folder of something else: not a run
  std::ofstream(root + "/zz-pictures/plot.png") << "png";
  std::ofstream(root + "/stray-file.txt") << "not a folder";

  const auto runs = list_runs(root);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_FALSE(is_run_folder(root + "/zz-empty"));
  EXPECT_FALSE(is_run_folder(root + "/zz-pictures"));
  EXPECT_TRUE(is_run_folder(root + "/2024-01-03-000000-classify-ann"));
  EXPECT_EQ(runs[0].status, "complete");
  EXPECT_EQ(runs[0].epochs, 5);
  ASSERT_TRUE(runs[0].test_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*runs[0].test_accuracy, 0.87);
  EXPECT_DOUBLE_EQ(*runs[0].train_seconds, 12.5);
  ASSERT_TRUE(runs[0].test_loss.has_value());
  EXPECT_DOUBLE_EQ(*runs[0].test_loss, 0.41);
  ASSERT_TRUE(runs[1].test_loss.has_value());  // an evaluation line with a loss and no accuracy
  EXPECT_DOUBLE_EQ(*runs[1].test_loss, 0.0314);
  EXPECT_FALSE(runs[1].test_accuracy.has_value());
  EXPECT_EQ(runs[1].status, "incomplete");
  EXPECT_EQ(runs[1].model, "cnn");
  EXPECT_EQ(runs[1].epochs, 1);
  EXPECT_NE(runs[1].problem.find("2 damaged line"), std::string::npos) << runs[1].problem;
  EXPECT_EQ(runs[2].status, "corrupt");
  EXPECT_NE(runs[2].problem.find("not valid JSON"), std::string::npos);
  EXPECT_TRUE(list_runs(dir.file("nowhere")).empty());
}

// What a user (or a crash) can leave where a file is expected: a folder or a FIFO named
// summary.json or metrics.jsonl, a summary that is JSON but no object. Each run is listed with its
// problem; none throws, and none waits for a writer that never comes.
TEST(RunList, ListsRunsWhoseFilesAreFoldersFifosOrNotObjects) {
  ScratchDir dir;
  const std::string root = dir.file("runs");
  fs::create_directories(root + "/a-summary-folder/summary.json");
  fs::create_directories(root + "/b-summary-fifo");
  ASSERT_EQ(::mkfifo((root + "/b-summary-fifo/summary.json").c_str(), 0600), 0);
  fs::create_directories(root + "/c-summary-array");
  std::ofstream(root + "/c-summary-array/summary.json") << "[1, 2, 3]";
  fs::create_directories(root + "/d-metrics-folder/metrics.jsonl");
  fs::create_directories(root + "/e-metrics-fifo");
  ASSERT_EQ(::mkfifo((root + "/e-metrics-fifo/metrics.jsonl").c_str(), 0600), 0);

  const auto runs = list_runs(root);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].status, "corrupt");
  EXPECT_EQ(runs[0].problem, "summary.json is not a regular file");
  EXPECT_EQ(runs[1].status, "corrupt");
  EXPECT_EQ(runs[1].problem, "summary.json is not a regular file");
  EXPECT_EQ(runs[2].status, "corrupt");
  EXPECT_EQ(runs[2].problem, "summary.json is not a JSON object");
  EXPECT_EQ(runs[3].status, "incomplete");
  EXPECT_EQ(runs[3].problem, "metrics.jsonl is not a regular file");
  EXPECT_EQ(runs[4].status, "incomplete");
  EXPECT_EQ(runs[4].problem, "metrics.jsonl is not a regular file");
}

}  // namespace
}  // namespace spritetorch::runs
