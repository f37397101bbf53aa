#include "train/optimization.h"

#include <sstream>

#include "common/error.h"

namespace spritetorch::train {

namespace {

std::string short_number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

}  // namespace

std::string Optimization::describe() const {
  std::string text = options.kind + " lr " + short_number(options.lr);
  if (options.kind == "sgd" && options.momentum > 0)
    text += ", momentum " + short_number(options.momentum);
  if (options.weight_decay > 0) text += ", weight decay " + short_number(options.weight_decay);
  if (!schedule.constant()) text += ", " + describe_lr_schedule(schedule);
  return text;
}

nlohmann::json Optimization::meta(const std::string& lr_schedule_text) const {
  return {{"optimizer", options.kind},
          {"lr", options.lr},
          {"weight_decay", options.weight_decay},
          {"lr_schedule", lr_schedule_text},
          {"warmup_steps", schedule.warmup_steps}};
}

Optimization optimization_of(const TrainConfig& config) {
  Optimization out;
  const auto& kinds = optimizer_names();
  if (std::find(kinds.begin(), kinds.end(), config.optimizer) == kinds.end())
    throw Error("unknown optimizer '" + config.optimizer + "': expected adam, adamw or sgd");
  out.options.kind = config.optimizer;
  out.options.lr = config.lr;
  out.options.momentum = config.momentum;
  out.options.weight_decay =
      config.weight_decay < 0 ? default_weight_decay(config.optimizer) : config.weight_decay;
  out.schedule = parse_lr_schedule(config.lr_schedule, config.warmup_steps);
  return out;
}

void check_resumed_optimizer(const Checkpoint& checkpoint, const std::string& path,
                             const TrainConfig& config) {
  const auto saved = checkpoint.meta.value("optimizer", std::string("adam"));
  if (saved != config.optimizer)
    throw Error("--resume " + path + " was trained with --optimizer " + saved +
                    " but this run asks for " + config.optimizer,
                "pass --optimizer " + saved + " to continue it");
}

}  // namespace spritetorch::train
