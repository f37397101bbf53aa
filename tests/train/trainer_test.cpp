#include "train/trainer.h"
#include "tasks/make_task.h"

#include <gtest/gtest.h>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/notes.h"
#include "precision/precision.h"
#include "test_util.h"
#include "train/lr_schedule.h"
#include "train/run_state.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

TrainConfig small_fashion_config() {
  TrainConfig c;
  c.device = "cpu";
  c.epochs = 1;
  c.train_limit = 6000;
  c.test_limit = 1000;
  return c;
}

TEST(Trainer, SeedNetworkOnARealSubsetBeatsChanceByFar) {
  SKIP_WITHOUT_FASHION_MNIST();
  const auto report = run_training(small_fashion_config());
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_EQ(report.epochs[0].samples, 6000);
  EXPECT_EQ(report.test.samples, 1000);
  EXPECT_GT(report.test.accuracy, 0.70) << "chance is 0.10";
  EXPECT_EQ(report.test.confusion.sum().item<int64_t>(), 1000);
  EXPECT_EQ(report.class_names.size(), 10u);
}

TEST(Trainer, CnnTrainsThroughAutograd) {
  SKIP_WITHOUT_FASHION_MNIST();
  auto c = small_fashion_config();
  c.model = "cnn";
  c.train_limit = 2000;
  c.test_limit = 500;
  const auto report = run_training(c);
  EXPECT_GT(report.test.accuracy, 0.60);
  bool autograd = false;
  std::string threads;
  for (const auto& [k, v] : report.settings) {
    autograd |= (k == "step" && v == "autograd");
    if (k == "threads") threads = v;
  }
  EXPECT_TRUE(autograd);
  // A conv net's default: LibTorch's pool gets the cores, BLAS one thread (cpu_threads.h).
  EXPECT_EQ(threads.rfind(std::to_string(cpu_cores()) + " intra-op, ", 0), 0u) << threads;
  if (current_cpu_threads().blas > 0) {
    EXPECT_NE(threads.find(", 1 BLAS"), std::string::npos) << threads;
  }
}

// The log lines of a run, with the lr each carries.
struct LrLog : TrainObserver {
  std::vector<StepLog> logs;
  void on_log(const StepLog& log) override { logs.push_back(log); }
};

// What --time-budget runs report: each plan and each epoch.
struct PlanLog : TrainObserver {
  std::vector<BudgetPlan> plans;
  std::vector<EpochReport> epochs;
  void on_plan(const BudgetPlan& plan) override { plans.push_back(plan); }
  void on_epoch(const EpochReport& report) override { epochs.push_back(report); }
};

// Seed 003's SimpleNN on the dummy data with SGD at 0.1 (64 steps per epoch of 64): milliseconds.
TrainConfig dummy_sgd_run(const ScratchDir* dir = nullptr, const std::string& save = "") {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.optimizer = "sgd";
  c.lr = 0.1;
  if (dir) c.save = dir->file(save);
  return c;
}

TEST(Trainer, SimpleNnLearnsTheDummyData) {
  TrainConfig c = dummy_sgd_run();
  c.epochs = 10;
  c.batch_size = 32;
  const auto report = run_training(c);
  EXPECT_GT(report.test.accuracy, 0.9);
  EXPECT_LT(report.epochs.back().loss, report.epochs.front().loss);
}

TEST(Trainer, ResumeContinuesExactlyWhereTheRunStopped) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 4;
  c.save = dir.file("straight.pt");
  run_training(c);

  c.epochs = 2;
  c.save = dir.file("half.pt");
  run_training(c);
  c.epochs = 4;
  c.model.clear();  // taken from the checkpoint
  c.resume = dir.file("half.pt");
  c.save = dir.file("resumed.pt");
  const auto report = run_training(c);
  EXPECT_EQ(report.start_epoch, 2);
  EXPECT_EQ(report.epochs.size(), 2u);

  const auto a = load_checkpoint(dir.file("straight.pt")),
             b = load_checkpoint(dir.file("resumed.pt"));
  for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;
  EXPECT_EQ(b.meta.at("epoch").get<int>(), 4);
}

// A resume with another --seed or precision than the run it continues does not give one longer
// run's weights: allowed, as another --lr is, with a note for each (a bf16 run resumed without
// --precision went on in fp32 without a word).
TEST(Trainer, AResumeWithAnotherSeedOrPrecisionSaysSo) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 1;
  c.seed = 1;
  c.precision = precision::Precision::kBf16;
  c.save = dir.file("bf16.pt");
  run_training(c);
  std::vector<std::string> notes;
  const NoteHandler before =
      set_note_handler([&](const std::string& line) { notes.push_back(line); });
  TrainConfig more = c;
  more.resume = c.save;
  more.save = dir.file("more.pt");
  more.epochs = 2;
  more.seed = 7;
  more.precision = precision::Precision::kFp32;
  run_training(more);
  more.seed = 1;  // as it was: no note
  more.precision = precision::Precision::kBf16;
  more.save = dir.file("same.pt");
  run_training(more);
  set_note_handler(before);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0], "--resume " + c.save +
                          " was trained with --seed 1; this run goes on with 7, so it shuffles "
                          "and draws as one longer run would not (pass --seed 1 to continue it as "
                          "it was)");
  EXPECT_EQ(notes[1], "--resume " + c.save +
                          " was trained in bf16; this run goes on in fp32 (pass --precision bf16 "
                          "to continue it as it was)");
}

// --lr-schedule step:N in a run of N epochs or fewer trains exactly as a constant lr: a note says
// so (not refused: a later --resume with more --epochs reaches the step).
TEST(Trainer, AStepScheduleThatNeverFiresIsANote) {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 2;
  c.train_limit = 256;
  std::vector<std::string> notes;
  const NoteHandler before =
      set_note_handler([&](const std::string& line) { notes.push_back(line); });
  c.lr_schedule = "step:2";
  run_training(c);
  c.lr_schedule = "step:1";  // fires after epoch 1: no note
  run_training(c);
  set_note_handler(before);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0],
            "--lr-schedule step:2 first lowers the lr after epoch 2, and this run ends after "
            "epoch 2: its lr stays --lr (a --resume with more --epochs reaches the step)");
}

TEST(Trainer, ResumingWithAnotherModelIsAnError) {
  ScratchDir dir;
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 1;
  c.save = dir.file("s.pt");
  run_training(c);
  c.model = "ann";
  c.resume = dir.file("s.pt");
  EXPECT_THROW(run_training(c), Error);
}

double max_weight_difference(const std::string& a_path, const std::string& b_path) {
  const auto a = load_checkpoint(a_path), b = load_checkpoint(b_path);
  double worst = 0;
  for (const auto& [name, t] : a.model)
    worst = std::max(worst, (t - b.model.at(name)).abs().max().item<double>());
  return worst;
}

// `c` run again keeping a periodic checkpoint after epoch 2 (64 steps an epoch of dummy_sgd_run),
// and the run that resumes from it into dir's "resumed.pt", to be run by the caller.
TrainConfig resumed_after_two_epochs(const TrainConfig& c, const ScratchDir& dir) {
  TrainConfig again = c;
  again.checkpoint_every = 2 * 64;
  again.save = dir.file("again.pt");
  run_training(again);
  TrainConfig resumed = c;
  resumed.model.clear();
  resumed.resume = periodic_checkpoint_path(again.save, 2 * 64);
  resumed.save = dir.file("resumed.pt");
  return resumed;
}

TEST(Trainer, LrScheduleIsAFunctionOfTheGlobalStepSoResumeContinuesIt) {
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "straight.pt");
  c.lr_schedule = "cosine";
  c.warmup_steps = 10;
  c.weight_decay = 0.01;
  c.epochs = 4;
  const auto report = run_training(c);
  bool described = false;
  for (const auto& [k, v] : report.settings)
    described |= k == "optimizer" &&
                 v.find("weight decay 0.01, cosine, warm-up 10 steps") != std::string::npos;
  EXPECT_TRUE(described);

  // The same run again, keeping a checkpoint after epoch 2 (64 steps per epoch), resumed from it:
  // the second half must follow the same curve (its lr from the global step, not from zero).
  run_training(resumed_after_two_epochs(c, dir));
  EXPECT_EQ(max_weight_difference(dir.file("straight.pt"), dir.file("resumed.pt")), 0.0);

  TrainConfig constant = dummy_sgd_run(&dir, "constant.pt");
  constant.epochs = 4;
  constant.weight_decay = 0.01;
  run_training(constant);
  EXPECT_GT(max_weight_difference(dir.file("straight.pt"), dir.file("constant.pt")), 1e-3)
      << "the schedule changed nothing";
}

// --time-budget: a budget no step fits in ends the run after the epoch in progress when the plan is
// made (the first: 128 steps an epoch, the plan after 70), and the schedule it follows is that of
// the planned length (the plan falls inside the lr warm-up), so it equals a run asked for that many
// epochs.
TEST(Trainer, TimeBudgetPlansTheEpochsThatFitAndTheScheduleFollows) {
  PlanLog observer;
  ScratchDir dir;
  TrainConfig budget = dummy_sgd_run(&dir, "budget.pt");
  budget.batch_size = 32;  // 128 steps an epoch
  budget.lr_schedule = "cosine";
  budget.warmup_steps = 80;
  budget.epochs = 20;
  budget.time_budget_s = 1e-9;
  const auto report = run_training(budget, &observer);
  ASSERT_TRUE(report.budget.has_value());
  ASSERT_EQ(kBudgetSkipSteps + kBudgetTimedSteps, 70);
  EXPECT_EQ(report.budget->epochs, 1);
  EXPECT_EQ(report.budget->max_epochs, 20);
  EXPECT_EQ(report.budget->steps, 128);
  EXPECT_TRUE(report.budget->spent);
  EXPECT_EQ(report.budget->timed_steps, 113 - kBudgetSkipSteps);  // every step since the skip
  EXPECT_GT(report.budget->seconds_per_step, 0);
  // Revised halfway through its 58 steps left and halfway through the 29 left then; nothing fits
  // any more, so each revision keeps the epoch in progress.
  ASSERT_EQ(observer.plans.size(), 3u);
  EXPECT_EQ(observer.plans.at(0).timed_steps, kBudgetTimedSteps);
  EXPECT_EQ(observer.plans.at(1).revised_at_step, 99);
  EXPECT_EQ(observer.plans.at(2).revised_at_step, 113);
  EXPECT_EQ(report.budget->revisions, 2);
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_EQ(observer.epochs.at(0).epochs, 1);  // the planned length
  EXPECT_EQ(load_checkpoint(budget.save).meta.at("epoch").get<int64_t>(), 1);
  bool described = false;
  for (const auto& [k, v] : report.settings) described |= k == "time budget";
  EXPECT_TRUE(described);

  TrainConfig one = budget;
  one.save = dir.file("one.pt");
  one.epochs = 1;
  one.time_budget_s = 0;
  EXPECT_FALSE(run_training(one).budget.has_value());
  EXPECT_EQ(max_weight_difference(budget.save, one.save), 0.0);

  TrainConfig ample = budget;  // everything fits: --epochs as asked
  ample.save.clear();
  ample.epochs = 3;
  ample.time_budget_s = 1e9;
  const auto all = run_training(ample);
  ASSERT_TRUE(all.budget.has_value());
  EXPECT_EQ(all.budget->epochs, 3);
  EXPECT_EQ(all.epochs.size(), 3u);
}

// A run sized by --time-budget and resumed goes on with its plan (kept in its checkpoints), even
// where the resumed process's own --epochs and budget would allow more: the same weights as the
// run never interrupted.
TEST(Trainer, AResumedRunKeepsThePlanOfTheRunItContinues) {
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "straight.pt");  // 64 steps an epoch
  c.lr_schedule = "cosine";
  c.warmup_steps = 80;
  c.epochs = 4;
  c.time_budget_s = 1e9;  // everything fits: the plan is the 4 epochs
  const auto straight = run_training(c);
  ASSERT_TRUE(straight.budget.has_value());
  ASSERT_EQ(straight.budget->epochs, 4);

  TrainConfig resumed = resumed_after_two_epochs(c, dir);
  resumed.epochs = 40;  // a new plan would take 40 epochs and stretch the cosine
  const auto report = run_training(resumed);
  ASSERT_TRUE(report.budget.has_value());
  EXPECT_EQ(report.budget->epochs, 4);
  ASSERT_FALSE(report.epochs.empty());
  EXPECT_EQ(report.epochs.back().epoch, 4);
  EXPECT_EQ(report.epochs.back().epochs, 4);
  EXPECT_EQ(max_weight_difference(c.save, resumed.save), 0.0);
}

// `path` with its run state's training seconds set to `seconds` (erased when negative: a
// checkpoint from before they were kept).
void set_checkpoint_train_seconds(const std::string& path, double seconds) {
  Checkpoint checkpoint = load_checkpoint(path);
  if (seconds < 0)
    checkpoint.meta.at("run").erase("train_seconds");
  else
    checkpoint.meta.at("run")["train_seconds"] = seconds;
  save_checkpoint(path, checkpoint);
}

// A resumed --time-budget run re-times its own steps and revises its plan from them (revision 1
// after this process's steps 11-70, then halfway), and the budget is the whole run's training
// time: the seconds its checkpoint records count against it, and a --time-budget other than the
// plan's applies at once.
TEST(Trainer, AResumedBudgetCountsTheTimeTrainedAndKeepsRevising) {
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "straight.pt");  // 64 steps an epoch
  c.lr_schedule = "cosine";
  c.warmup_steps = 80;
  c.epochs = 8;
  c.time_budget_s = 1e9;  // everything fits: the plan is the 8 epochs
  const TrainConfig resumed = resumed_after_two_epochs(c, dir);
  const Checkpoint at_two = load_checkpoint(resumed.resume);
  ASSERT_EQ(budget_from_json(at_two.meta.at("time_budget"), "x").revisions, 0);
  const double trained_before = at_two.meta.at("run").at("train_seconds").get<double>();
  EXPECT_GT(trained_before, 0);

  PlanLog same;
  const auto goes_on = run_training(resumed, &same);
  ASSERT_GE(same.plans.size(), 2u);
  EXPECT_EQ(same.plans.at(0).revised_at_step, kBudgetSkipSteps + kBudgetTimedSteps);
  EXPECT_EQ(same.plans.at(0).revisions, 1);
  EXPECT_EQ(same.plans.at(0).steps, 6 * 64);  // this process's steps of the plan
  EXPECT_EQ(same.plans.at(1).revised_at_step, 70 + (6 * 64 - 70) / 2);
  ASSERT_TRUE(goes_on.budget.has_value());
  EXPECT_EQ(goes_on.budget->epochs, 8);
  EXPECT_GE(goes_on.train_seconds, trained_before);
  // The final checkpoint keeps the newest revision.
  EXPECT_EQ(budget_from_json(load_checkpoint(resumed.save).meta.at("time_budget"), "x").revisions,
            goes_on.budget->revisions);

  // The budget spent before the checkpoint: the revision after this process's 70 steps (in the
  // fourth epoch) ends the run with that epoch.
  set_checkpoint_train_seconds(resumed.resume, 1e9);
  TrainConfig spent = resumed;
  spent.save = dir.file("spent.pt");
  const auto stopped = run_training(spent);
  ASSERT_TRUE(stopped.budget.has_value());
  EXPECT_EQ(stopped.budget->epochs, 4);
  ASSERT_FALSE(stopped.epochs.empty());
  EXPECT_EQ(stopped.epochs.back().epoch, 4);
  EXPECT_EQ(stopped.steps, 4 * 64);

  // A smaller --time-budget on resume, already used up: the epoch in progress (the second, whose
  // steps were all done) is the last.
  set_checkpoint_train_seconds(resumed.resume, trained_before);
  TrainConfig smaller = resumed;
  smaller.save = dir.file("smaller.pt");
  smaller.time_budget_s = 1e-9;
  const auto cut = run_training(smaller);
  ASSERT_TRUE(cut.budget.has_value());
  EXPECT_EQ(cut.budget->budget_s, 1e-9);
  EXPECT_EQ(cut.budget->epochs, 2);
  EXPECT_EQ(cut.steps, 2 * 64);
}

// A finished --time-budget run resumed with more --epochs and a larger --time-budget plans again
// at once: the epochs that fit are trained. With the same budget it keeps its plan, and the error
// says the plan (not --epochs) is what ends it; with the budget spent, the same.
TEST(Trainer, AResumedBudgetPlansAgainForALargerBudgetAndSaysWhatEndsIt) {
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "two.pt");  // 64 steps an epoch
  c.epochs = 2;
  c.time_budget_s = 1e9;
  run_training(c);
  TrainConfig more = c;
  more.model.clear();
  more.resume = c.save;
  more.save = dir.file("same.pt");
  more.epochs = 4;
  const auto expected = "nothing to train: " + c.save +
                        " has 2 epochs done, and the run has 2: the plan of its --time-budget";
  std::string message = testing::error_of([&] { run_training(more); });
  EXPECT_NE(message.find(expected), std::string::npos) << message;

  more.time_budget_s = 2e9;
  more.save = dir.file("four.pt");
  const auto report = run_training(more);
  ASSERT_TRUE(report.budget.has_value());
  EXPECT_EQ(report.budget->epochs, 4);
  EXPECT_EQ(report.epochs.size(), 2u);
  EXPECT_EQ(report.steps, 4 * 64);

  set_checkpoint_train_seconds(c.save, 3e9);  // more than the larger budget: none left
  more.save = dir.file("spent.pt");
  message = testing::error_of([&] { run_training(more); });
  EXPECT_NE(message.find(expected), std::string::npos) << message;
}

// The run's training time is the whole run's: a resumed run's clock starts from the seconds its
// checkpoint records, so train_seconds and the time to a target accuracy count what came before.
// A checkpoint from before they were kept resumes from 0.
TEST(Trainer, AResumedRunsTrainingTimeCountsTheTimeBeforeItsCheckpoint) {
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "straight.pt");
  c.epochs = 3;
  c.target_accuracy = 0.01;  // reached at the first evaluation
  c.stop_at_target = false;
  TrainConfig resumed = resumed_after_two_epochs(c, dir);
  EXPECT_GT(load_checkpoint(resumed.resume).meta.at("run").at("train_seconds").get<double>(), 0);
  set_checkpoint_train_seconds(resumed.resume, 1000);
  const auto report = run_training(resumed);
  EXPECT_EQ(report.steps, 3 * 64);
  EXPECT_GE(report.train_seconds, 1000);
  EXPECT_LT(report.train_seconds, 1100);
  ASSERT_TRUE(report.target_reached.has_value());
  EXPECT_GE(report.target_reached->train_seconds, 1000);
  // The final checkpoint records it for the next resume, in its run state and its metadata.
  const Checkpoint saved = load_checkpoint(resumed.save);
  EXPECT_DOUBLE_EQ(saved.meta.at("run").at("train_seconds").get<double>(), report.train_seconds);
  EXPECT_DOUBLE_EQ(saved.meta.at("train_seconds").get<double>(), report.train_seconds);

  set_checkpoint_train_seconds(resumed.resume, -1);  // an older checkpoint: no field
  resumed.save = dir.file("older.pt");
  EXPECT_LT(run_training(resumed).train_seconds, 1000);
}

TEST(Trainer, ARunTooShortToTimeTrainsItsEpochs) {
  TrainConfig c = dummy_sgd_run();
  c.train_limit = 640;  // 10 steps an epoch, 30 in all: fewer than the plan needs (70)
  c.epochs = 3;
  c.time_budget_s = 1e9;
  const auto report = run_training(c);
  EXPECT_FALSE(report.budget.has_value());
  EXPECT_EQ(report.epochs.size(), 3u);
}

// A budget used up before the steps are timed (10 steps an epoch: the plan would come in epoch 8)
// is not overrun by the epochs the timing would take: a plan that says so ends the run with the
// epoch in progress, and the epoch lines and the schedule take its length.
TEST(Trainer, ABudgetUsedUpBeforeItsStepsAreTimedEndsTheRunWithTheEpoch) {
  PlanLog observer;
  TrainConfig c = dummy_sgd_run();
  c.train_limit = 640;
  c.epochs = 20;
  c.time_budget_s = 1e-9;
  const auto report = run_training(c, &observer);
  ASSERT_TRUE(report.budget.has_value());
  EXPECT_TRUE(report.budget->spent);
  EXPECT_EQ(report.budget->epochs, 1);
  EXPECT_EQ(report.budget->max_epochs, 20);
  EXPECT_EQ(report.budget->steps, 10);
  EXPECT_EQ(report.budget->timed_steps, 0);  // the clock starts after step 10
  EXPECT_GT(report.budget->seconds_per_step, 0);
  EXPECT_EQ(report.epochs.size(), 1u);
  ASSERT_EQ(observer.plans.size(), 1u);
  ASSERT_EQ(observer.epochs.size(), 1u);
  EXPECT_EQ(observer.epochs.at(0).epochs, 1);
  EXPECT_TRUE(budget_from_json(budget_json(*report.budget), "x.pt").spent);
}

// A plan that cuts the run below its warm-up (20 epochs would have outlasted it) says so: the lr
// of the planned run never reaches --lr.
TEST(Trainer, APlanShorterThanTheWarmUpSaysTheLrNeverReachesItsPeak) {
  PlanLog observer;
  TrainConfig c = dummy_sgd_run();
  c.train_limit = 640;  // 10 steps an epoch
  c.epochs = 20;
  c.lr_schedule = "cosine";
  c.warmup_steps = 100;
  c.warmup_steps_origin = "--recipe fast";
  c.time_budget_s = 1e-9;  // used up at the end of epoch 1
  const auto report = run_training(c, &observer);
  ASSERT_EQ(observer.plans.size(), 1u);
  EXPECT_EQ(observer.plans.at(0).epochs, 1);
  EXPECT_EQ(observer.plans.at(0).warmup_steps, 100);
  EXPECT_DOUBLE_EQ(observer.plans.at(0).warmup_lr_share, 0.1);
  EXPECT_TRUE(budget_json(*report.budget).at("warmup_spans_run").get<bool>());
  for (const auto& [k, v] : report.settings) EXPECT_NE(k, "warm-up");  // 200 steps outlast it

  c.warmup_steps = 5;  // within the planned epoch
  PlanLog within;
  const auto short_warmup = run_training(c, &within);
  ASSERT_EQ(within.plans.size(), 1u);
  EXPECT_EQ(within.plans.at(0).warmup_steps, 0);
  EXPECT_FALSE(budget_json(*short_warmup.budget).at("warmup_spans_run").get<bool>());
}

// The error's message and hint of a run that is refused; "" when it trains.
std::string trainer_refusal(const TrainConfig& c) {
  try {
    run_training(c);
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}

// A warm-up longer than the run would keep the lr below --lr to the end: refused when chosen; when
// a recipe filled it in (warmup_steps_origin) the run trains and its settings say so. Under
// --time-budget the run's most steps count. One as long as the run reaches --lr at its last step.
TEST(Trainer, AWarmUpSpanningTheWholeRunIsRefusedWhenChosenAndNotedWhenNot) {
  TrainConfig c = dummy_sgd_run();  // 64 steps an epoch
  c.lr_schedule = "cosine";
  c.epochs = 2;
  c.warmup_steps = 1000;
  EXPECT_EQ(trainer_refusal(c),
            "--warmup-steps 1000 spans the whole run (128 steps: 2 epochs of 64): the lr only "
            "reaches 13% of --lr 0.1, at the last step | pass a --warmup-steps below 128 (a tenth "
            "of the run's steps or less is usual), or more --epochs");
  c.warmup_steps = 129;
  EXPECT_NE(trainer_refusal(c).find("--warmup-steps 129 spans the whole run"), std::string::npos);
  c.time_budget_s = 1e9;
  EXPECT_NE(trainer_refusal(c).find("(at most 128 steps: 2 epochs of 64)"), std::string::npos);
  c.time_budget_s = 0;
  c.warmup_steps = 128;
  EXPECT_EQ(trainer_refusal(c), "");

  c.warmup_steps = 6400;
  c.warmup_steps_origin = "--recipe fast";
  const auto noted = run_training(c);
  std::string row;
  for (const auto& [k, v] : noted.settings)
    if (k == "warm-up") row = v;
  EXPECT_EQ(row,
            "--recipe fast's 6400 warm-up steps span the whole run (128 steps: 2 epochs of 64): "
            "the lr only reaches 2% of --lr 0.1, at the last step (--warmup-steps sets the "
            "warm-up)");
  c.warmup_steps = 128;
  for (const auto& [k, v] : run_training(c).settings) EXPECT_NE(k, "warm-up");
}

// One epoch on 32 procedural 16x16 sprites on the CPU: for options refused before training.
TrainConfig few_sprites_run() {
  TrainConfig c;
  c.device = "cpu";
  c.dataset = "sprites";
  c.sprites.count = 32;
  c.epochs = 1;
  return c;
}

// A cutout square as wide as the images blanks most of each (all of it from 2 sides - 1), as a
// shift of half their side moves most out of the frame: both refused before training.
TEST(Trainer, ACutoutAsWideAsTheImagesIsRefused) {
  TrainConfig c = few_sprites_run();  // 16x16
  c.augment = "flip,cutout:16";
  EXPECT_NE(
      trainer_refusal(c).find("--augment flip,cutout:16: a cutout of 16 pixels blanks most of each "
                              "of "),
      std::string::npos)
      << trainer_refusal(c);
  EXPECT_EQ(trainer_refusal(c).find("all of it"), std::string::npos);
  c.augment = "cutout:31";
  EXPECT_NE(
      trainer_refusal(c).find("16x16 images (all of it, wherever the square falls) | cut out a "
                              "square smaller than the image's side"),
      std::string::npos)
      << trainer_refusal(c);
  c.augment = "cutout:15";
  EXPECT_EQ(trainer_refusal(c), "");
}

// Without a test set the options that act on it would do nothing: refused, as --target-accuracy.
TEST(Trainer, TestSetOptionsAreRefusedWithoutATestSet) {
  TrainConfig c = few_sprites_run();
  c.sprites.holdout = 0;
  c.eval_every_steps = 2;
  EXPECT_EQ(trainer_refusal(c),
            "--eval-every-steps evaluates the test set; this run has none | drop "
            "--eval-every-steps, or hold out a test set (--holdout for sprite sets)");
  c.eval_every_steps = 0;
  c.test_limit = 10;
  EXPECT_EQ(trainer_refusal(c),
            "--test-limit limits the test set; this run has none | drop --test-limit, or hold out "
            "a test set (--holdout for sprite sets)");
  c.test_limit = 0;
  EXPECT_EQ(trainer_refusal(c), "");
}

TEST(Trainer, LogLinesCarryTheScheduledLr) {
  LrLog observer;
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "s.pt");
  c.epochs = 2;  // 64 steps each
  c.log_every = 16;
  c.lr_schedule = "cosine";
  c.warmup_steps = 20;
  run_training(c, &observer);
  ASSERT_EQ(observer.logs.size(), 8u);
  const auto schedule = parse_lr_schedule("cosine", 20);
  for (const auto& log : observer.logs) {
    const int64_t last_step = (log.epoch - 1) * 64 + log.step - 1;  // 0-based, the interval's last
    EXPECT_DOUBLE_EQ(log.lr, 0.1 * lr_factor(schedule, last_step, log.epoch - 1, 128)) << last_step;
  }
  EXPECT_DOUBLE_EQ(observer.logs[0].lr, 0.1 * 16 / 20);  // still warming up
}

// An end-of-run checkpoint may be resumed with another --batch-size: the schedule goes on from the
// global step (64 steps of 64 before, 32 of 128 now: 96 in all), not from epoch x the new steps.
TEST(Trainer, AResumeWithAnotherBatchSizeContinuesTheScheduleFromTheGlobalStep) {
  LrLog observer;
  ScratchDir dir;
  TrainConfig first = dummy_sgd_run(&dir, "first.pt");
  first.epochs = 1;
  first.lr_schedule = "cosine";
  first.warmup_steps = 20;
  run_training(first);
  TrainConfig more = dummy_sgd_run(&dir, "more.pt");
  more.lr_schedule = "cosine";
  more.warmup_steps = 20;
  more.resume = first.save;
  more.epochs = 2;
  more.batch_size = 128;
  more.log_every = 8;
  run_training(more, &observer);
  ASSERT_EQ(observer.logs.size(), 4u);
  const auto schedule = parse_lr_schedule("cosine", 20);
  for (const auto& log : observer.logs) {
    EXPECT_EQ(log.global_step, 64 + log.step);
    EXPECT_DOUBLE_EQ(log.lr, 0.1 * lr_factor(schedule, log.global_step - 1, 1, 96))
        << log.global_step;
  }
  EXPECT_LT(observer.logs[0].lr, 0.1 * 0.5);  // past the warm-up and the cosine's middle
}

TEST(Trainer, StepScheduleScalesTheLrAtEpochBoundaries) {
  // Gamma 1e-12 after epoch 1: epoch 2's updates are ~1e-13 of epoch 1's, so two epochs end where
  // one did. A schedule the loop ignored would move the weights a full epoch further.
  ScratchDir dir;
  TrainConfig one = dummy_sgd_run(&dir, "one.pt");
  one.epochs = 1;
  run_training(one);
  TrainConfig two = dummy_sgd_run(&dir, "two.pt");
  two.epochs = 2;
  two.lr_schedule = "step:1:1e-12";
  run_training(two);
  EXPECT_LT(max_weight_difference(dir.file("one.pt"), dir.file("two.pt")), 1e-6);
  TrainConfig plain = dummy_sgd_run(&dir, "plain.pt");
  plain.epochs = 2;
  run_training(plain);
  EXPECT_GT(max_weight_difference(dir.file("one.pt"), dir.file("plain.pt")), 1e-3);
}

TEST(Trainer, ResumingWithAnotherOptimizerIsAnErrorNamingBoth) {
  ScratchDir dir;
  TrainConfig c = dummy_sgd_run(&dir, "s.pt");
  c.epochs = 1;
  run_training(c);
  c.optimizer = "adam";
  c.epochs = 2;
  c.resume = dir.file("s.pt");
  c.save = dir.file("t.pt");
  try {
    run_training(c);
    ADD_FAILURE() << "resumed an sgd checkpoint with adam";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trained with --optimizer sgd but this run asks for adam"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("--optimizer sgd"), std::string::npos) << e.hint();
  }
}

TEST(Trainer, UnavailableDeviceFailsBeforeAnyWork) {
  TrainConfig c;
  c.device = "cuda:9";
  c.dataset = "dummy";
  c.model = "simplenn";
  EXPECT_THROW(run_training(c), Error);
}

}  // namespace
}  // namespace spritetorch::train
