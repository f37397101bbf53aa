// `spritetorch bench`: the workload on every device and data path, a table, JSON and CSV; with
// --vs-python, the Python peer right after, on the same device, and the ratio.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_table.h"
#include "checks.h"
#include "commands.h"
#include "common/atomic_file.h"
#include "common/choice.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/json_text.h"
#include "common/output_file.h"
#include "config/toml_file.h"
#include "config_file.h"
#include "data/augment.h"
#include "data/streaming_loader.h"
#include "device/device.h"
#include "distributed/dist_env.h"
#include "models/classifier.h"
#include "precision/precision.h"
#include "subprocess.h"
#include "tasks/time_to_accuracy.h"
#include "train/benchmark.h"
#include "train/flat_optimizer.h"
#include "train/lr_schedule.h"
#include "train/recipe.h"

namespace spritetorch::cli {

namespace {

class RowPrinter : public train::BenchObserver {
 public:
  void on_row(const train::BenchRow& r) override {
    std::cerr << "  " << r.device << " | " << r.data_path << ": "
              << (r.ran ? std::to_string(r.train_seconds) + " s" : "not run: " + r.skipped_reason)
              << "\n";
  }
};

std::string executable_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// The peer script next to a build tree (../bench) or an install (../share/spritetorch).
std::string find_peer_script(const std::string& given) {
  if (!given.empty()) {
    check_input_file(given, "the Python peer script (bench/python_peer.py)");
    return given;
  }
  const std::string dir = executable_dir();
  for (const auto& candidate :
       {dir + "/../bench/python_peer.py", dir + "/../share/spritetorch/python_peer.py"})
    if (std::filesystem::exists(candidate))
      return std::filesystem::weakly_canonical(candidate).string();
  throw Error("cannot find bench/python_peer.py next to the spritetorch executable",
              "pass --python-peer PATH");
}

// The first interpreter that has torch (and torchvision, which the seed's loop reads its data
// with; the recipes read the IDX files themselves): PATH's python3, then Debian's.
std::string find_python(const std::string& given, bool torchvision) {
  const std::string needs = torchvision ? "torch and torchvision" : "torch";
  const std::string import = torchvision ? "import torch, torchvision" : "import torch";
  const std::string install = torchvision ? "python3-torch python3-torchvision" : "python3-torch";
  if (!given.empty()) {  // checked before any row runs, not found failing after them
    const auto probe = run_process({given, "-c", import}, /*quiet=*/true);
    if (probe.exit_code != 0)
      throw Error("--python " + given + ": expected a Python interpreter with " + needs +
                      ", found one that " +
                      (probe.exit_code == 127 || probe.exit_code < 0
                           ? std::string("cannot be run")
                           : "exits " + std::to_string(probe.exit_code) + " on `" + import + "`"),
                  "Debian: apt-get install " + install + ", or drop --python");
    return given;
  }
  for (const std::string candidate : {"python3", "/usr/bin/python3"})
    if (run_process({candidate, "-c", import}, /*quiet=*/true).exit_code == 0) return candidate;
  throw Error(
      "no python3 with " + needs + " found for --vs-python",
      "Debian: apt-get install " + install + " (scripts/setup --peer), or pass --python EXE");
}

// The peer trains the seed's loop on Fashion-MNIST (Adam 1e-3, batch 64) with the seed's ANN or
// our CNN, on all the data or its first N images: against any other workload its ratio would
// compare different work. It is set against the resident fp32 row, so that row must be in the
// table.
void check_peer_workload(const train::BenchConfig& bench) {
  const train::TrainConfig& w = bench.workload;
  if (std::find(bench.precisions.begin(), bench.precisions.end(), "fp32") == bench.precisions.end())
    throw Error("--vs-python sets the peer against the resident fp32 row; --precisions has no fp32",
                "add fp32 to --precisions");
  std::string differs;
  if (!w.model.empty() && w.model != "ann" && w.model != "cnn") differs += " --model " + w.model;
  if (w.dataset != "fashion-mnist") differs += " --dataset " + w.dataset;
  if (w.batch_size != 64) differs += " --batch-size " + std::to_string(w.batch_size);
  if (w.optimizer != "adam") differs += " --optimizer " + w.optimizer;
  if (w.lr != 1e-3) differs += " --lr (not 0.001)";
  if (!w.recipe.empty()) differs += " --recipe " + w.recipe;
  if (w.label_smoothing > 0 || w.test_time_augment != "none" || w.augment != "none" ||
      w.first_conv != "learned" || w.lr_schedule != "constant" || w.warmup_steps > 0)
    differs += " (a schedule, augmentation or label smoothing)";
  if (!differs.empty())
    throw Error(
        "--vs-python times the seed's loop (ann or cnn, fashion-mnist, adam lr 0.001, batch "
        "64); this bench differs:" +
            differs,
        "drop those options, or run the bench without --vs-python");
}

// ", accuracy on the first N test images" when --test-limit cut the test set: the headline says
// which accuracy its figures are.
std::string test_images_note(const train::TrainConfig& w) {
  return w.test_limit > 0
             ? ", accuracy on the first " + std::to_string(w.test_limit) + " test images"
             : "";
}

// The peer's --test-limit, only when set: a --python-peer script written before the flag runs as
// it did.
void add_test_limit(std::vector<std::string>& argv, const train::TrainConfig& w) {
  if (w.test_limit > 0) argv.insert(argv.end(), {"--test-limit", std::to_string(w.test_limit)});
}

// The peer writes each recipe out in Python, with the batch size, peak lr, warm-up, epochs,
// precision, seeds, --train-limit and --test-limit passed on; any other change to the recipe would
// time different work under the name "same recipe".
void check_peer_recipe(const train::TrainConfig& w) {
  const train::Recipe& recipe = train::find_recipe(w.recipe);
  const std::map<std::string, std::string> text_values = {
      {"model", w.model},
      {"optimizer", w.optimizer},
      {"lr-schedule", w.lr_schedule},
      {"augment", w.augment},
      {"test-time-augment", w.test_time_augment},
      {"first-conv", w.first_conv}};
  const std::map<std::string, double> number_values = {{"weight-decay", w.weight_decay},
                                                       {"label-smoothing", w.label_smoothing}};
  std::string differs;
  if (w.dataset != "fashion-mnist") differs += " --dataset " + w.dataset;
  for (const auto& [key, value] : recipe.options) {
    const auto text = text_values.find(key);
    const auto number = number_values.find(key);
    if (text != text_values.end() && text->second != value)
      differs += " --" + key + " " + text->second;
    else if (number != number_values.end() && number->second != std::stod(value))
      differs += " --" + key + " " + c10::str(number->second);
  }
  if (!differs.empty())
    throw Error("--vs-python runs the " + w.recipe +
                    " recipe in Python with only --batch-size, --lr, --lr-warmup-steps, --epochs, "
                    "--precision, --train-limit, --test-limit and the seeds changed; this bench "
                    "also changes:" +
                    differs,
                "drop those options, or run the bench without --vs-python");
}

// A peer's result: the last line of its output as a JSON object, or why there is none usable.
struct PeerResult {
  nlohmann::json json;  // null when failed
  std::string failed;   // "exit 1", "no numeric train_s", ...
};

// `needed` must be positive numbers, `optional` numbers where present, and "torch" text: the
// fields the bench reads, so that a peer of another version fails as a peer, not as the bench.
PeerResult peer_result(const ProcessResult& result, const std::vector<std::string>& needed,
                       const std::vector<std::string>& optional) {
  std::istringstream lines(result.out);
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  if (result.exit_code != 0) return {nullptr, "exit " + std::to_string(result.exit_code)};
  if (!nlohmann::json::accept(last)) return {nullptr, "its last line is not JSON"};
  auto json = nlohmann::json::parse(last);
  if (!json.is_object()) return {nullptr, "its last line is not a JSON object"};
  for (const auto& key : needed)
    if (!json.contains(key) || !json.at(key).is_number() || !(json.at(key).get<double>() > 0))
      return {nullptr, "its result has no positive numeric " + key};
  for (const auto& key : optional)
    if (json.contains(key) && !json.at(key).is_number())
      return {nullptr, "its result's " + key + " is not a number"};
  if (json.contains("torch") && !json.at("torch").is_string())
    return {nullptr, "its result's torch is not text"};
  return {std::move(json), ""};
}

// "3.2x faster" or "1.3x slower": peer seconds / ours.
std::string speed_ratio(double ratio) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(1) << (ratio >= 1 ? ratio : 1 / ratio) << "x "
       << (ratio >= 1 ? "faster" : "slower");
  return text.str();
}

struct BenchFlags {
  train::BenchConfig bench;
  std::string out = "spritetorch-bench";
  bool vs_python = false;
  std::string python, peer;
  bool overwrite = false;
  int seeds = 3;  // --target-accuracy
  std::string python_found, peer_found;
};

// Whether `name` was given: on the command line, or from a --config file with a value other than
// its default (a file --print-config wrote lists every option, defaults included).
bool given(const CLI::App& sub, const std::string& name, bool differs_from_default) {
  const CLI::Option* option = sub.get_option(name);
  return given_on_command_line(option) ||
         (differs_from_default && option->count() > 0 && !set_by_environment(option));
}

// The options this mode of the bench does not use: refused, not silently dropped.
void check_unused_options(const CLI::App& sub, const BenchFlags& f, bool target) {
  const BenchFlags defaults;
  std::string unused;
  auto check = [&](const std::string& name, bool differs) {
    if (given(sub, name, differs)) unused += " " + name;
  };
  if (target) {
    check("--workers", f.bench.workers != defaults.bench.workers);
    check("--no-streaming", f.bench.streaming != defaults.bench.streaming);
    check("--cuda-graphs", f.bench.cuda_graphs != defaults.bench.cuda_graphs);
    check("--repeats", f.bench.repeats != defaults.bench.repeats);
    check("--warmup-steps", f.bench.warmup_steps != defaults.bench.warmup_steps);
    if (!unused.empty())
      throw Error(
          "--target-accuracy trains each seed once on one device, at one precision; it "
          "does not use" +
              unused,
          "drop them, or drop --target-accuracy for the table of devices and data paths");
    if (f.bench.precisions.size() > 1)
      throw Error("--target-accuracy trains at one precision; --precisions names " +
                      std::to_string(f.bench.precisions.size()),
                  "pass one --precisions value");
  } else {
    check("--seeds", f.seeds != defaults.seeds);
    check("--eval-every-steps", f.bench.workload.eval_every_steps != 0);
    if (!unused.empty())
      throw Error(unused.substr(1) + " only apply with --target-accuracy",
                  "add --target-accuracy, or drop them");
    if (!f.bench.streaming) check("--workers", f.bench.workers != defaults.bench.workers);
    if (!unused.empty())
      throw Error("--workers sets the streaming rows; --no-streaming leaves none",
                  "drop --workers or --no-streaming");
  }
  check_data_option_applies(sub, f.bench.workload.dataset);
  if (!f.vs_python) {
    check("--python", !f.python.empty());
    check("--python-peer", !f.peer.empty());
    if (!unused.empty())
      throw Error(unused.substr(1) + " only apply with --vs-python",
                  "add --vs-python, or drop them");
  }
}

// --vs-python's interpreter and script, found before any work: a missing one must not cost the
// bench's results.
void find_peer(BenchFlags& f, bool torchvision) {
  f.python_found = find_python(f.python, torchvision);
  f.peer_found = find_peer_script(f.peer);
}

// The exit status once the results are written: 1 when a peer run asked for with --vs-python
// failed (its comparison is missing; a script must not read the run as complete), else 0.
int peer_failed_exit(int failures, int runs) {
  if (failures == 0) return 0;
  std::cerr << "error: the Python peer failed in " << failures << " of " << runs
            << " run(s) (see above): its comparison is missing; spritetorch's own results are "
               "written\n";
  return 1;
}

// --target-accuracy: time to accuracy over seeds, then (--vs-python) the peer's recipe, same seeds.

int run_target_bench(BenchFlags& f) {
  train::TrainConfig w = f.bench.workload;
  w.data_path.data_on = "device";
  if (f.bench.devices.size() > 1)
    throw Error("--target-accuracy times one device; --devices names " +
                    std::to_string(f.bench.devices.size()),
                "pass one --devices value (or none: the best device here)");
  if (!f.bench.devices.empty()) w.device = f.bench.devices.front();
  w.precision = precision::parse_precision(f.bench.precisions.front());
  if (f.vs_python && w.recipe.empty())
    throw Error("--vs-python with --target-accuracy runs the peer's version of a recipe",
                "add --recipe " + listed(train::recipe_names()));
  if (f.vs_python) {
    check_peer_recipe(w);
    find_peer(f, /*torchvision=*/false);  // the recipes read the IDX files themselves
  }
  const std::string model = w.model.empty() ? train::default_model(w) : w.model;
  // The peer runs at the precision ours resolves to on this device.
  const torch::Device device = device::pick_device(w.device);
  const precision::PrecisionPlan plan =
      precision::resolve_precision(w.precision, device::describe_device(device));
  const std::string peer_precision = plan.autocast ? precision::to_string(plan.precision) : "fp32";
  std::cerr << "time to " << w.target_accuracy << " test accuracy: " << model << ", " << f.seeds
            << " seed(s) from " << w.seed << "\n";
  struct Printer : TimeToAccuracyObserver {
    void on_run(const TargetRun& r) override {
      std::cerr << "  seed " << r.seed << ": "
                << (r.reached ? std::to_string(r.time_to_target_s) + " s to target (epoch " +
                                    std::to_string(r.target_epoch) + ")"
                              : std::string("target not reached"))
                << "; schedule's end " << r.final_accuracy << " after " << r.train_s << " s\n";
    }
  } printer;
  const TimeToAccuracyReport report = run_time_to_accuracy(w, f.seeds, &printer);
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : report.runs) {
    nlohmann::json run = {
        {"seed", r.seed}, {"final_accuracy", r.final_accuracy}, {"train_s", r.train_s}};
    if (r.reached)
      run.update({{"time_to_target_s", r.time_to_target_s},
                  {"target_epoch", r.target_epoch},
                  {"target_step", r.target_step}});
    runs.push_back(run);
  }
  nlohmann::json json = {{"target_accuracy", report.target},
                         {"model", model},
                         {"recipe", w.recipe},
                         {"test_limit", w.test_limit},
                         {"device", device::display_name(device)},
                         {"precision", plan.description},
                         {"runs", runs},
                         {"reached", report.reached},
                         {"median_final_accuracy", report.median_final_accuracy},
                         {"median_train_s", report.median_train_s}};
  std::cout << std::fixed << std::setprecision(2) << "spritetorch bench --target-accuracy "
            << report.target << ": " << model << (w.recipe.empty() ? "" : ", recipe " + w.recipe)
            << ", " << w.epochs << " epoch(s), " << f.seeds << " seed(s)" << test_images_note(w)
            << "\n";
  if (report.reached > 0) {
    json.update({{"median_time_to_target_s", report.median_time_s},
                 {"min_time_to_target_s", report.min_time_s},
                 {"max_time_to_target_s", report.max_time_s}});
    std::cout << "  time to target: median " << report.median_time_s << " s (" << report.min_time_s
              << " - " << report.max_time_s << "), reached by " << report.reached << " of "
              << f.seeds << "\n";
  } else {
    std::cout << "  time to target: not reached by any seed\n";
  }
  std::cout << "  the fixed schedule: median test accuracy " << std::setprecision(4)
            << report.median_final_accuracy << " after " << std::setprecision(2)
            << report.median_train_s << " s\n";
  int peer_failures = 0;
  if (f.vs_python) {
    const std::string &python = f.python_found, &peer = f.peer_found;
    std::vector<double> peer_times, peer_finals;
    nlohmann::json peers = nlohmann::json::array();
    for (int i = 0; i < f.seeds; ++i) {
      const uint64_t seed = w.seed + static_cast<uint64_t>(i);
      std::cerr << "  python peer, seed " << seed << " ...\n";
      std::vector<std::string> argv = {python,
                                       peer,
                                       "--recipe",
                                       w.recipe,
                                       "--data",
                                       w.data_dir,
                                       "--epochs",
                                       std::to_string(w.epochs),
                                       "--device",
                                       device.str(),
                                       "--precision",
                                       peer_precision,
                                       "--seed",
                                       std::to_string(seed),
                                       "--target-accuracy",
                                       std::to_string(w.target_accuracy),
                                       "--eval-every-steps",
                                       std::to_string(w.eval_every_steps),
                                       "--train-limit",
                                       std::to_string(w.train_limit),
                                       "--batch-size",
                                       std::to_string(w.batch_size),
                                       "--lr",
                                       config::shortest_double_text(w.lr),
                                       "--warmup-steps",
                                       std::to_string(w.warmup_steps)};
      add_test_limit(argv, w);
      const PeerResult peer_run =
          peer_result(run_process(argv), {"train_s"}, {"time_to_target_s", "accuracy"});
      if (peer_run.json.is_null()) {
        std::cout << "  Python peer, seed " << seed << ": failed (" << peer_run.failed << ")\n";
        ++peer_failures;
        continue;
      }
      const nlohmann::json& result = peer_run.json;
      if (result.contains("time_to_target_s"))
        peer_times.push_back(result.at("time_to_target_s").get<double>());
      peer_finals.push_back(result.value("accuracy", 0.0));
      peers.push_back(result);
    }
    json["python_peer"] = peers;
    if (!peer_finals.empty()) {
      std::cout << "  Python peer (same recipe, same seeds): ";
      if (!peer_times.empty())
        std::cout << "time to target median " << median_of(peer_times) << " s, reached by "
                  << peer_times.size() << " of " << f.seeds;
      else
        std::cout << "target not reached";
      std::cout << "; its schedule's end " << std::setprecision(4) << median_of(peer_finals)
                << "\n";
      if (!peer_times.empty() && report.reached > 0) {
        const double ratio = median_of(peer_times) / report.median_time_s;
        json["python_peer_ratio"] = ratio;
        std::cout << "  spritetorch: " << speed_ratio(ratio) << " to the target\n";
      }
    }
  }
  std::cout << std::defaultfloat;
  write_file_atomically(f.out + ".json", json_text(json, 2) + "\n", if_exists(f.overwrite));
  std::cout << "Wrote " << f.out << ".json\n";
  return peer_failed_exit(peer_failures, f.seeds);
}

}  // namespace

Subcommand add_bench_command(CLI::App& app) {
  auto* sub = app.add_subcommand("bench",
                                 "Time one workload on every device and data path (median "
                                 "of repeats, after warm-up); table, JSON and CSV. With "
                                 "--target-accuracy: the time to that test accuracy over seeds");
  auto f = std::make_shared<BenchFlags>();
  auto& w = f->bench.workload;
  w.model.clear();
  sub->add_option("--model", w.model,
                  "As train --model, script:FILE too (your own model, timed on every device) "
                  "[default: ann]")
      ->check(model_validator());
  sub->add_option("--dataset", w.dataset, "fashion-mnist | dummy")->capture_default_str();
  sub->add_option("--data", w.data_dir, "Fashion-MNIST folder")->capture_default_str();
  sub->add_option("--epochs", w.epochs, "Epochs per timed run")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--batch-size", w.batch_size, "Samples per step")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--lr", w.lr, "Learning rate")->check(kPositive)->capture_default_str();
  sub->add_option("--optimizer", w.optimizer, "adam | adamw | sgd")
      ->check(CLI::IsMember(train::optimizer_names()))
      ->capture_default_str();
  sub->add_option("--seed", w.seed, "Seed (the same for every row)")
      ->check(kSeed)
      ->capture_default_str();
  sub->add_option("--train-limit", w.train_limit, "Train on the first N samples only (0: all)")
      ->check(kNonNegative);
  sub->add_option("--test-limit", w.test_limit,
                  "Evaluate on the first N test samples only (0: all): accuracy and time to "
                  "accuracy are then those of the N (passed on to --vs-python's peer)")
      ->check(kNonNegative);
  sub->add_option("--threads", w.threads, "LibTorch intra-op threads (0: default)")
      ->check(kThreadCount);
  sub->add_option("--blas-threads", w.blas_threads, "OpenBLAS threads (0: default)")
      ->check(kThreadCount);
  add_choice(sub, "--step", w.step, "auto | autograd | fused");
  sub->add_option("--step-threads", w.step_threads,
                  "Fused step on the CPU: threads that split each step (0: one per core)")
      ->check(kThreadCount)
      ->capture_default_str();
  add_choice(sub, "--thread-governor", w.thread_governor,
             "auto | on | off: fewer CPU threads while other processes keep the cores busy (as for "
             "train)");
  sub->add_option("--devices", f->bench.devices, "Devices to time (default: every device here)")
      ->delimiter(',');
  sub->add_option("--workers", f->bench.workers,
                  "Worker counts for the streaming rows (as train --workers: at most " +
                      std::to_string(data::kMaxWorkers) + ")")
      ->check(number_between(0, data::kMaxWorkers))
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("!--no-streaming", f->bench.streaming, "Only the resident data path");
  sub->add_option(
         "--precisions", f->bench.precisions,
         "Precisions of the resident rows (fp32 bf16 fp16 auto; an auto row says under the table "
         "what it ran at); streaming rows use the first")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "auto"}))
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--cuda-graphs", f->bench.cuda_graphs,
                "Time each resident row twice, eager and with the step replayed as a CUDA graph "
                "(other devices list the graphed rows as not run, with the reason). Without it "
                "every row runs as train does by default: graphs wherever valid");
  sub->add_option("--repeats", f->bench.repeats, "Timed runs per row (the median is reported)")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--warmup-steps", f->bench.warmup_steps,
                  "Untimed steps before each row (0: none)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--out", f->out, "Write OUT.json and OUT.csv (with --target-accuracy: OUT.json)")
      ->check(kPath)
      ->capture_default_str();
  sub->add_flag("--overwrite", f->overwrite, "Replace existing OUT.json / OUT.csv");
  sub->add_flag(
      "--vs-python", f->vs_python,
      "Also run the Python peer (bench/python_peer.py) on each device and print the ratio "
      "(the seed's loop: --model ann or cnn on fashion-mnist, adam lr 0.001, batch 64; "
      "--train-limit and --epochs are passed on); exit 1 if a peer run fails, after writing "
      "the results");
  sub->add_option(
         "--recipe", w.recipe,
         "Named defaults for the options not given (train --recipe): " + train::describe_recipes())
      ->check(CLI::IsMember(train::recipe_names()));
  sub->add_option("--weight-decay", w.weight_decay, "As train --weight-decay")->check(kNonNegative);
  sub->add_option("--lr-schedule", w.lr_schedule, "As train --lr-schedule")
      ->check(
          parsed_by([](const std::string& text) { train::parse_lr_schedule(text); }, "SCHEDULE"))
      ->capture_default_str();
  sub->add_option("--lr-warmup-steps", w.warmup_steps,
                  "As train --warmup-steps (bench's --warmup-steps are its untimed steps)")
      ->check(kNonNegative)
      ->capture_default_str();
  recipe_alias(sub, "warmup-steps", "lr-warmup-steps");
  recipe_alias(sub, "precision", "precisions");  // its resident rows' list; --target-accuracy: one
  sub->add_option("--label-smoothing", w.label_smoothing, "As train --label-smoothing")
      ->check(number_between(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--test-time-augment", w.test_time_augment, "As train --test-time-augment")
      ->check(CLI::IsMember({"none", "flip"}))
      ->capture_default_str();
  sub->add_option("--first-conv", w.first_conv, "As train --first-conv")
      ->check(CLI::IsMember({"learned", "whitened"}))
      ->capture_default_str();
  sub->add_option("--augment", w.augment, "As train --augment")
      ->check(parsed_by([](const std::string& text) { data::parse_augment(text); }, "AUGMENT"))
      ->capture_default_str();
  sub->add_option(
         "--target-accuracy", w.target_accuracy,
         "Time to this test accuracy instead: train --seeds runs of the whole schedule on one "
         "device, the test set evaluated every epoch and --eval-every-steps outside the timer; "
         "median and spread of the time to target, and the schedule's own final accuracy (0: the "
         "table of devices and data paths)")
      ->check(number_between(0.0, 1.0));
  sub->add_option("--eval-every-steps", w.eval_every_steps,
                  "--target-accuracy: also evaluate every N steps within epochs (0: per epoch)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--seeds", f->seeds, "--target-accuracy: runs, from --seed upwards")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--python", f->python,
                  "Python interpreter for the peer (default: the first with torch)");
  sub->add_option("--python-peer", f->peer, "The peer script (default: bench/python_peer.py)");

  return {
      sub, [sub, f]() {
        // Under torchrun or Slurm (RANK, WORLD_SIZE set) each row would join a process
        // group of its own; bench times one process.
        if (const auto env = distributed::process_env(); distributed::launched_as_rank(env)) {
          const int world = distributed::read_dist_env(env).world_size;
          if (world > 1)
            throw Error("bench times one process; this is one of " + std::to_string(world) +
                            " ranks (WORLD_SIZE=" + std::to_string(world) + ")",
                        "run bench without a launcher");
        }
        train::check_thread_governor_counts(f->bench.workload);
        f->bench.workload.warmup_steps_origin = set_by(sub->get_option("--lr-warmup-steps"));
        const bool target = f->bench.workload.target_accuracy > 0;
        check_unused_options(*sub, *f, target);
        if (!target && f->vs_python) check_peer_workload(f->bench);
        // The files are written after minutes of work: their folder is checked first.
        if (f->out.back() == '/' || std::filesystem::is_directory(f->out))
          throw Error(
              "--out " + f->out + " is a folder; it names the files (OUT.json, OUT.csv)",
              "--out " + (f->out.back() == '/' ? f->out : f->out + "/") + "spritetorch-bench");
        for (const std::string ext : {".json", ".csv"})
          if (ext == ".json" || !target) check_output_path(f->out + ext, f->overwrite, "--out");
        if (target) return run_target_bench(*f);
        if (f->vs_python) find_peer(*f, /*torchvision=*/true);
        RowPrinter printer;
        const auto report = train::run_benchmark(f->bench, &printer);
        std::cout << "spritetorch bench, " << report.date << ": model "
                  << (f->bench.workload.model.empty() ? train::default_model(f->bench.workload)
                                                      : f->bench.workload.model)
                  << ", " << f->bench.workload.dataset << ", batch " << f->bench.workload.batch_size
                  << ", " << f->bench.workload.epochs << " epoch(s), median of " << f->bench.repeats
                  << test_images_note(f->bench.workload) << "\n"
                  << bench_table(report);
        // Not one row ran: the options are what failed (a --first-conv for a model without
        // a convolution, fp16 on a CPU-only --devices ...), so it is a usage error, and no
        // files of rows that all say "not run" are written.
        if (std::none_of(report.rows.begin(), report.rows.end(),
                         [](const train::BenchRow& r) { return r.ran; }))
          throw Error("no row of this bench ran: " + (report.rows.empty()
                                                          ? std::string("there are none")
                                                          : report.rows.front().skipped_reason),
                      "each row above says why it did not run: change those options or "
                      "--devices");
        auto json = bench_json(report);

        int peer_runs = 0, peer_failures = 0;
        if (f->vs_python) {
          const std::string &python = f->python_found, &peer = f->peer_found;
          const std::string model = f->bench.workload.model.empty()
                                        ? train::default_model(f->bench.workload)
                                        : f->bench.workload.model;
          nlohmann::json peers = nlohmann::json::array();
          // Once per device, against the same workload: the resident fp32 row as `train` runs
          // it by default (eager under bench --cuda-graphs). The fastest resident row of that
          // device (another precision, graphed) is named too.
          auto resident = [](const train::BenchRow& r) {
            return r.ran && r.data_path.rfind("resident", 0) == 0;
          };
          for (const auto& row : report.rows) {
            if (row.data_path.rfind("resident", 0) != 0 || row.precision != "fp32" ||
                row.data_path.find(", cuda graphs") != std::string::npos)
              continue;
            if (!row.ran) {  // nothing to set the peer against on this device
              std::cout << "Python peer on " << row.device
                        << ": not run (spritetorch's resident fp32 row did not run: "
                        << row.skipped_reason << ")\n";
              continue;
            }
            const train::BenchRow* best = &row;
            for (const auto& other : report.rows)
              if (resident(other) && other.device == row.device &&
                  other.train_seconds < best->train_seconds)
                best = &other;
            std::cerr << "  python peer on " << row.device << " ...\n";
            std::vector<std::string> argv = {
                python,          peer,
                "--data",        f->bench.workload.data_dir,
                "--epochs",      std::to_string(f->bench.workload.epochs),
                "--device",      row.device,
                "--model",       model,
                "--train-limit", std::to_string(f->bench.workload.train_limit)};
            add_test_limit(argv, f->bench.workload);
            const auto result = run_process(argv);
            PeerResult peer_run = peer_result(result, {"train_s"}, {"accuracy"});
            ++peer_runs;
            if (peer_run.json.is_null()) {
              std::cout << "Python peer on " << row.device << ": failed (" << peer_run.failed
                        << ")\n";
              ++peer_failures;
              continue;
            }
            nlohmann::json peer_json = std::move(peer_run.json);
            const double peer_s = peer_json.at("train_s").get<double>();
            const double ratio = peer_s / row.train_seconds,
                         best_ratio = peer_s / best->train_seconds;
            std::cout << std::fixed << std::setprecision(2) << "Python peer on " << row.device
                      << " (PyTorch " << peer_json.value("torch", "?") << "): train " << peer_s
                      << " s, accuracy " << std::setprecision(4) << peer_json.value("accuracy", 0.0)
                      << "; spritetorch " << row.data_path << " " << std::setprecision(2)
                      << row.train_seconds << " s: " << speed_ratio(ratio);
            if (best != &row)
              std::cout << "; " << best->data_path << " " << std::setprecision(2)
                        << best->train_seconds << " s: " << speed_ratio(best_ratio);
            std::cout << "\n" << std::defaultfloat;
            peer_json["spritetorch_train_s"] = row.train_seconds;
            peer_json["ratio"] = ratio;
            peer_json["best_row"] = best->data_path;
            peer_json["best_train_s"] = best->train_seconds;
            peer_json["best_ratio"] = best_ratio;
            peers.push_back(peer_json);
          }
          json["python_peer"] = peers;
        }
        write_file_atomically(f->out + ".json", json_text(json, 2) + "\n", if_exists(f->overwrite));
        write_file_atomically(f->out + ".csv", bench_csv(report), if_exists(f->overwrite));
        std::cout << "Wrote " << f->out << ".json and " << f->out << ".csv\n";
        return peer_failed_exit(peer_failures, peer_runs);
      }};
}

}  // namespace spritetorch::cli
