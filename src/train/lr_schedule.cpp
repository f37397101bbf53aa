#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.h"

namespace spritetorch::train {

namespace {

const char* kExpected = "constant | cosine | step:E | step:E:G (E epochs >= 1, 0 < G <= 1)";

}  // namespace

LrSchedule parse_lr_schedule(const std::string& text, int64_t warmup_steps) {
  if (warmup_steps < 0)
    throw Error("--warmup-steps must be >= 0, got " + std::to_string(warmup_steps));
  LrSchedule schedule;
  schedule.warmup_steps = warmup_steps;
  if (text == "constant") return schedule;
  if (text == "cosine") {
    schedule.kind = LrSchedule::Kind::kCosine;
    return schedule;
  }
  auto bad = [&] {
    return Error("cannot read --lr-schedule '" + text + "': expected " + kExpected);
  };
  if (text.rfind("step:", 0) != 0) throw bad();
  schedule.kind = LrSchedule::Kind::kStep;
  std::istringstream in(text.substr(5));
  char colon = 0;
  if (!(in >> schedule.every_epochs) || schedule.every_epochs < 1) throw bad();
  if (in >> colon) {
    if (colon != ':' || !(in >> schedule.gamma) || !(schedule.gamma > 0 && schedule.gamma <= 1))
      throw bad();
  }
  if (!in.eof() && in.peek() != EOF) throw bad();
  return schedule;
}

double lr_factor(const LrSchedule& schedule, int64_t step, int64_t epoch, int64_t total_steps) {
  double factor = 1.0;
  if (step < schedule.warmup_steps)
    factor = static_cast<double>(step + 1) / static_cast<double>(schedule.warmup_steps);
  switch (schedule.kind) {
    case LrSchedule::Kind::kConstant:
      break;
    case LrSchedule::Kind::kCosine: {
      if (step < schedule.warmup_steps) break;
      const double span =
          static_cast<double>(std::max<int64_t>(total_steps - schedule.warmup_steps, 1));
      const double progress =
          std::min(1.0, static_cast<double>(step - schedule.warmup_steps) / span);
      factor *= 0.5 * (1.0 + std::cos(M_PI * progress));
      break;
    }
    case LrSchedule::Kind::kStep: {
      factor *= std::pow(schedule.gamma, static_cast<double>(epoch / schedule.every_epochs));
      break;
    }
  }
  return factor;
}

std::string describe_lr_schedule(const LrSchedule& schedule) {
  std::ostringstream out;
  switch (schedule.kind) {
    case LrSchedule::Kind::kConstant:
      out << "constant";
      break;
    case LrSchedule::Kind::kCosine:
      out << "cosine";
      break;
    case LrSchedule::Kind::kStep:
      out << "step every " << schedule.every_epochs << " epoch"
          << (schedule.every_epochs == 1 ? "" : "s") << " x" << schedule.gamma;
      break;
  }
  if (schedule.warmup_steps > 0) out << ", warm-up " << schedule.warmup_steps << " steps";
  return out.str();
}

}  // namespace spritetorch::train
