#include "train/time_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <string>

#include "common/error.h"

namespace spritetorch::train {

double parse_duration(const std::string& text, const std::string& flag) {
  // "--time-budget: " before the text, unless the caller's parser names the flag itself.
  const std::string prefix = flag.empty() ? "" : flag + ": ";
  const auto bad = [&] {
    return Error(prefix + "'" + text +
                     "' is not a duration: expected one such as 900, 900s, 15m, 1.5h or 1h30m "
                     "(0: none)",
                 "");
  };
  if (text.empty()) throw bad();
  double total = 0;
  const char* p = text.c_str();
  bool last_had_unit = true;  // a bare number (seconds) may only end the text
  double previous_unit = 0;   // units come once each, largest first: 1h30m, not 30m1h or 5m5m
  while (*p) {
    if (!last_had_unit) throw bad();
    if (!(std::isdigit(static_cast<unsigned char>(*p)) || *p == '.')) throw bad();
    // A decimal number (strtod alone would also take 0x10).
    char* end = nullptr;
    const double value = std::strtod(p, &end);
    if (end == p || !std::isfinite(value) || value < 0 ||
        std::string(p, static_cast<const char*>(end)).find_first_not_of("0123456789.eE+-") !=
            std::string::npos)
      throw bad();
    p = end;
    double unit = 1;
    last_had_unit = true;
    switch (*p) {
      case 'h':
        unit = 3600;
        ++p;
        break;
      case 'm':
        unit = 60;
        ++p;
        break;
      case 's':
        ++p;
        break;
      case '\0':
        last_had_unit = false;
        break;
      default:
        throw bad();
    }
    if (previous_unit != 0 && unit >= previous_unit) throw bad();
    previous_unit = unit;
    total += value * unit;
  }
  if (!std::isfinite(total)) throw bad();
  constexpr double kYear = 8760 * 3600.0;  // beyond it a plan's step counts would overflow
  if (total > kYear)
    throw Error(prefix + "'" + text + "' is longer than a year: a budget of at most 8760h", "");
  return total;
}

std::string lr_percent_text(double share) {
  const double percent = 100.0 * share;
  std::ostringstream text;
  if (percent >= 10)
    text << std::llround(percent);
  else
    text << std::setprecision(2) << percent;
  return text.str();
}

nlohmann::json budget_json(const BudgetPlan& plan) {
  return {{"budget_s", plan.budget_s},
          {"seconds_per_step", plan.seconds_per_step},
          {"timed_steps", plan.timed_steps},
          {"epochs", plan.epochs},
          {"max_epochs", plan.max_epochs},
          {"steps", plan.steps},
          {"revisions", plan.revisions},
          {"spent", plan.spent},
          {"warmup_spans_run", plan.warmup_steps > 0}};
}

int64_t next_budget_revision(const BudgetPlan& plan, int64_t steps_done, int64_t max_revisions) {
  if (plan.revisions >= max_revisions) return 0;
  const int64_t half_left = (plan.steps - steps_done) / 2;
  return half_left > 0 ? steps_done + half_left : 0;
}

BudgetPlan revise_budget_plan(const BudgetPlan& plan, const BudgetInput& in, int64_t timed_steps) {
  BudgetPlan revised = plan;
  revised.budget_s = in.budget_s;  // a resumed run's --time-budget may differ from its plan's
  revised.seconds_per_step = in.seconds_per_step;
  revised.timed_steps = timed_steps;
  revised.epochs = epochs_within_budget(in);
  revised.steps = (revised.epochs - in.start_epoch) * in.steps_per_epoch;
  revised.revisions = plan.revisions + 1;
  revised.revised_at_step = in.steps_done;
  revised.spent = in.used_s >= in.budget_s;
  return revised;
}

BudgetPlan budget_from_json(const nlohmann::json& json, const std::string& source) {
  try {
    BudgetPlan plan;
    plan.budget_s = json.at("budget_s").get<double>();
    plan.seconds_per_step = json.at("seconds_per_step").get<double>();
    plan.timed_steps = json.at("timed_steps").get<int64_t>();
    plan.epochs = json.at("epochs").get<int64_t>();
    plan.max_epochs = json.at("max_epochs").get<int64_t>();
    plan.steps = json.at("steps").get<int64_t>();
    plan.revisions = json.value("revisions", int64_t{0});  // absent in older checkpoints
    plan.spent = json.value("spent", false);
    if (plan.epochs < 1) throw std::invalid_argument("epochs " + std::to_string(plan.epochs));
    return plan;
  } catch (const std::exception& e) {
    throw DataError(source, "a time_budget plan (budget_s, seconds_per_step, epochs >= 1, ...)",
                    e.what());
  }
}

int64_t epochs_within_budget(const BudgetInput& in) {
  const int64_t at_least = in.current_epoch + 1;
  const int64_t at_most = std::max(in.max_epochs, at_least);
  if (!(in.seconds_per_step > 0)) return at_most;
  const double left_s = std::max(0.0, in.budget_s - in.used_s);
  // Steps of this run in all: those done and those that fit in what is left.
  const double steps =
      static_cast<double>(in.steps_done) + std::floor(left_s / in.seconds_per_step);
  const double epochs =
      static_cast<double>(in.start_epoch) +
      std::floor(steps / static_cast<double>(std::max<int64_t>(in.steps_per_epoch, 1)));
  if (epochs >= static_cast<double>(at_most)) return at_most;
  return std::max(at_least, static_cast<int64_t>(epochs));
}

}  // namespace spritetorch::train
