// --time-budget: a run sized to a length of training time instead of a number of epochs. The
// Trainer times the run's own steps early on (kBudgetSkipSteps, then kBudgetTimedSteps), and
// from that speed plans how many epochs fit, at most the run's --epochs. The plan is made inside
// the learning-rate warm-up of the default schedules, so the schedule the run follows is the one
// of the planned length: a cosine decay still ends at the last step. A generator without
// --epochs takes a budget by default (diffusion/generator_task.h), so its defaults fit a slow CPU
// and take more steps on a fast one.
//
// The speed of 60 early steps is not the run's: on a 2-core Zen 4 15-minute generator runs went
// 2-8% over their budget, their steps that much slower than the timed ones (the shared machine's
// noise: the step itself does not slow down; flushing denormals changed nothing). So the plan is
// revised twice, halfway through its steps and halfway through the rest, from the speed of every
// step timed so far. Each revision moves the end of the cosine decay by a few per cent: the lr
// jumps by as much, once.
//
// The budget is the whole run's training time: a resumed run goes on with its checkpoint's plan,
// counts the time trained before against it, and revises the plan from its own steps' speed
// (TrainingRun::continue_budget_plan in trainer.cpp).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace spritetorch::train {

// Steps not timed (the first allocations, autocast's weight casts, thread pools waking), then the
// steps timed for the plan.
constexpr int64_t kBudgetSkipSteps = 10;
constexpr int64_t kBudgetTimedSteps = 60;

// "900", "900s", "15m", "1.5h", "1h30m" -> seconds; "0" -> 0 (no budget). Throws Error naming
// `flag` (none when empty) and the text when it is not a non-negative duration of at most a year.
double parse_duration(const std::string& text, const std::string& flag = "--time-budget");

struct BudgetInput {
  double budget_s = 0;          // training time allowed the whole run
  double used_s = 0;            // training time the run has taken so far (resumed: in all)
  double seconds_per_step = 0;  // measured
  int64_t steps_done = 0;       // optimizer steps since start_epoch began
  int64_t steps_per_epoch = 1;
  int64_t start_epoch = 0;    // epochs done before this run (resumed)
  int64_t current_epoch = 0;  // 0-based epoch in progress
  int64_t max_epochs = 1;     // --epochs: the plan never exceeds it
};

// Revisions of a plan: at most this many, each halfway through the steps its plan has left.
constexpr int64_t kBudgetRevisions = 2;

// The plan made from the speed of the run's first steps, and revised from the speed of more.
struct BudgetPlan {
  double budget_s = 0;          // training time allowed the whole run (resumed: the newest)
  double seconds_per_step = 0;  // measured over timed_steps steps
  int64_t timed_steps = 0;
  int64_t epochs = 0;           // planned, in total as --epochs counts them
  int64_t max_epochs = 0;       // --epochs
  int64_t steps = 0;            // optimizer steps of the planned run (this process)
  int64_t revisions = 0;        // how often it was revised (resumed: by every process)
  int64_t revised_at_step = 0;  // this process's step of the last revision (0: none)
  // The budget was used up when the plan was made (a budget shorter than the steps timed for it):
  // the run ends with the epoch in progress.
  bool spent = false;
  // The schedule's warm-up when it is at least as long as the planned run (a budget that plans
  // fewer steps than the warm-up's): the lr never reaches --lr, only warmup_lr_share of it at the
  // last step. 0 when the warm-up ends within the run.
  int64_t warmup_steps = 0;
  double warmup_lr_share = 1;
};

// A share of --lr (0.48, 0.016) as the warm-up's lines print it: "48", "1.6" (whole per cents from
// 10%, two significant digits below).
std::string lr_percent_text(double share);

// This process's step at which `plan` is next revised: halfway from `steps_done` (the step the
// plan was made or last revised at) to its last step; 0 when it is revised no more
// (`max_revisions` reached, or no step left). A resumed run allows its own revisions on top of
// those its plan had.
int64_t next_budget_revision(const BudgetPlan& plan, int64_t steps_done,
                             int64_t max_revisions = kBudgetRevisions);

// `plan` revised at `in` (in.seconds_per_step measured over `timed_steps` steps): the epochs that
// fit in what is left of in.budget_s (epochs_within_budget), one revision more.
BudgetPlan revise_budget_plan(const BudgetPlan& plan, const BudgetInput& in, int64_t timed_steps);

// {"budget_s", "seconds_per_step", "timed_steps", "epochs", "max_epochs", "steps", "revisions",
// "spent", "warmup_spans_run"}:
// for --json and summary.json.
nlohmann::json budget_json(const BudgetPlan& plan);

// budget_json's object back (a checkpoint's "time_budget"); a DataError naming `source` when it is
// not one.
BudgetPlan budget_from_json(const nlohmann::json& json, const std::string& source);

// The epochs (in total, as --epochs counts them) whose steps fit in what is left of the budget at
// the measured speed: at least the one in progress, at most max_epochs.
int64_t epochs_within_budget(const BudgetInput& in);

}  // namespace spritetorch::train
