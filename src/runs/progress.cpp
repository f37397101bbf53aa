#include "runs/progress.h"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <utility>

#include "common/timer.h"

namespace spritetorch::runs {

namespace {

constexpr int kBarWidth = 24;

std::string fixed(double v, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

}  // namespace

ProgressPrinter::ProgressPrinter(std::ostream& out, ProgressOptions options)
    : out_(out), options_(std::move(options)) {
  if (!options_.clock) options_.clock = steady_seconds;
}

std::string ProgressPrinter::paint(const std::string& text, const char* code) const {
  if (!options_.style.color) return text;
  return std::string("\033[") + code + "m" + text + "\033[0m";
}

void ProgressPrinter::on_start(const std::string& device, const train::Settings& settings) {
  if (options_.verbosity == Verbosity::kQuiet) return;
  if (!options_.run_folder.empty()) out_ << "Run folder: " << options_.run_folder << "\n";
  out_ << "Using device: " << device << "\n";
  size_t width = 0;
  for (const auto& [key, value] : settings) width = std::max(width, key.size());
  for (const auto& [key, value] : settings)
    out_ << "  " << key << std::string(width - key.size(), ' ') << "  " << value << "\n";
  out_.flush();
}

std::string ProgressPrinter::rate_and_eta() const {
  const double elapsed = now_s_ - epoch_start_s_;
  const double samples = static_cast<double>(tick_.samples - epoch_start_samples_);
  if (elapsed <= 0 || samples <= 0) return "";
  // Steps left at the rate of the steps done so far (the first step's cost is not in it).
  const double steps_done = static_cast<double>(tick_.step) - (tick_.step > 0 ? 1 : 0);
  const double per_step = steps_done > 0 ? elapsed / steps_done : 0;
  std::string text = fixed(samples / elapsed, 0) + " img/s";
  if (per_step > 0)
    text += "  ETA " + format_duration(per_step * static_cast<double>(tick_.steps - tick_.step));
  return text;
}

void ProgressPrinter::on_step(const train::StepTick& tick) {
  const double now = options_.clock();
  if (tick.epoch != tick_.epoch || tick.step <= 1) {  // a new epoch: the rate starts again
    epoch_start_s_ = now;
    epoch_start_samples_ = tick.samples;
    running_loss_ = -1;
  }
  tick_ = tick;
  now_s_ = now;
  if (!options_.style.redraw || options_.verbosity == Verbosity::kQuiet) return;
  if (now - last_draw_s_ < options_.min_redraw_s && tick.step != tick.steps) return;
  last_draw_s_ = now;
  redraw();
}

void ProgressPrinter::redraw() {
  const int64_t steps = std::max<int64_t>(tick_.steps, 1);
  const auto filled = static_cast<int>(kBarWidth * std::min(tick_.step, steps) / steps);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kBarWidth)
    bar += '>' + std::string(static_cast<size_t>(kBarWidth - filled - 1), ' ');
  std::string line = "epoch " + std::to_string(tick_.epoch) + "/" + std::to_string(tick_.epochs) +
                     " [" + bar + "] " + std::to_string(tick_.step) + "/" +
                     std::to_string(tick_.steps);
  const std::string rate = rate_and_eta();
  if (!rate.empty()) line += "  " + rate;
  if (running_loss_ >= 0) line += "  loss " + fixed(running_loss_, 4);
  // One column short of the terminal's width: a line as wide as the terminal wraps on some.
  const int columns = options_.columns ? options_.columns() : 0;
  if (columns > 1 && line.size() >= static_cast<size_t>(columns))
    line.resize(static_cast<size_t>(columns - 1));
  // Pad over the previous, longer line instead of an erase escape: plain text even without colour.
  const size_t width = line.size();
  if (width < drawn_width_) line += std::string(drawn_width_ - width, ' ');
  out_ << "\r" << line;
  out_.flush();
  drawn_width_ = width;
}

void ProgressPrinter::finish_line() {
  if (drawn_width_ == 0) return;
  out_ << "\r" << std::string(drawn_width_, ' ') << "\r";
  out_.flush();
  drawn_width_ = 0;
}

void ProgressPrinter::print_line(const std::string& line) {
  finish_line();
  out_ << line << "\n";
  out_.flush();
}

void ProgressPrinter::on_log(const train::StepLog& log) {
  running_loss_ = log.running_loss;
  if (options_.verbosity == Verbosity::kQuiet) return;
  // On a terminal the bar shows the loss; the lines are for logs, or asked for with --verbose.
  if (options_.style.redraw && options_.verbosity != Verbosity::kVerbose) return;
  std::string line = "  epoch " + std::to_string(log.epoch) + " step " + std::to_string(log.step) +
                     "/" + std::to_string(log.steps) + "  loss " + fixed(log.running_loss, 4);
  const std::string rate = rate_and_eta();
  if (!rate.empty()) line += "  " + rate;
  print_line(line);
  if (options_.style.redraw) redraw();
}

void ProgressPrinter::on_epoch(const train::EpochReport& r) {
  if (options_.verbosity == Verbosity::kQuiet) return;
  std::string line =
      paint("Epoch " + std::to_string(r.epoch) + "/" + std::to_string(r.epochs), "1") + "  loss " +
      fixed(r.loss, 4);
  if (r.has_accuracy) line += "  train acc " + fixed(r.accuracy, 4);
  // A task without classes (a generator) shows its held-out loss where classifiers show accuracy.
  if (r.has_test && r.has_accuracy)
    line += "  " + paint("test acc " + fixed(r.test_accuracy, 4), "32");
  if (r.has_test && !r.has_accuracy)
    line += "  " + paint("test loss " + fixed(r.test_loss, 4), "32");
  line += "  " + fixed(r.seconds, 2) + " s  " + fixed(r.images_per_second, 0) + " img/s";
  if (r.has_test && r.has_accuracy && options_.verbosity == Verbosity::kVerbose)
    line += "  test loss " + fixed(r.test_loss, 4);
  print_line(line);
}

// Printed whatever the style: the run's length changes here.
void ProgressPrinter::on_plan(const train::BudgetPlan& plan) {
  if (options_.verbosity == Verbosity::kQuiet) return;
  std::string line =
      "Time budget " + format_duration(plan.budget_s, /*keep_tenths=*/true) +
      (plan.revisions > 0 ? ", revised at step " + std::to_string(plan.revised_at_step)
                          : std::string()) +
      ": " +
      // Used up before the plan: what fits is not what the run trains, and the epoch in progress
      // is its last.
      (plan.spent ? "used up, so the run ends with epoch " + std::to_string(plan.epochs) + ": "
                  : std::string()) +
      std::to_string(plan.epochs) + (plan.epochs == 1 ? " epoch, " : " epochs, ") +
      std::to_string(plan.steps) + " steps at " + fixed(plan.seconds_per_step, 3) + " s a step";
  if (plan.epochs < plan.max_epochs)
    line += " (of at most " + std::to_string(plan.max_epochs) + ")";
  else if (!plan.spent)
    line += " (all of --epochs fit)";
  if (plan.warmup_steps > 0)
    line += "; the " + std::to_string(plan.warmup_steps) +
            " warm-up steps span them all, so the lr reaches only " +
            train::lr_percent_text(plan.warmup_lr_share) + "% of --lr";
  print_line(line);
  if (options_.style.redraw) redraw();
}

void ProgressPrinter::on_samples(int64_t epoch, const torch::Tensor& sprites,
                                 int64_t /*per_class*/) {
  if (options_.verbosity != Verbosity::kVerbose) return;
  print_line("  epoch " + std::to_string(epoch) + ": " + std::to_string(sprites.size(0)) +
             " samples drawn");
}

NotesBesideProgress::NotesBesideProgress(ProgressPrinter& printer, std::ostream& err)
    : previous_(set_note_handler([&printer, &err](const std::string& line) {
        printer.finish_line();
        err << "note: " << line << "\n" << std::flush;
      })) {}

NotesBesideProgress::~NotesBesideProgress() { set_note_handler(std::move(previous_)); }

}  // namespace spritetorch::runs
