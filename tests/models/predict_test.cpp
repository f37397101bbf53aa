#include "models/predict.h"

#include <gtest/gtest.h>

namespace spritetorch::models {
namespace {

TEST(Predict, TheMostLikelyClassItsSoftmaxProbabilityAndItsName) {
  torch::manual_seed(5);
  auto model = make_model({"simplenn", {3}, 3});
  model->eval();
  const auto inputs = torch::rand({4, 3});
  const auto probs = torch::softmax(model->forward(inputs), 1).detach();
  // Two names for three classes: label 2 is named by its number.
  const auto got = predict(*model, inputs, {"cat", "dog"});
  ASSERT_EQ(got.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    const auto& p = got[static_cast<size_t>(i)];
    EXPECT_EQ(p.label, probs[i].argmax().item<int64_t>());
    EXPECT_DOUBLE_EQ(p.confidence, probs[i][p.label].item<double>());
    EXPECT_EQ(p.name, p.label == 0 ? "cat" : p.label == 1 ? "dog" : "2");
  }
}

}  // namespace
}  // namespace spritetorch::models
