#include "train/flat_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/compat.h"
#include "models/classifier.h"

namespace spritetorch::train {
namespace {

// Runs `steps` steps of the same loss with the flat optimizer and with LibTorch's own, from the
// same initial weights, and returns the largest parameter difference.
double max_difference(const std::string& kind, double momentum, int steps,
                      std::shared_ptr<ShardPool> pool = nullptr, double weight_decay = 0) {
  torch::manual_seed(3);
  auto a = models::make_model({"ann", {1, 8, 8}, 4});
  auto b = models::make_model({"ann", {1, 8, 8}, 4});
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  FlatOptimizer flat(a->parameters(), {kind, 0.01, 0.9, 0.999, 1e-8, momentum, weight_decay});
  flat.use_thread_pool(std::move(pool));
  std::unique_ptr<torch::optim::Optimizer> stock;
  if (kind == "adam")
    stock = std::make_unique<torch::optim::Adam>(
        b->parameters(), torch::optim::AdamOptions(0.01).weight_decay(weight_decay));
  else if (kind == "adamw")
    stock = std::make_unique<torch::optim::AdamW>(
        b->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(weight_decay));
  else
    stock = std::make_unique<torch::optim::SGD>(
        b->parameters(),
        torch::optim::SGDOptions(0.01).momentum(momentum).weight_decay(weight_decay));
  for (int s = 0; s < steps; ++s) {
    const auto x = torch::rand({16, 1, 8, 8});
    const auto y = torch::randint(0, 4, {16}, torch::kInt64);
    flat.zero_grad();
    torch::cross_entropy_loss(a->forward(x), y).backward();
    flat.step();
    stock->zero_grad();
    torch::cross_entropy_loss(b->forward(x), y).backward();
    stock->step();
  }
  double worst = 0;
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  return worst;
}

TEST(FlatOptimizer, AdamMatchesLibTorchAdamOverTwentySteps) {
  EXPECT_LT(max_difference("adam", 0, 20), 1e-5);
}
TEST(FlatOptimizer, AdamOverThreadsMatchesLibTorchAdam) {
  // 3 threads: ranges that do not divide the parameter count evenly.
  EXPECT_LT(max_difference("adam", 0, 20, std::make_shared<ShardPool>(3)), 1e-5);
}

// Shares of the update per thread: a plan that tiles the parameters runs (the same values as the
// even split), one that misses, repeats or names a tensor outside the buffer is refused and the
// even split stays.
TEST(FlatOptimizer, ThreadSharesMustTileTheParametersOnce) {
  auto a = torch::rand({10, 4}), b = torch::rand({6});
  auto pa = a.clone(), pb = b.clone();  // become views of `shared`'s buffer
  const auto initial = torch::cat({a.flatten(), b});
  FlatOptimizer even({a, b}, {"adam", 0.1, 0.9, 0.999, 1e-8, 0});
  FlatOptimizer shared({pa, pb}, {"adam", 0.1, 0.9, 0.999, 1e-8, 0});
  even.use_thread_pool(std::make_shared<ShardPool>(2));
  shared.use_thread_pool(std::make_shared<ShardPool>(2));
  auto outside = torch::rand({6});
  EXPECT_FALSE(shared.use_thread_shares({{{pa, 0, 40}}, {{pb, 0, 5}}}));                // a gap
  EXPECT_FALSE(shared.use_thread_shares({{{pa, 0, 40}}, {{pb, 0, 6}, {pa, 39, 40}}}));  // twice
  EXPECT_FALSE(shared.use_thread_shares({{{pa, 0, 40}}, {{outside, 0, 6}}}));  // not its buffer
  EXPECT_FALSE(shared.use_thread_shares({{{pa, 0, 40}, {pb, 0, 6}}}));         // one list, 2 shards
  EXPECT_FALSE(shared.use_thread_shares({{{pa, 0, 41}}, {{pb, 0, 6}}}));       // past the end
  // Thread 0 takes the end of the buffer, thread 1 the start: still every element once.
  ASSERT_TRUE(shared.use_thread_shares({{{pa, 20, 40}, {pb, 0, 6}}, {{pa, 0, 20}}}));
  for (int s = 0; s < 3; ++s) {
    const auto g = torch::rand({46});
    even.grads().copy_(g);
    shared.grads().copy_(g);
    even.step();
    shared.step();
  }
  EXPECT_TRUE(torch::equal(even.values(), shared.values()));
  EXPECT_FALSE(torch::equal(shared.values(), initial));  // the steps moved the parameters
}

TEST(FlatOptimizer, AdamStaysExactWhereTheSecondMomentIsZero) {
  // A parameter whose gradient is always zero has v = 0: the fast square root must give 0 there
  // (not NaN), so the parameter does not move.
  auto p = torch::full({37}, 0.5);
  FlatOptimizer flat({p}, {"adam", 0.1, 0.9, 0.999, 1e-8, 0});
  for (int s = 0; s < 3; ++s) {
    flat.zero_grad();
    flat.step();
  }
  EXPECT_TRUE(torch::equal(flat.values(), torch::full({37}, 0.5)));
}

TEST(FlatOptimizer, SgdMatchesLibTorchSgd) { EXPECT_LT(max_difference("sgd", 0, 20), 1e-6); }
TEST(FlatOptimizer, SgdMomentumMatchesLibTorchSgd) {
  EXPECT_LT(max_difference("sgd", 0.9, 20), 1e-5);
}

// Weight decay large enough to matter over 20 steps at lr 0.01 (a decay of 0.5 shrinks the weights
// by ~10% on its own): PyTorch's L2 form for adam and sgd, the decoupled one for adamw.
TEST(FlatOptimizer, AdamWeightDecayMatchesLibTorchAdam) {
  EXPECT_LT(max_difference("adam", 0, 20, nullptr, 0.5), 1e-5);
}
TEST(FlatOptimizer, AdamWMatchesLibTorchAdamW) {
  EXPECT_LT(max_difference("adamw", 0, 20, nullptr, 0.5), 1e-5);
  EXPECT_LT(max_difference("adamw", 0, 20, std::make_shared<ShardPool>(3), 0.5), 1e-5);
}
TEST(FlatOptimizer, SgdWeightDecayMatchesLibTorchSgd) {
  EXPECT_LT(max_difference("sgd", 0, 20, nullptr, 0.5), 1e-6);
  EXPECT_LT(max_difference("sgd", 0.9, 20, nullptr, 0.5), 1e-5);
}
// The update runs in float: an lr or a weight decay beyond float's range is refused by name before
// any step (it became infinity at the first update, and the run diverged).
TEST(FlatOptimizer, AnLrOrWeightDecayBeyondFloatIsRefused) {
  const auto refused = [](OptimizerOptions options, const std::string& names) {
    try {
      check_optimizer_options(options);
      return false;
    } catch (const Error& e) {
      return std::string(e.what()).find(names) != std::string::npos;
    }
  };
  EXPECT_TRUE(refused({"sgd", 1e300, 0, 0, 0, 0}, "--lr must be a number > 0 and at most 3.4e38"));
  EXPECT_TRUE(refused({"adam", 0, 0.9, 0.999, 1e-8, 0}, "--lr must be"));
  EXPECT_TRUE(refused({"adamw", 1e-3, 0.9, 0.999, 1e-8, 0, 1e39}, "--weight-decay must be"));
  EXPECT_NO_THROW(check_optimizer_options({"adam", 1e38, 0.9, 0.999, 1e-8, 0, 1e38}));
}

TEST(FlatOptimizer, WeightDecayIsNotANoOp) {
  // The comparisons above could pass with decay ignored on both sides: the two runs must differ.
  auto final_values = [](double weight_decay) {
    auto p = torch::full({8}, 2.0);
    FlatOptimizer flat({p}, {"adamw", 0.1, 0.9, 0.999, 1e-8, 0, weight_decay});
    for (int s = 0; s < 5; ++s) {
      flat.zero_grad();
      flat.step();
    }
    return flat.values().clone();
  };
  EXPECT_TRUE(torch::equal(final_values(0), torch::full({8}, 2.0)));  // no gradient, no decay
  EXPECT_TRUE(
      torch::allclose(final_values(0.5), torch::full({8}, 2.0 * std::pow(1 - 0.1 * 0.5, 5))));
}

// The device-side update (CUDA graphs, fp16 without a sync) is the same arithmetic as step(),
// weight decay and a changing lr included: step_on_device() on `device` against step() on the CPU.
// The gradients are given, not computed from the weights: Adam normalises each gradient, so
// through a model a rounding-level difference flips the sign of near-zero gradients and grows
// step by step. On CUDA, Adam and AdamW run PyTorch's fused kernel where LibTorch has it.
void expect_step_on_device_matches_step(const torch::Device& device) {
  torch::manual_seed(11);
  // 40,000: the fused kernel gets 36 views, the last one shorter (fused_adam_views).
  const int64_t n = 40000;
  const auto start = torch::randn({n});
  std::vector<torch::Tensor> gradients;
  for (int s = 0; s < 6; ++s) gradients.push_back(torch::randn({n}) * (torch::rand({n}) > 0.1));
  for (const char* kind : {"adam", "adamw", "sgd"}) {
    bool fused = false;
    auto run = [&](bool on_device) {
      auto p = start.clone().to(on_device ? device : torch::Device(torch::kCPU));
      FlatOptimizer flat({p}, {kind, 0.05, 0.9, 0.999, 1e-8, 0.9, 0.2});
      for (int s = 0; s < 6; ++s) {
        flat.set_lr(0.05 / (s + 1));
        flat.grads().copy_(gradients[s]);
        if (on_device)
          flat.step_on_device();
        else
          flat.step();
      }
      EXPECT_EQ(flat.steps_taken(), 6) << kind;
      if (on_device) fused = flat.fused_kernel();
      return flat.values().cpu();
    };
    const auto on_device = run(true), host = run(false);
    // Relative: the device path forms the decay factor 1 - lr wd in float, the host in double (an
    // ulp of the factor, times weights up to ~4, over 6 steps); a missing decay would be 1%.
    EXPECT_TRUE(torch::allclose(on_device, host, /*rtol=*/1e-5, /*atol=*/1e-6))
        << kind << " on " << device << ": " << (on_device - host).abs().max().item<double>();
    EXPECT_GT((host - start).abs().max().item<double>(), 0.05) << kind << ": the steps moved";
    // The fused kernel exists for CUDA from PyTorch 2.2 and has taken a device lr since 2.4 at
    // the latest; never on the CPU, whose step() is the fused loop.
    const bool expect_fused =
        device.is_cuda() && std::string(kind) != "sgd" && SPRITETORCH_TORCH_AT_LEAST(2, 4);
    if (expect_fused || !device.is_cuda()) {
      EXPECT_EQ(fused, expect_fused) << kind;
    }
  }
}

TEST(FlatOptimizer, StepOnDeviceMatchesStepWithWeightDecayAndAChangingLr) {
  expect_step_on_device_matches_step(torch::kCPU);
}

TEST(FlatOptimizerCuda, StepOnDeviceMatchesTheHostStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_step_on_device_matches_step(torch::Device(torch::kCUDA, 0));
}

// found_inf = 1 leaves the weights, the moments and the step count as they were, on the fused
// kernel's path as on the tensor-op one.
TEST(FlatOptimizerCuda, FoundInfSkipsTheWholeUpdate) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  for (const std::string kind : {"adam", "adamw", "sgd"}) {
    auto p = torch::randn({300}, cuda);
    FlatOptimizer opt({p}, {kind, 1e-2, 0.9, 0.999, 1e-8, 0.9, 0.1});
    opt.grads().normal_();
    opt.step_on_device(torch::zeros({1}, cuda));  // a real step first: nonzero moments
    const auto values = opt.values().clone();
    const auto state = opt.state();
    opt.grads().normal_();
    opt.grads()[3] = std::numeric_limits<float>::infinity();
    opt.step_on_device(torch::ones({1}, cuda));
    EXPECT_TRUE(torch::equal(opt.values(), values)) << kind;
    EXPECT_EQ(opt.steps_taken(), 1) << kind;
    const auto after = opt.state();
    EXPECT_TRUE(torch::equal(after.at("exp_avg"), state.at("exp_avg"))) << kind;
    opt.grads().normal_();
    opt.step_on_device(torch::zeros({1}, cuda));
    EXPECT_EQ(opt.steps_taken(), 2) << kind;
    EXPECT_FALSE(torch::equal(opt.values(), values)) << kind << ": the next step moves";
  }
}

// The views cover the buffer exactly once, in order, as slices of its own memory (the kernel writes
// the parameters through them): one per 1,024 elements, at most 36, all of one size but the last.
TEST(FlatOptimizer, FusedAdamViewsAreTheWholeBufferInOrder) {
  for (const int64_t n : {1, 1000, 1025, 36 * 1024, 40000, 109386}) {
    const auto flat = torch::arange(n, torch::kFloat32);
    const auto views = fused_adam_views(flat);
    const int64_t expected = std::min<int64_t>(36, (n + 1023) / 1024);
    EXPECT_EQ(static_cast<int64_t>(views.size()), expected) << n;
    int64_t offset = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ(views[i].data_ptr<float>(), flat.data_ptr<float>() + offset) << n << " view " << i;
      if (i + 1 < views.size()) {
        EXPECT_EQ(views[i].numel(), (n + expected - 1) / expected) << n;
      }
      offset += views[i].numel();
    }
    EXPECT_EQ(offset, n);
    EXPECT_TRUE(torch::equal(torch::cat(views), flat)) << n;
  }
}

TEST(FlatOptimizer, ParametersBecomeViewsOfOneBuffer) {
  auto model = models::make_model({"ann", {1, 4, 4}, 3});
  const auto before = model->parameters()[0].clone();
  FlatOptimizer flat(model->parameters(), {});
  EXPECT_TRUE(torch::equal(model->parameters()[0], before)) << "values kept";
  EXPECT_EQ(flat.values().numel(), 16 * 128 + 128 + 128 * 64 + 64 + 64 * 3 + 3);
  flat.values().fill_(0.5);
  EXPECT_EQ(model->parameters()[3].sum().item<float>(), 0.5f * 64);
  flat.grads().fill_(1);
  EXPECT_EQ(model->parameters()[0].grad().sum().item<float>(), 16 * 128);
}

TEST(FlatOptimizer, StateRoundTripContinuesIdentically) {
  auto run = [](bool reload) {
    torch::manual_seed(5);
    auto model = models::make_model({"ann", {1, 4, 4}, 3});
    auto flat = std::make_unique<FlatOptimizer>(model->parameters(), OptimizerOptions{});
    torch::manual_seed(6);
    for (int s = 0; s < 6; ++s) {
      if (reload && s == 3) {
        const auto state = flat->state();
        flat = std::make_unique<FlatOptimizer>(model->parameters(), OptimizerOptions{});
        flat->load_state(state);
      }
      flat->zero_grad();
      torch::cross_entropy_loss(model->forward(torch::rand({8, 1, 4, 4})),
                                torch::randint(0, 3, {8}, torch::kInt64))
          .backward();
      flat->step();
    }
    return flat->values().clone();
  };
  EXPECT_TRUE(torch::equal(run(false), run(true)));
}

}  // namespace
}  // namespace spritetorch::train
