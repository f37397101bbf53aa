#include "precision/grad_scaler.h"

#include <gtest/gtest.h>

#include <limits>

#include "common/error.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace spritetorch::precision {
namespace {

GradScalerOptions small(int64_t growth_interval = 3) {
  GradScalerOptions o;
  o.init_scale = 1024.0;
  o.growth_interval = growth_interval;
  return o;
}

// One scaler per implementation this LibTorch offers on the CPU: the tensor-op fallback always,
// the fused AMP kernels where they have CPU kernels (LibTorch >= 2.3).
std::vector<GradScaler> cpu_scalers(GradScalerOptions options) {
  std::vector<GradScaler> out;
  options.force_fallback = true;
  out.emplace_back(torch::kCPU, options);
  options.force_fallback = false;
  GradScaler maybe_fused(torch::kCPU, options);
  if (maybe_fused.fused()) out.push_back(maybe_fused);
  return out;
}

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradients) {
  for (auto& scaler : cpu_scalers(small())) {
    EXPECT_DOUBLE_EQ(scaler.scale(torch::tensor(0.5f)).item<double>(), 512.0);
    auto grads = torch::tensor({1024.0f, -2048.0f, 512.0f});
    scaler.unscale_(grads);
    EXPECT_TRUE(torch::equal(grads, torch::tensor({1.0f, -2.0f, 0.5f})));
    EXPECT_FALSE(scaler.found_inf_host());
  }
}

TEST(GradScaler, InfOrNanGradientIsFoundAndHalvesTheScale) {
  for (const float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (auto& scaler : cpu_scalers(small())) {
      auto grads = torch::ones({1000});
      grads[777] = bad;
      scaler.unscale_(grads);
      EXPECT_TRUE(scaler.found_inf_host());
      scaler.update();
      EXPECT_DOUBLE_EQ(scaler.current_scale(), 512.0);
      EXPECT_EQ(scaler.growth_tracker(), 0);
    }
  }
}

TEST(GradScaler, GrowsAfterTheIntervalOfCleanStepsAndAnInfResetsTheCount) {
  for (auto& scaler : cpu_scalers(small(/*growth_interval=*/3))) {
    auto clean = [&] {
      auto g = torch::ones({10});
      scaler.unscale_(g);
      scaler.update();
    };
    clean();
    clean();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 1024.0);
    EXPECT_EQ(scaler.growth_tracker(), 2);
    clean();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 2048.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    clean();
    clean();
    auto g = torch::full({10}, std::numeric_limits<float>::infinity());
    scaler.unscale_(g);
    scaler.update();  // backoff and the count starts again
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 1024.0);
    clean();
    clean();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 1024.0);
    clean();
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 2048.0);
  }
}

TEST(GradScaler, StateRoundTripsThroughACheckpoint) {
  testing::ScratchDir dir;
  GradScaler scaler(torch::kCPU, small(/*growth_interval=*/5));
  for (int i = 0; i < 2; ++i) {  // a backoff and two clean steps: scale 512, tracker 2
    auto g = torch::ones({4});
    if (i == 0) g[0] = std::numeric_limits<float>::infinity();
    scaler.unscale_(g);
    scaler.update();
  }
  auto g = torch::ones({4});
  scaler.unscale_(g);
  scaler.update();
  ASSERT_DOUBLE_EQ(scaler.current_scale(), 512.0);
  ASSERT_EQ(scaler.growth_tracker(), 2);

  train::Checkpoint checkpoint;
  checkpoint.meta = {{"model", "ann"}, {"grad_scaler", scaler.state()}};
  checkpoint.model["w"] = torch::zeros({1});
  train::save_checkpoint(dir.file("c.ckpt"), checkpoint);
  const auto loaded = train::load_checkpoint(dir.file("c.ckpt"));

  GradScaler restored(torch::kCPU, small(/*growth_interval=*/2000));
  restored.load_state(loaded.meta.at("grad_scaler"), "c.ckpt");
  EXPECT_DOUBLE_EQ(restored.current_scale(), 512.0);
  EXPECT_EQ(restored.growth_tracker(), 2);
  EXPECT_EQ(restored.options().growth_interval, 5);
  // It carries on where the saved one was: three more clean steps reach the interval of 5.
  for (int i = 0; i < 3; ++i) {
    auto h = torch::ones({4});
    restored.unscale_(h);
    restored.update();
  }
  EXPECT_DOUBLE_EQ(restored.current_scale(), 1024.0);
}

TEST(GradScaler, MalformedStateIsAnErrorNamingTheSource) {
  GradScaler scaler(torch::kCPU);
  try {
    scaler.load_state(nlohmann::json{{"scale", -1.0}, {"growth_tracker", 0}}, "run.ckpt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.ckpt"), std::string::npos);
  }
  EXPECT_THROW(scaler.load_state(nlohmann::json{{"growth_tracker", 0}}, "run.ckpt"), Error);
}

TEST(GradScaler, ClipGradNormScalesToTheMaximumWithoutAHostRead) {
  auto g = torch::tensor({3.0f, 4.0f});  // norm 5
  auto norm = clip_grad_norm_(g, 1.0);
  EXPECT_NEAR(norm.item<double>(), 5.0, 1e-6);
  EXPECT_NEAR(g.norm().item<double>(), 1.0, 1e-5);
  auto small_grad = torch::tensor({0.3f, 0.4f});
  clip_grad_norm_(small_grad, 1.0);  // below the maximum: untouched (up to the 1e-6 guard)
  EXPECT_NEAR(small_grad[1].item<double>(), 0.4, 1e-6);
}

TEST(GradScalerCuda, FusedKernelsMatchTheFallback) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto options = small(/*growth_interval=*/2);
  GradScaler fused(torch::kCUDA, options);
  ASSERT_TRUE(fused.fused());
  options.force_fallback = true;
  GradScaler fallback(torch::kCUDA, options);
  for (int step = 0; step < 5; ++step) {
    auto g = torch::randn({4096}, torch::kCUDA) * 1000;
    if (step == 2) g[100] = std::numeric_limits<float>::infinity();
    auto h = g.clone();
    fused.unscale_(g);
    fallback.unscale_(h);
    EXPECT_EQ(fused.found_inf_host(), fallback.found_inf_host());
    if (step != 2) {
      EXPECT_TRUE(torch::allclose(g, h));
    }
    fused.update();
    fallback.update();
    EXPECT_DOUBLE_EQ(fused.current_scale(), fallback.current_scale());
    EXPECT_EQ(fused.growth_tracker(), fallback.growth_tracker());
  }
}

}  // namespace
}  // namespace spritetorch::precision
