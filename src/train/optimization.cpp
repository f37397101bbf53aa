#include "train/optimization.h"

#include <c10/util/StringUtil.h>

#include <tuple>

#include "common/error.h"
#include "common/json_field.h"
#include "common/notes.h"

namespace spritetorch::train {

std::string Optimization::describe() const {
  std::string text = options.kind + " lr " + c10::str(options.lr);
  if (options.kind == "sgd" && options.momentum > 0)
    text += ", momentum " + c10::str(options.momentum);
  if (options.weight_decay > 0) text += ", weight decay " + c10::str(options.weight_decay);
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
  if (!(config.momentum >= 0 && config.momentum <= 1))
    throw Error("--momentum must be a number from 0 to 1, got " + c10::str(config.momentum));
  if (config.momentum != 0 && config.optimizer != "sgd")
    throw Error("--momentum is SGD's; --optimizer " + config.optimizer +
                    " keeps its own running averages (beta1 0.9, beta2 0.999)",
                "use --optimizer sgd, or leave --momentum out");
  Optimization out;
  out.options.kind = config.optimizer;
  out.options.lr = config.lr;
  out.options.momentum = config.momentum;
  out.options.weight_decay =
      config.weight_decay < 0 ? default_weight_decay(config.optimizer) : config.weight_decay;
  check_optimizer_options(out.options);  // before any work, not when the optimizer is built
  out.schedule = parse_lr_schedule(config.lr_schedule, config.warmup_steps);
  return out;
}

void check_resumed_optimizer(const Checkpoint& checkpoint, const std::string& path,
                             const TrainConfig& config) {
  // `import` writes weights only: nothing a run could continue from.
  if (checkpoint.optimizer.empty()) {
    const auto& meta = checkpoint.meta;
    const bool imported = meta.contains("imported_from") && meta.at("imported_from").is_string();
    throw DataError(
        path, "a checkpoint written by train, with the optimizer state a run continues from",
        imported ? "weights imported from " + meta.at("imported_from").get<std::string>() +
                       " (spritetorch import), with no optimizer state"
                 : "a checkpoint with no optimizer state",
        "eval, classify and export take these weights; --resume needs a checkpoint of train "
        "(--save, --checkpoint-every or one written when a run was stopped)");
  }
  const auto saved = checkpoint.meta.value("optimizer", std::string("adam"));
  if (saved != config.optimizer)
    throw Error("--resume " + path + " was trained with --optimizer " + saved +
                    " but this run asks for " + config.optimizer,
                "pass --optimizer " + saved + " to continue it");
  // The schedule gives each step its learning rate from the global step: another one would not
  // continue the run's curve but start a different one from the middle.
  const auto& meta = checkpoint.meta;
  const auto schedule = json_field(meta, "lr_schedule", config.lr_schedule, path, "lr_schedule");
  const auto warmup = json_field(meta, "warmup_steps", config.warmup_steps, path, "warmup_steps");
  // Compared as parsed ("step:5" is "step:5:0.1"); a saved text that does not parse differs.
  const auto same_schedule = [&] {
    try {
      return describe_lr_schedule(parse_lr_schedule(schedule, warmup)) ==
             describe_lr_schedule(parse_lr_schedule(config.lr_schedule, config.warmup_steps));
    } catch (const Error&) {
      return schedule == config.lr_schedule && warmup == config.warmup_steps;
    }
  };
  if (!same_schedule())
    throw Error("--resume " + path + " was trained with --lr-schedule " + schedule +
                    " --warmup-steps " + std::to_string(warmup) +
                    " but this run asks for --lr-schedule " + config.lr_schedule +
                    " --warmup-steps " + std::to_string(config.warmup_steps),
                "pass --lr-schedule " + schedule + " --warmup-steps " + std::to_string(warmup) +
                    " to continue it");
  // A new learning rate or weight decay is a choice a resumed run may make (a smaller lr for the
  // tail), but not a silent one.
  const OptimizerOptions now = optimization_of(config).options;
  for (const auto& [key, flag, value] :
       {std::tuple<const char*, const char*, double>{"lr", "--lr", now.lr},
        {"weight_decay", "--weight-decay", now.weight_decay}})
    if (const double saved_value = json_field(meta, key, value, path, key); saved_value != value)
      note("--resume " + path + " was trained with " + flag + " " + c10::str(saved_value) +
           "; this run goes on with " + c10::str(value));
}

}  // namespace spritetorch::train
