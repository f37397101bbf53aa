// The progress printer's two renderings (terminal / plain lines), colour rules, verbosity,
// throttle.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common/notes.h"
#include "common/timer.h"
#include "runs/progress.h"
#include "runs/terminal.h"

namespace spritetorch::runs {
namespace {

// Drives a printer through one short epoch: 4 steps, a log read at step 2 and 4.
std::string render(TerminalStyle style, Verbosity verbosity, double seconds_per_step = 0.5,
                   int columns = 0) {
  std::ostringstream out;
  double now = 0;
  ProgressOptions options;
  options.style = style;
  if (columns > 0) options.columns = [columns] { return columns; };
  options.verbosity = verbosity;
  options.clock = [&now] { return now; };
  ProgressPrinter printer(out, options);
  printer.on_start("cpu (test)", {{"device", "cpu"}, {"batch", "8"}});
  for (int64_t step = 1; step <= 4; ++step) {
    now += seconds_per_step;
    printer.on_step({1, 2, step, 4, step * 8});
    if (step % 2 == 0) printer.on_log({1, step, 4, 0.25 * static_cast<double>(step)});
  }
  train::EpochReport epoch;
  epoch.epoch = 1, epoch.epochs = 2, epoch.loss = 0.75, epoch.accuracy = 0.5, epoch.seconds = 2;
  epoch.images_per_second = 16, epoch.samples = 32, epoch.has_test = true,
  epoch.test_accuracy = 0.625;
  printer.on_epoch(epoch);
  return out.str();
}

TEST(TerminalStyle, RedrawOnlyOnATerminalAndColourUnlessNoColor) {
  EXPECT_FALSE(terminal_style(false, nullptr, "xterm").redraw);
  EXPECT_FALSE(terminal_style(false, nullptr, "xterm").color);
  EXPECT_TRUE(terminal_style(true, nullptr, "xterm").redraw);
  EXPECT_TRUE(terminal_style(true, nullptr, "xterm").color);
  EXPECT_TRUE(terminal_style(true, "1", "xterm").redraw);
  EXPECT_FALSE(terminal_style(true, "1", "xterm").color);
  EXPECT_TRUE(terminal_style(true, "", "xterm").color);  // no-color.org: empty does not count
  EXPECT_FALSE(terminal_style(true, nullptr, "dumb").redraw);
}

// The plan line says what ends the run: a budget used up when the plan was made ends it with the
// epoch in progress, never "all of --epochs fit".
TEST(ProgressPrinter, APlanLineSaysWhenTheBudgetWasUsedUp) {
  const auto line = [](const train::BudgetPlan& plan) {
    std::ostringstream out;
    ProgressOptions options;
    options.style = {false, false};
    ProgressPrinter printer(out, options);
    printer.on_plan(plan);
    return out.str();
  };
  train::BudgetPlan plan;
  plan.budget_s = 1;
  plan.seconds_per_step = 0.024;
  plan.epochs = 5;
  plan.max_epochs = 5;
  plan.steps = 80;
  EXPECT_EQ(line(plan),
            "Time budget 0:01: 5 epochs, 80 steps at 0.024 s a step (all of --epochs fit)\n");
  plan.spent = true;
  EXPECT_EQ(
      line(plan),
      "Time budget 0:01: used up, so the run ends with epoch 5: 5 epochs, 80 steps at 0.024 s "
      "a step\n");
  plan.epochs = 3;
  plan.max_epochs = 20;
  plan.steps = 48;
  EXPECT_EQ(
      line(plan),
      "Time budget 0:01: used up, so the run ends with epoch 3: 3 epochs, 48 steps at 0.024 s "
      "a step (of at most 20)\n");
  plan.spent = false;
  plan.warmup_steps = 100;
  plan.warmup_lr_share = 0.48;
  EXPECT_EQ(line(plan),
            "Time budget 0:01: 3 epochs, 48 steps at 0.024 s a step (of at most 20); the 100 "
            "warm-up steps span them all, so the lr reaches only 48% of --lr\n");
}

TEST(ProgressPrinter, NotATerminalGivesPlainLinesPerLogIntervalAndEpoch) {
  const std::string out = render({false, false}, Verbosity::kNormal);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;
  EXPECT_NE(out.find("Using device: cpu (test)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  batch   8\n"), std::string::npos) << out;  // the settings table
  EXPECT_NE(out.find("  epoch 1 step 2/4  loss 0.5000  16 img/s  ETA 0:01\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("  epoch 1 step 4/4  loss 1.0000"), std::string::npos) << out;
  EXPECT_NE(
      out.find("Epoch 1/2  loss 0.7500  train acc 0.5000  test acc 0.6250  2.00 s  16 img/s\n"),
      std::string::npos)
      << out;
}

TEST(ProgressPrinter, ATaskWithoutClassesShowsItsTestLossNotAnAccuracy) {
  std::ostringstream out;
  ProgressOptions options;
  options.style = {false, false};
  ProgressPrinter printer(out, options);
  train::EpochReport epoch;
  epoch.epoch = 1, epoch.epochs = 1, epoch.loss = 0.25, epoch.has_accuracy = false;
  epoch.seconds = 1, epoch.images_per_second = 64, epoch.has_test = true, epoch.test_loss = 0.125;
  printer.on_epoch(epoch);
  EXPECT_EQ(out.str(), "Epoch 1/1  loss 0.2500  test loss 0.1250  1.00 s  64 img/s\n");
}

TEST(ProgressPrinter, TerminalRedrawsOneLineInPlaceThenEndsItWithTheEpochLine) {
  const std::string out = render({true, false}, Verbosity::kNormal);
  EXPECT_NE(out.find("\repoch 1/2 [============>           ] 2/4  16 img/s  ETA 0:01"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("loss 0.5000"), std::string::npos) << out;  // the running loss, once read
  EXPECT_EQ(out.find("  epoch 1 step 2/4"), std::string::npos)
      << out;                                             // no log lines on a terminal
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;  // NO_COLOR: no escape codes at all
  const auto epoch_line = out.find("Epoch 1/2");
  ASSERT_NE(epoch_line, std::string::npos) << out;
  EXPECT_EQ(out[epoch_line - 1], '\r') << out;  // the bar is cleared, the epoch line stays
  EXPECT_EQ(out.back(), '\n');
}

// A line wider than the terminal would wrap, and '\r' cannot take a wrapped line back: each
// redraw is cut one column short of the width.
TEST(ProgressPrinter, TheRedrawnLineFitsANarrowTerminal) {
  const std::string out = render({true, false}, Verbosity::kNormal, 0.5, 40);
  EXPECT_NE(out.find("\repoch 1/2 [============>           ] 2/\r"), std::string::npos) << out;
  size_t longest = 0;  // of the redrawn lines: those a '\r' ends (the epoch line is printed)
  for (size_t at = out.find('\r'); at != std::string::npos; at = out.find('\r', at + 1)) {
    const size_t end = out.find_first_of("\r\n", at + 1);
    if (end != std::string::npos && out[end] == '\r') longest = std::max(longest, end - at - 1);
  }
  EXPECT_EQ(longest, 39u) << out;
}

TEST(ProgressPrinter, TerminalRedrawsAtMostTenTimesASecond) {
  // 4 steps in 0.04 s: the first is drawn, then nothing until the epoch's last step.
  const std::string out = render({true, false}, Verbosity::kNormal, 0.01);
  EXPECT_NE(out.find(" 1/4"), std::string::npos) << out;
  EXPECT_EQ(out.find(" 2/4"), std::string::npos) << out;
  EXPECT_EQ(out.find(" 3/4"), std::string::npos) << out;
  EXPECT_NE(out.find(" 4/4"), std::string::npos) << out;
}

TEST(ProgressPrinter, ColourOnlyWhenAsked) {
  EXPECT_NE(render({true, true}, Verbosity::kNormal).find("\033[1mEpoch 1/2\033[0m"),
            std::string::npos);
}

TEST(ProgressPrinter, QuietPrintsNothingVerboseAddsLogLinesOnATerminal) {
  EXPECT_EQ(render({true, true}, Verbosity::kQuiet), "");
  EXPECT_EQ(render({false, false}, Verbosity::kQuiet), "");
  const std::string verbose = render({true, false}, Verbosity::kVerbose);
  EXPECT_NE(verbose.find("  epoch 1 step 2/4  loss 0.5000"), std::string::npos) << verbose;
  EXPECT_NE(verbose.find("test loss"), std::string::npos) << verbose;
}

// A library note that arrives while the progress line is on a terminal gets a line of its own (the
// line cleared first, as the CLI's own notes do), and the program's handler is back afterwards.
TEST(NotesBesideProgress, ALibraryNoteEndsTheProgressLineAndTheHandlerBeforeIsBackAfter) {
  std::vector<std::string> outside;
  const NoteHandler before =
      set_note_handler([&outside](const std::string& line) { outside.push_back(line); });
  std::ostringstream screen;  // the progress line's stream and the notes' both, as on a terminal
  {
    double now = 0;
    ProgressOptions options;
    options.style = {true, false};
    options.clock = [&now] { return now; };
    ProgressPrinter printer(screen, options);
    const NotesBesideProgress notes(printer, screen);
    now = 1;
    printer.on_step({1, 2, 1, 4, 8});  // draws "\repoch 1/2 [...] 1/4 ..."
    const std::string drawn = screen.str();
    ASSERT_NE(drawn.find("epoch 1/2"), std::string::npos) << drawn;
    note("the fused kernel refused");
    const std::string after = screen.str().substr(drawn.size());
    const size_t width = drawn.size() - drawn.rfind('\r') - 1;
    EXPECT_EQ(after, "\r" + std::string(width, ' ') + "\rnote: the fused kernel refused\n");
    EXPECT_TRUE(outside.empty());
  }
  note("after the run");
  EXPECT_EQ(outside, std::vector<std::string>{"after the run"});
  set_note_handler(before);
}

TEST(FormatDuration, MinutesAndHours) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(65.4), "1:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "?");
  // keep_tenths (a --time-budget's text): whole seconds as before, a fraction kept to tenths.
  EXPECT_EQ(format_duration(900, true), "15:00");
  EXPECT_EQ(format_duration(65, true), "1:05");
  EXPECT_EQ(format_duration(5400, true), "1:30:00");
  EXPECT_EQ(format_duration(12.5, true), "0:12.5");
  EXPECT_EQ(format_duration(-1, true), "?");
  EXPECT_EQ(format_duration(1e300), "?");  // no overflowing cast
}

}  // namespace
}  // namespace spritetorch::runs
