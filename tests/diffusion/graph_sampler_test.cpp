// Sampling options around the sampler itself: where a CUDA graph replays the sampling loop (DDIM
// with eta 0 on CUDA, from the second batch on) and that a replay draws what eager sampling draws;
// bf16 sampling (autocast around the UNet) against fp32.
#include <gtest/gtest.h>

#include "common/error.h"
#include "device/device.h"
#include "diffusion/cuda_graph_sampler.h"
#include "diffusion/generator.h"

namespace spritetorch::diffusion {
namespace {

Generator small_generator(torch::Device device) {
  torch::manual_seed(3);
  Generator g;
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.classes = 3;
  g.net = UNet(o);
  {  // out_conv starts at zero (eps = 0): give it weights so that samples depend on the network
    torch::NoGradGuard no_grad;
    g.net->out_conv->weight.normal_(0, 0.1);
  }
  g.net->eval();
  g.net->to(device);
  g.schedule = NoiseSchedule(50);
  g.schedule.to(device);
  g.class_names = {"a", "b", "c"};
  g.size = 16;
  return g;
}

TEST(GraphSampling, OnlyDeterministicSamplersOnCudaFromTheSecondBatchOn) {
  const torch::Device cuda(torch::kCUDA, 0);
  SampleOptions o;  // ddim, batch 512
  o.eta = 0;
  EXPECT_EQ(graph_sampling_unavailable(torch::kCPU, o).value_or(""), "not a CUDA device");
  if (SPRITETORCH_WITH_CUDA) {
    EXPECT_FALSE(graph_sampling_unavailable(cuda, o).has_value());
    EXPECT_FALSE(graph_sampling_applies(cuda, o, 1023));  // one batch and a partial one
    EXPECT_TRUE(graph_sampling_applies(cuda, o, 1024));
  } else {
    EXPECT_NE(graph_sampling_unavailable(cuda, o).value_or("").find("without CUDA"),
              std::string::npos);
    EXPECT_FALSE(graph_sampling_applies(cuda, o, 4096));
  }
  SampleOptions second_order = o;  // DPM-Solver++(2M) draws nothing either
  second_order.sampler = "dpm++2m";
  EXPECT_EQ(graph_sampling_unavailable(cuda, second_order), graph_sampling_unavailable(cuda, o));
  SampleOptions eta = o, ddpm = o, off = o;
  eta.eta = 1;  // the default
  ddpm.sampler = "ddpm";
  off.cuda_graphs = false;
  for (const auto* options : {&eta, &ddpm, &off})
    EXPECT_TRUE(graph_sampling_unavailable(cuda, *options).has_value());
  EXPECT_NE(graph_sampling_unavailable(cuda, eta).value_or("").find("noise"), std::string::npos);
  EXPECT_EQ(graph_sampling_unavailable(cuda, off).value_or(""), "--no-cuda-graphs");
}

TEST(GraphSampling, Bf16SamplingStaysCloseToFp32) {
  auto g = small_generator(torch::kCPU);
  SampleOptions o;
  o.steps = 5;
  const auto labels = torch::tensor({0, 1, 2, 0}, torch::kInt64);
  const auto fp32 = sample(g, labels, o);
  o.precision = "bf16";
  const auto bf16 = sample(g, labels, o);
  EXPECT_EQ(bf16.scalar_type(), torch::kFloat32);
  const auto gap = (fp32 - bf16).abs();
  EXPECT_GT(gap.max().item<double>(), 0.0) << "bf16 did not reach the UNet";
  // Five steps of a sampler carry bf16's rounding on, so a pixel here and there moves: the
  // largest gap depends on the CPU's bf16 kernels (under 0.1 with native bf16; 0.24 on an
  // AVX2-only Zen 1, 0.254 there with the BLAS or plain-loop matrix kernels), the mean does not
  // (0.021 on each). Sprites span [-1, 1].
  EXPECT_LT(gap.mean().item<double>(), 0.05);
  EXPECT_LT(gap.max().item<double>(), 0.5);
  o.precision = "fp16";
  EXPECT_THROW(sample(g, labels, o), Error);
}

// A graph replays what eager sampling computes: same seed, same sprites, batch for batch (the
// first batch is the eager warm-up, the second the capture, the third a plain replay, the last a
// partial batch run eagerly), in NCHW and channels_last.
TEST(GraphSamplingCuda, ReplayedBatchesEqualEagerOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  auto g = small_generator(cuda);
  const auto labels = torch::arange(27, torch::kInt64).remainder(3);
  for (const bool channels_last : {false, true})
    for (const std::string precision : {"fp32", "bf16"}) {
      SampleOptions o;
      o.eta = 0;  // deterministic: what a graph replays
      o.steps = 6;
      o.batch = 8;
      o.precision = precision;
      o.channels_last = channels_last;
      ASSERT_TRUE(graph_sampling_applies(cuda, o, labels.size(0)));
      const auto graphed = sample(g, labels, o).cpu();
      o.cuda_graphs = false;
      const auto eager = sample(g, labels, o).cpu();
      ASSERT_EQ(graphed.sizes(), eager.sizes());
      const double tolerance = precision == "fp32" ? 1e-3 : 2e-2;
      EXPECT_LT((graphed - eager).abs().max().item<double>(), tolerance)
          << precision << (channels_last ? " channels_last" : " NCHW");
    }
}

}  // namespace
}  // namespace spritetorch::diffusion
