#include "precision/autocast_guard.h"

#include <gtest/gtest.h>

#include "common/compat.h"

namespace spritetorch::precision {
namespace {

constexpr auto kCpu = c10::DeviceType::CPU;

TEST(AutocastGuard, EnablesForItsScopeAndRestoresEnabledAndDtype) {
  ASSERT_FALSE(compat::autocast_enabled(kCpu));
  const auto dtype_before = compat::autocast_dtype(kCpu);
  {
    AutocastGuard guard(kCpu, torch::kBFloat16);
    EXPECT_TRUE(compat::autocast_enabled(kCpu));
    EXPECT_EQ(compat::autocast_dtype(kCpu), torch::kBFloat16);
  }
  EXPECT_FALSE(compat::autocast_enabled(kCpu));
  EXPECT_EQ(compat::autocast_dtype(kCpu), dtype_before);
}

TEST(AutocastGuard, NestsAndEachLevelRestoresItsParent) {
  {
    AutocastGuard outer(kCpu, torch::kBFloat16);
    {
      AutocastGuard off(kCpu, torch::kBFloat16, /*enabled=*/false);
      EXPECT_FALSE(compat::autocast_enabled(kCpu));
      {
        AutocastGuard inner(kCpu, torch::kBFloat16);  // 1.13's CPU autocast takes bf16 only
        EXPECT_TRUE(compat::autocast_enabled(kCpu));
        EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(),
                  torch::kBFloat16);
      }
      EXPECT_FALSE(compat::autocast_enabled(kCpu));
      EXPECT_EQ(compat::autocast_dtype(kCpu), torch::kBFloat16);
    }
    EXPECT_TRUE(compat::autocast_enabled(kCpu));
    EXPECT_EQ(compat::autocast_dtype(kCpu), torch::kBFloat16);
  }
  EXPECT_FALSE(compat::autocast_enabled(kCpu));
}

TEST(AutocastGuard, RestoresWhenTheScopeIsLeftByAnException) {
  try {
    AutocastGuard guard(kCpu, torch::kBFloat16);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(compat::autocast_enabled(kCpu));
}

TEST(AutocastGuard, Bf16OnCpuChangesMatmulOutputDtypeOnlyInsideTheScope) {
  torch::manual_seed(0);
  auto a = torch::randn({8, 16}), b = torch::randn({16, 4});
  torch::Tensor inside;
  {
    AutocastGuard guard(kCpu, torch::kBFloat16);
    inside = torch::mm(a, b);
  }
  EXPECT_EQ(inside.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
  // Same product within bf16's precision (8 bits of mantissa), relative to |a| |b| (the sum of
  // the terms' magnitudes): over 2000 seeds the error stayed below 2^-6 of it, so 2^-5 leaves a
  // factor 2. A fixed bound (0.15) failed once in CI at 0.19: LibTorch's default generator is
  // seeded at random in each process, hence also the manual_seed above.
  const auto bound = torch::mm(a.abs(), b.abs()) * (1.0 / 32) + 1e-3;
  const auto error = (inside.to(torch::kFloat32) - torch::mm(a, b)).abs();
  EXPECT_TRUE((error <= bound).all().item<bool>()) << "max error " << error.max().item<double>();
  EXPECT_GT(error.max().item<double>(), 0.0) << "bf16 should round something";
}

TEST(AutocastGuard, LinearLayerGradientsStayFp32) {
  torch::nn::Linear layer(16, 4);
  auto x = torch::randn({8, 16});
  torch::Tensor loss;
  {
    AutocastGuard guard(kCpu, torch::kBFloat16);
    auto y = layer->forward(x);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    loss = y.to(torch::kFloat32).square().mean();
  }
  loss.backward();
  EXPECT_EQ(layer->weight.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(layer->weight.scalar_type(), torch::kFloat32);
}

TEST(AutocastGuardCuda, Fp16OnCudaChangesMatmulOutputDtype) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto a = torch::randn({8, 16}, torch::kCUDA), b = torch::randn({16, 4}, torch::kCUDA);
  {
    AutocastGuard guard(c10::DeviceType::CUDA, torch::kFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat16);
    EXPECT_FALSE(compat::autocast_enabled(kCpu)) << "a CUDA guard must not touch CPU autocast";
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
  EXPECT_FALSE(compat::autocast_enabled(c10::DeviceType::CUDA));
}

}  // namespace
}  // namespace spritetorch::precision
