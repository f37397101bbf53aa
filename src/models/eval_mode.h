// A module in eval mode for one scope: probes and evaluations of a module the caller may be
// training put it back in the mode it was in however the scope ends, a throw included.
#pragma once

#include <torch/torch.h>

namespace spritetorch::models {

class EvalModeScope {
 public:
  explicit EvalModeScope(torch::nn::Module& module)
      : module_(module), was_training_(module.is_training()) {
    module_.eval();
  }
  ~EvalModeScope() {
    try {
      module_.train(was_training_);
    } catch (...) {  // a user's train() override that throws: the scope's own error matters more
    }
  }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

}  // namespace spritetorch::models
