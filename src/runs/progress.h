// Training progress for people: the settings table at the start, then per epoch either one line
// redrawn in place (a terminal: bar, step / total, images/s, ETA, running loss) or plain lines,
// one per --log-every interval and one per epoch (not a terminal). Writes to the stream it is
// given; the CLI picks the stream and the style (runs/terminal.h).
//
// Cost: on_step only counts and, on a terminal, redraws at most every min_redraw_s of wall clock.
// The running loss shown is the one the trainer reads at --log-every steps (already a device
// sync); the progress line never adds one.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

#include "common/notes.h"
#include "runs/terminal.h"
#include "train/trainer.h"

namespace spritetorch::runs {

enum class Verbosity { kQuiet, kNormal, kVerbose };

struct ProgressOptions {
  TerminalStyle style;
  Verbosity verbosity = Verbosity::kNormal;
  double min_redraw_s = 0.1;      // at most 10 redraws a second
  std::function<double()> clock;  // monotonic seconds; default: steady_clock (tests inject one)
  // The terminal's width now (0 or unset: unknown): a redrawn line longer than it would wrap,
  // and '\r' cannot take back a wrapped line, so it is cut to fit.
  std::function<int()> columns;
  // Printed as "Run folder: X" when training starts (empty: none). Not before: a run refused
  // before it starts leaves no folder, and no line naming one.
  std::string run_folder;
};

class ProgressPrinter : public train::TrainObserver {
 public:
  ProgressPrinter(std::ostream& out, ProgressOptions options);
  void on_start(const std::string& device, const train::Settings& settings) override;
  void on_step(const train::StepTick& tick) override;
  void on_log(const train::StepLog& log) override;
  void on_epoch(const train::EpochReport& report) override;
  void on_plan(const train::BudgetPlan& plan) override;
  void on_samples(int64_t epoch, const torch::Tensor& sprites, int64_t per_class) override;
  // Ends a progress line left on the screen (before an error message, say).
  void finish_line();

 private:
  std::string paint(const std::string& text, const char* code) const;
  std::string rate_and_eta() const;
  void redraw();
  void print_line(const std::string& line);

  std::ostream& out_;
  ProgressOptions options_;
  train::StepTick tick_;
  double epoch_start_s_ = 0;  // clock at the epoch's first tick
  int64_t epoch_start_samples_ = 0;
  double now_s_ = 0;  // clock at the latest tick
  double last_draw_s_ = -1e300;
  double running_loss_ = -1;  // latest --log-every reading; < 0: none yet this epoch
  size_t drawn_width_ = 0;    // characters of the progress line on screen (0: none)
};

// While it lives, the library's notes (common/notes.h: the fused Adam kernel's refusal at the
// first step, say) go to `err` as "note: <line>" on a line of their own, the printer's progress
// line ended first; then the handler before it is back. Notes come from the training thread once
// the line is drawn (a dataset's come before it), so the printer needs no lock of its own.
class NotesBesideProgress {
 public:
  NotesBesideProgress(ProgressPrinter& printer, std::ostream& err);
  ~NotesBesideProgress();
  NotesBesideProgress(const NotesBesideProgress&) = delete;
  NotesBesideProgress& operator=(const NotesBesideProgress&) = delete;

 private:
  NoteHandler previous_;
};

}  // namespace spritetorch::runs
