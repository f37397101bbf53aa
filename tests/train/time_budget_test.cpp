#include "train/time_budget.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace spritetorch::train {
namespace {

TEST(TimeBudget, DurationsReadWithOrWithoutUnits) {
  EXPECT_DOUBLE_EQ(parse_duration("900"), 900);
  EXPECT_DOUBLE_EQ(parse_duration("900s"), 900);
  EXPECT_DOUBLE_EQ(parse_duration("15m"), 900);
  EXPECT_DOUBLE_EQ(parse_duration("1.5h"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("2m30"), 150);  // a bare number at the end: seconds
  EXPECT_DOUBLE_EQ(parse_duration("0.5"), 0.5);
  EXPECT_DOUBLE_EQ(parse_duration("0"), 0);
}

TEST(TimeBudget, ABadDurationIsAnErrorNamingTheFlagAndTheText) {
  // Units once each, largest first; decimal numbers only (no hex).
  for (const std::string text : {"", "m", "15x", "15 m", "-5", "15ms", "1h 30m", "30 1m", "nan",
                                 "5m5m", "30s1h", "1m2h", "0x10", "1.2.3m", "."}) {
    try {
      parse_duration(text, "--time-budget");
      ADD_FAILURE() << "'" << text << "' was read";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--time-budget: '" + text + "' is not a duration"), std::string::npos)
          << what;
      EXPECT_NE(what.find("15m"), std::string::npos) << what;  // says what is expected
    }
  }
}

// The CLI's parser names the flag itself: without one the message starts at the text.
TEST(TimeBudget, WithoutAFlagTheMessageStartsAtTheText) {
  try {
    parse_duration("soon", "");
    ADD_FAILURE() << "'soon' was read";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("'soon' is not a duration", 0), 0u) << e.what();
  }
}

TEST(TimeBudget, ABudgetBeyondAYearIsAnError) {
  EXPECT_DOUBLE_EQ(parse_duration("8760h"), 8760 * 3600.0);
  for (const std::string text : {"8761h", "1e300", "99999999999999999999"}) {
    try {
      parse_duration(text, "--time-budget");
      ADD_FAILURE() << "'" << text << "' was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--time-budget: '" + text + "' is longer than a year"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("at most 8760h"), std::string::npos) << e.what();
    }
  }
}

TEST(TimeBudget, EpochsAreWhatFitsBetweenTheEpochInProgressAndTheMost) {
  // 100 s allowed, 10 used by 35 steps, 0.1 s a step: 35 + 900 = 935 steps, 9 epochs of 100.
  BudgetInput in{100, 10, 0.1, 35, 100, 0, 0, 50};
  EXPECT_EQ(epochs_within_budget(in), 9);
  in.max_epochs = 5;  // never more than --epochs
  EXPECT_EQ(epochs_within_budget(in), 5);
  in.max_epochs = 50;
  in.used_s = 200;  // over budget already: the epoch in progress ends the run
  in.current_epoch = 3;
  EXPECT_EQ(epochs_within_budget(in), 4);
  // Resumed after 20 epochs: those count towards --epochs, not towards this run's time.
  in = {100, 10, 0.1, 35, 100, 20, 20, 50};
  EXPECT_EQ(epochs_within_budget(in), 29);
  in.seconds_per_step = 0;  // no speed measured: --epochs as asked
  EXPECT_EQ(epochs_within_budget(in), 50);
}

// The DCSS generator's plan (15 minutes, 14 steps an epoch, 0.208 s a step over steps 11-70) when
// its steps turn out to take 0.224 s: halfway, the revision fits the rest in the budget.
TEST(TimeBudget, APlanIsRevisedHalfwayThroughWhatItHasLeftTwice) {
  BudgetPlan plan;
  plan.budget_s = 900;
  plan.seconds_per_step = 0.208;
  plan.timed_steps = kBudgetTimedSteps;
  plan.epochs = 309;
  plan.max_epochs = 322;
  plan.steps = 4326;
  const int64_t first = next_budget_revision(plan, 70);
  EXPECT_EQ(first, 70 + (4326 - 70) / 2);
  // 492.4 s used by 2198 steps at 0.224 s: floor(407.6 / 0.224) = 1819 steps more, 4017 in all,
  // 286 whole epochs (4004 steps, 897 s at that speed).
  const BudgetPlan revised =
      revise_budget_plan(plan, {900, 492.4, 0.224, first, 14, 0, first / 14, 322}, first - 10);
  EXPECT_EQ(revised.epochs, 286);
  EXPECT_EQ(revised.steps, 4004);
  EXPECT_EQ(revised.revisions, 1);
  EXPECT_EQ(revised.revised_at_step, first);
  EXPECT_DOUBLE_EQ(revised.seconds_per_step, 0.224);
  EXPECT_EQ(revised.timed_steps, first - 10);
  EXPECT_EQ(revised.budget_s, 900);
  EXPECT_EQ(revised.max_epochs, 322);
  const int64_t second = next_budget_revision(revised, first);
  EXPECT_EQ(second, first + (4004 - first) / 2);
  // Faster than feared: the second revision gives steps back, up to --epochs.
  const BudgetPlan again =
      revise_budget_plan(revised, {900, 600, 0.1, second, 14, 0, second / 14, 322}, second - 10);
  EXPECT_EQ(again.epochs, 322);
  EXPECT_EQ(again.revisions, 2);
  EXPECT_EQ(next_budget_revision(again, second), 0);  // kBudgetRevisions reached
  // Its JSON carries the revisions; a checkpoint's plan from before them reads as unrevised.
  EXPECT_EQ(budget_from_json(budget_json(again), "x.pt").revisions, 2);
  nlohmann::json old = budget_json(plan);
  old.erase("revisions");
  EXPECT_EQ(budget_from_json(old, "old.pt").revisions, 0);
  // Nothing left to revise: the plan's last step reached.
  EXPECT_EQ(next_budget_revision(plan, 4326), 0);
}

}  // namespace
}  // namespace spritetorch::train
