#include "train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "train/optimization.h"

namespace spritetorch::train {
namespace {

TEST(LrSchedule, ParsesTheFourFormsAndRefusesTheRestByName) {
  EXPECT_TRUE(parse_lr_schedule("constant").constant());
  EXPECT_FALSE(parse_lr_schedule("constant", 5).constant()) << "a warm-up is a schedule";
  EXPECT_EQ(parse_lr_schedule("cosine").kind, LrSchedule::Kind::kCosine);
  const auto every3 = parse_lr_schedule("step:3");
  EXPECT_EQ(every3.kind, LrSchedule::Kind::kStep);
  EXPECT_EQ(every3.every_epochs, 3);
  EXPECT_DOUBLE_EQ(every3.gamma, 0.1);
  EXPECT_DOUBLE_EQ(parse_lr_schedule("step:2:0.5").gamma, 0.5);
  for (const char* bad : {"", "linear", "step", "step:", "step:0", "step:-1", "step:2:0",
                          "step:2:1.5", "step:2x", "step:2:0.5x", "step:2;0.5", "cosine:3"}) {
    try {
      parse_lr_schedule(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(parse_lr_schedule("cosine", -1), Error);
}

TEST(LrSchedule, ConstantIsOneEverywhere) {
  const auto s = parse_lr_schedule("constant");
  for (int64_t step : {0, 1, 99, 1000}) EXPECT_EQ(lr_factor(s, step, step / 10, 100), 1.0);
}

TEST(LrSchedule, WarmUpRisesLinearlyToTheFullRate) {
  const auto s = parse_lr_schedule("constant", 4);
  EXPECT_DOUBLE_EQ(lr_factor(s, 0, 0, 100), 0.25);
  EXPECT_DOUBLE_EQ(lr_factor(s, 1, 0, 100), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 3, 0, 100), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 4, 0, 100), 1.0);
}

TEST(LrSchedule, CosineIsPyTorchsClosedFormAfterTheWarmUp) {
  // CosineAnnealingLR(T_max = 90, eta_min = 0) stepped once per step, after 10 warm-up steps.
  const auto s = parse_lr_schedule("cosine", 10);
  EXPECT_DOUBLE_EQ(lr_factor(s, 9, 0, 100), 1.0);     // the warm-up's last step
  EXPECT_DOUBLE_EQ(lr_factor(s, 10, 0, 100), 1.0);    // the cosine's first
  EXPECT_NEAR(lr_factor(s, 55, 2, 100), 0.5, 1e-12);  // half way: cos(pi / 2) = 0
  for (int64_t step = 10; step < 100; ++step)
    EXPECT_NEAR(lr_factor(s, step, step / 25, 100), 0.5 * (1 + std::cos(M_PI * (step - 10) / 90.0)),
                1e-12);
  EXPECT_GT(lr_factor(s, 99, 3, 100), 0.0);  // the last step still moves
  EXPECT_LT(lr_factor(s, 99, 3, 100), 1e-3);
  for (int64_t step = 11; step < 100; ++step)
    EXPECT_LT(lr_factor(s, step, step / 25, 100), lr_factor(s, step - 1, (step - 1) / 25, 100))
        << step;
}

TEST(LrSchedule, StepMultipliesByGammaEveryEEpochs) {
  const auto s = parse_lr_schedule("step:2:0.5");
  // 10 steps per epoch: epochs 0-1 at 1, 2-3 at 0.5, 4 at 0.25.
  EXPECT_DOUBLE_EQ(lr_factor(s, 0, 0, 50), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 19, 1, 50), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 20, 2, 50), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 39, 3, 50), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 40, 4, 50), 0.25);
  // The epoch counts, not the step: a resumed run's epochs may be of another length.
  EXPECT_DOUBLE_EQ(lr_factor(s, 25, 4, 50), 0.25);
}

TEST(LrSchedule, DescriptionsNameTheSchedule) {
  EXPECT_EQ(describe_lr_schedule(parse_lr_schedule("cosine", 100)), "cosine, warm-up 100 steps");
  EXPECT_EQ(describe_lr_schedule(parse_lr_schedule("step:2:0.5")), "step every 2 epochs x0.5");
  EXPECT_EQ(describe_lr_schedule(parse_lr_schedule("step:1")), "step every 1 epoch x0.1");
}

TEST(Optimization, WeightDecayDefaultsToPyTorchsPerOptimizer) {
  TrainConfig c;
  c.optimizer = "adamw";
  EXPECT_DOUBLE_EQ(optimization_of(c).options.weight_decay, 0.01);
  c.optimizer = "adam";
  EXPECT_DOUBLE_EQ(optimization_of(c).options.weight_decay, 0.0);
  c.weight_decay = 0.5;
  EXPECT_DOUBLE_EQ(optimization_of(c).options.weight_decay, 0.5);
  c.optimizer = "lamb";
  EXPECT_THROW(optimization_of(c), Error);
  c.optimizer = "sgd";
  c.momentum = 0.9;
  c.lr_schedule = "cosine";
  c.warmup_steps = 3;
  EXPECT_EQ(optimization_of(c).describe(),
            "sgd lr 0.001, momentum 0.9, weight decay 0.5, cosine, warm-up 3 steps");
}

// Momentum is SGD's: Adam and AdamW would not read it, so a run that sets it is refused; a value
// outside [0, 1] (NaN included) too.
TEST(Optimization, MomentumIsRefusedWhereTheOptimizerWouldNotReadIt) {
  TrainConfig c;
  c.momentum = 0.9;
  for (const char* kind : {"adam", "adamw"}) {
    c.optimizer = kind;
    try {
      optimization_of(c);
      ADD_FAILURE() << kind << ": --momentum accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "--momentum is SGD's; --optimizer " + std::string(kind) +
                                           " keeps its own running averages (beta1 0.9, beta2 "
                                           "0.999)");
    }
  }
  c.optimizer = "sgd";
  EXPECT_DOUBLE_EQ(optimization_of(c).options.momentum, 0.9);
  for (const double bad : {-0.1, 1.5, std::nan("")}) {
    c.momentum = bad;
    EXPECT_THROW(optimization_of(c), Error) << bad;
  }
  c.optimizer = "adam";
  c.momentum = 0;
  EXPECT_NO_THROW(optimization_of(c));
}

}  // namespace
}  // namespace spritetorch::train
