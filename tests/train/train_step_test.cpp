#include "train/train_step.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "train/flat_optimizer.h"

namespace spritetorch::train {
namespace {

// Trains two copies of one model for a few steps, one per step implementation, with batches of
// varying size (the last one short), and compares the weights.
void expect_fused_matches_autograd(const models::ModelSpec& spec, int64_t batch) {
  torch::manual_seed(11);
  auto a = models::make_model(spec), b = models::make_model(spec);
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {});
  auto autograd = make_train_step(a, batch, "autograd");
  auto fused = make_train_step(b, batch, "fused");
  ASSERT_STREQ(fused->name(), "fused-mlp");
  auto shape = spec.input_shape;
  auto la = torch::zeros({}), lb = torch::zeros({});
  auto ca = torch::zeros({}, torch::kInt64), cb = torch::zeros({}, torch::kInt64);
  for (int64_t rows : {batch, batch, batch / 2 + 1}) {
    std::vector<int64_t> dims{rows};
    dims.insert(dims.end(), shape.begin(), shape.end());
    data::Batch x{torch::rand(dims), torch::randint(0, spec.classes, {rows}, torch::kInt64)};
    oa.zero_grad();
    autograd->run(x, la, ca);
    oa.step();
    fused->run(x, lb, cb);  // overwrites the gradients: no zero_grad
    ob.step();
  }
  EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-4);
  EXPECT_EQ(ca.item<int64_t>(), cb.item<int64_t>());
  EXPECT_LT((oa.values() - ob.values()).abs().max().item<double>(), 1e-5);
}

TEST(FusedMlpStep, MatchesAutogradOnTheSeedNetwork) { expect_fused_matches_autograd({"ann", {1, 28, 28}, 10}, 64); }
TEST(FusedMlpStep, MatchesAutogradOnSimpleNn) { expect_fused_matches_autograd({"simplenn", {3}, 2}, 32); }

TEST(TrainStepChoice, AutoPicksFusedForMlpsAndAutogradOtherwise) {
  auto ann = models::make_model({"ann", {1, 8, 8}, 3});
  FlatOptimizer o(ann->parameters(), {});
  EXPECT_STREQ(make_train_step(ann, 8, "auto")->name(), "fused-mlp");
  EXPECT_STREQ(make_train_step(ann, 8, "autograd")->name(), "autograd");
  auto cnn = models::make_model({"cnn", {1, 8, 8}, 3});
  EXPECT_STREQ(make_train_step(cnn, 8, "auto")->name(), "autograd");
  EXPECT_THROW(make_train_step(cnn, 8, "fused"), Error);
}

}  // namespace
}  // namespace spritetorch::train
