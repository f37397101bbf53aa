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
  for (const std::string text : {"", "m", "15x", "15 m", "-5", "15ms", "1h 30m", "30 1m", "nan"}) {
    try {
      parse_duration(text, "--time-budget");
      ADD_FAILURE() << "'" << text << "' was read";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--time-budget '" + text + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("15m"), std::string::npos) << what;  // says what is expected
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

}  // namespace
}  // namespace spritetorch::train
