#include "train/optimization.h"

#include <c10/util/StringUtil.h>

#include "common/error.h"

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
}

}  // namespace spritetorch::train
