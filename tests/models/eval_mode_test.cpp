#include "models/eval_mode.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace spritetorch::models {
namespace {

struct TwoLevelsImpl : torch::nn::Module {
  TwoLevelsImpl() { inner = register_module("inner", torch::nn::Dropout(0.5)); }
  torch::nn::Dropout inner{nullptr};
};
TORCH_MODULE(TwoLevels);

TEST(EvalModeScope, EvalInsideAndTheModeBeforeAfterEvenWhenTheScopeThrows) {
  TwoLevels net;
  ASSERT_TRUE(net->is_training());
  EXPECT_THROW(
      {
        EvalModeScope scope(*net);
        EXPECT_FALSE(net->is_training());
        EXPECT_FALSE(net->inner->is_training());
        throw std::runtime_error("a probe that fails");
      },
      std::runtime_error);
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(net->inner->is_training());

  net->eval();  // a module the caller keeps in eval mode stays there
  { EvalModeScope scope(*net); }
  EXPECT_FALSE(net->is_training());
  EXPECT_FALSE(net->inner->is_training());
}

}  // namespace
}  // namespace spritetorch::models
