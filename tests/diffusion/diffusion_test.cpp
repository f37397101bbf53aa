// The DDPM schedule against its own Markov chain, the DDIM / DDPM samplers (an oracle eps must give
// back the clean image; eq. 12 with clipping; determinism), sprite post-processing,
// palettes, a tiny end-to-end generator run, and its resume / interrupt / periodic checkpoints.
#include "diffusion/generator.h"
#include "diffusion/generator_task.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include "common/error.h"
#include "data/procedural_sprites.h"
#include "device/device.h"
#include "io/png.h"
#include "models/conv3x3.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/interrupt.h"
#include "train/run_state.h"
#include "train/trainer.h"
#include "unet_fixture.h"

namespace spritetorch::diffusion {
namespace {

using spritetorch::testing::ScratchDir;

TEST(NoiseSchedule, ClosedFormMatchesStepByStepChain) {
  NoiseSchedule schedule(200);
  // Many scalar chains from the same x0: x_t = sqrt(alpha_t) x_{t-1} + sqrt(beta_t) eps_t.
  const int64_t n = 200000;
  torch::manual_seed(3);
  const double x0 = 0.8;
  auto x = torch::full({n}, x0);
  const auto alphas = schedule.alphas(), betas = schedule.betas(), ab = schedule.alpha_bars();
  for (int64_t t = 0; t < schedule.steps(); ++t) {
    x = alphas[t].sqrt() * x + betas[t].sqrt() * torch::randn({n});
    if (t == 20 || t == 199) {
      const double mean = x.mean().item<double>(), var = x.var().item<double>();
      const double a = ab[t].item<double>();
      EXPECT_NEAR(mean, std::sqrt(a) * x0, 0.01) << "t = " << t;
      EXPECT_NEAR(var, 1.0 - a, 0.01) << "t = " << t;
      // The closed form, sampled the same way, has the same moments.
      const auto direct =
          schedule.add_noise(torch::full({n, 1, 1, 1}, x0), torch::full({n}, t, torch::kInt64),
                             torch::randn({n, 1, 1, 1}));
      EXPECT_NEAR(direct.mean().item<double>(), mean, 0.01);
      EXPECT_NEAR(direct.var().item<double>(), var, 0.01);
    }
  }
  EXPECT_LT(ab[199].item<double>(), 0.2);
  EXPECT_NEAR(ab[0].item<double>(), 1.0 - 1e-4, 1e-7);
}

Generator tiny_generator(int64_t classes = 3) {
  torch::manual_seed(1);
  Generator g;
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.classes = classes;
  g.net = UNet(o);
  // out_conv starts at zero; give it weights so samples depend on the network.
  {
    torch::NoGradGuard no_grad;
    g.net->out_conv->weight.normal_(0, 0.1);
  }
  g.net->eval();
  g.schedule = NoiseSchedule(50);
  g.class_names = {"a", "b", "c"};
  g.palette = torch::tensor({0, 0, 0, 255, 0, 0, 40, 200, 90}, torch::kUInt8).view({3, 3});
  return g;
}

// A guidance scale outside 0-100 (NaN, infinity, 1e30) is refused by name before any pass: far
// above the usual 1-10 the sheets saturate; 100 itself samples.
TEST(Sampler, AGuidanceScaleOutsideZeroToAHundredIsRefused) {
  auto g = tiny_generator();
  SampleOptions o;
  o.steps = 2;
  const auto labels = torch::tensor({0, 1}, torch::kInt64);
  for (const double w : {-1.0, 100.5, 1e30, std::numeric_limits<double>::infinity(),
                         std::numeric_limits<double>::quiet_NaN()}) {
    o.guidance = w;
    const std::string error = spritetorch::testing::error_of([&] { sample(g, labels, o); });
    EXPECT_NE(error.find("expected a scale from 0 to 100"), std::string::npos)
        << w << ": " << error;
  }
  o.guidance = kMaxGuidance;
  EXPECT_EQ(sample(g, labels, o).size(0), 2);
}

// generate's form: each batch finished as it comes out gives the bytes of finishing all at once.
TEST(Sampler, FinishingEachBatchGivesTheSameSpritesAsFinishingThemAll) {
  auto g = tiny_generator();
  SampleOptions o;
  o.steps = 3;
  o.seed = 5;
  o.batch = 2;
  const auto labels = torch::tensor({0, 1, 2, 0, 1}, torch::kInt64);
  std::vector<int64_t> batches;
  const auto each = sample(g, labels, o, [&](const torch::Tensor& x) {
    batches.push_back(x.size(0));
    return finish_sprites(x, 4);
  });
  EXPECT_EQ(batches, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(each.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(each, finish_sprites(sample(g, labels, o), 4)));
}

TEST(Sampler, DdimIsDeterministicForASeed) {
  auto g = tiny_generator();
  SampleOptions o;
  EXPECT_EQ(o.eta, 1.0);  // the default: DDIM with DDPM-like noise, drawn from the seed
  const auto labels3 = torch::tensor({0, 1, 2}, torch::kInt64);
  o.steps = 5;
  o.seed = 11;
  EXPECT_TRUE(torch::equal(sample(g, labels3, o), sample(g, labels3, o)));
  o.eta = 0;
  o.seed = 11;
  const auto labels = torch::tensor({0, 1, 2, 0}, torch::kInt64);
  const auto a = sample(g, labels, o), b = sample(g, labels, o);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, 4, 16, 16}));
  EXPECT_TRUE(torch::equal(a, b));
  o.seed = 12;
  EXPECT_FALSE(torch::equal(sample(g, labels, o), a));
  o.seed = 11;
  // eta 0: each sprite's start is drawn in sprite order, so neither the batching nor more sprites
  // after them change what a seed gives (up to the batched convolutions' rounding).
  o.batch = 3;
  EXPECT_TRUE(torch::allclose(sample(g, labels, o), a, 1e-4, 1e-5));
  o.batch = 1;
  EXPECT_TRUE(torch::allclose(sample(g, labels, o), a, 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(sample(g, labels.narrow(0, 0, 2), o), a.narrow(0, 0, 2), 1e-4, 1e-5));
  o.batch = 3;
  o.sampler = "ddpm";
  const auto d = sample(g, labels, o);
  EXPECT_TRUE(torch::isfinite(d).all().item<bool>());
  EXPECT_LE(d.abs().max().item<double>(), 1.0);
}

TEST(Sampler, GuidanceCombinesConditionalAndUnconditional) {
  auto g = tiny_generator();
  const auto x = torch::randn({2, 4, 16, 16});
  const auto c = torch::tensor({1, 2}, torch::kInt64);
  const auto t = torch::full({2}, 10, torch::kInt64);
  torch::NoGradGuard no_grad;
  const auto cond = g.net->forward(x, t, c),
             uncond = g.net->forward(x, t, torch::full({2}, 3, torch::kInt64));
  EXPECT_FALSE(torch::allclose(cond, uncond));  // the class embedding matters
  // One DDIM step from t = T - 1 straight to x0 uses eps_u + w (eps_c - eps_u).
  const auto out = ddim_sample(g.net, g.schedule, x, c, 1, 3.0);
  const double a = g.schedule.alpha_bars()[49].item<double>();
  const auto eps_at_t = [&](const torch::Tensor& cc) {
    return g.net->forward(x, torch::full({2}, 49, torch::kInt64), cc);
  };
  const auto e = eps_at_t(torch::full({2}, 3, torch::kInt64)) +
                 3.0 * (eps_at_t(c) - eps_at_t(torch::full({2}, 3, torch::kInt64)));
  const auto expected = ((x - std::sqrt(1 - a) * e) / std::sqrt(a)).clamp(-1, 1);
  EXPECT_TRUE(torch::allclose(out, expected, 1e-4, 1e-4));
}

TEST(Sampler, GuidanceIntervalGuidesOnlyItsSteps) {
  auto g = tiny_generator();  // T = 50: t / (T - 1) = t / 49
  const auto x = torch::randn({3, 4, 16, 16});
  const auto c = torch::tensor({0, 1, 2}, torch::kInt64);
  const auto ddim = [&](double w, GuidanceInterval interval) {
    return ddim_sample(g.net, g.schedule, x, c, 6, w, 0.0, std::nullopt, Prediction::kEps,
                       TimestepSpacing::kUniform, interval);
  };
  const auto whole = ddim(3.0, {}), unguided = ddim(1.0, {});
  EXPECT_FALSE(torch::allclose(whole, unguided, 1e-4, 1e-4));
  EXPECT_TRUE(torch::equal(ddim(3.0, {0.0, 1.0}), whole));
  // The 6 steps sit at t = 49, 39, 29, 19, 9, 0: [0.999, 1] holds t = 49 alone, [0.1, 0.15]
  // none of them (guidance then changes nothing).
  EXPECT_TRUE(torch::equal(ddim(3.0, {0.1, 0.15}), unguided));
  const auto first_only = ddim(3.0, {0.999, 1.0});
  EXPECT_FALSE(torch::allclose(first_only, whole, 1e-4, 1e-4));
  EXPECT_FALSE(torch::allclose(first_only, unguided, 1e-4, 1e-4));
  // Both ends belong to the interval.
  GuidanceInterval high{0.5, 1.0};
  EXPECT_TRUE(high.covers(49, 50) && high.covers(29, 50) && !high.covers(19, 50));
  const GuidanceInterval low{0.0, 0.5};
  EXPECT_FALSE(low.covers(49, 50));
  // DDPM and DPM-Solver take the interval too.
  const auto gen = [] { return at::make_generator<at::CPUGeneratorImpl>(5); };
  const GuidanceInterval no_step{0.1, 0.1001};  // between t = 4 and t = 5 of DDPM's 50
  const auto ddpm_interval =
      ddpm_sample(g.net, g.schedule, x, c, 3.0, gen(), Prediction::kEps, no_step);
  EXPECT_TRUE(torch::equal(ddpm_interval, ddpm_sample(g.net, g.schedule, x, c, 1.0, gen())));
  const GuidanceInterval no_dpm_step{0.1, 0.15};
  const auto dpm_interval = dpm_solver_sample(g.net, g.schedule, x, c, 6, 3.0, Prediction::kEps,
                                              TimestepSpacing::kUniform, no_dpm_step);
  EXPECT_TRUE(torch::equal(dpm_interval, dpm_solver_sample(g.net, g.schedule, x, c, 6, 1.0)));
  // Through sample() and its report.
  SampleOptions o;
  o.steps = 6;
  o.guidance = 3;
  o.guidance_interval = {0.1, 0.15};
  SampleOptions none = o;
  none.guidance = 1;
  none.guidance_interval = {};
  EXPECT_TRUE(torch::equal(sample(g, c, o), sample(g, c, none)));
  o.guidance_interval = {0.4, 1.0};
  EXPECT_EQ(describe_sampler(o, 50), "ddim 6 uniform steps, eta 1, guidance 3 at t/T 0.4-1");
  EXPECT_EQ(sampler_json(o, 50)["guidance_interval"], (nlohmann::json{0.4, 1.0}));
}

TEST(Sampler, GuidanceIntervalTextIsCheckedWithTheReason) {
  const auto i = parse_guidance_interval("0.4:1");
  EXPECT_EQ(i.from, 0.4);
  EXPECT_EQ(i.to, 1.0);
  EXPECT_TRUE(parse_guidance_interval("0:1").whole());
  EXPECT_EQ(guidance_interval_text(parse_guidance_interval("0.25:0.75")), "0.25:0.75");
  for (const char* bad : {"0.4", "1:0.4", "0.5:0.5", "-0.1:1", "0:1.5", "a:1", "0.2:1x", ":"}) {
    try {
      parse_guidance_interval(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const spritetorch::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("0 <= FROM < TO <= 1"), std::string::npos);
    }
  }
}

// An eps "model" that knows x0: it returns the noise that takes x0 to x_t under q(x_t | x0), so
// every x0_hat is x0 and a correct sampler ends at x0 whatever path it takes. It records the
// timestep and the eps of every call (each call's t must be one value across the batch).
struct Oracle {
  torch::Tensor x0;  // (B, 4, S, S) float32 in [-1, 1]
  std::vector<double> ab;
  std::vector<int64_t> calls;
  std::vector<torch::Tensor> eps;

  Oracle(torch::Tensor clean, const NoiseSchedule& schedule)
      : x0(std::move(clean)), ab(schedule.host_alpha_bars()) {}
  EpsModel model() {
    return [this](const torch::Tensor& x, const torch::Tensor& t) {
      EXPECT_EQ(t.sizes(), (std::vector<int64_t>{x.size(0)}));
      const int64_t step = t[0].item<int64_t>();
      EXPECT_TRUE((t == step).all().item<bool>());
      const double a = ab.at(static_cast<size_t>(step));
      calls.push_back(step);
      // In float64: near t = 0 the division by sqrt(1 - abar) ~ 0.01 magnifies rounding.
      auto e =
          ((x.to(torch::kFloat64) - std::sqrt(a) * x0.to(torch::kFloat64)) / std::sqrt(1.0 - a))
              .to(torch::kFloat32);
      eps.push_back(e);
      return e;
    };
  }
};

// x0 in [-1, 1] (with both end values present) and x_T = q(x_T | x0) with known noise.
std::pair<torch::Tensor, torch::Tensor> clean_and_noise(int64_t n, int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  auto x0 = torch::rand({n, 4, size, size}) * 2.0 - 1.0;
  x0.select(1, 3).narrow(1, 0, 1).fill_(-1.0);  // transparent columns, as in sprites
  x0.select(1, 0).narrow(1, 1, 1).fill_(1.0);
  return {x0, torch::randn({n, 4, size, size})};
}

torch::Tensor noised(const NoiseSchedule& s, const torch::Tensor& x0, const torch::Tensor& noise) {
  return s.add_noise(x0, torch::full({x0.size(0)}, s.steps() - 1, torch::kInt64), noise);
}

TEST(Sampler, DdimTimestepsRunFromTMinusOneToZero) {
  for (const auto spacing : {TimestepSpacing::kUniform, TimestepSpacing::kQuadratic})
    for (int64_t T : {1, 7, 50, 500})
      for (int64_t steps = 1; steps <= T + 2; ++steps) {
        const auto ts = ddim_timesteps(T, steps, spacing);
        const std::string what =
            spacing_name(spacing) + " " + std::to_string(T) + " " + std::to_string(steps);
        ASSERT_EQ(static_cast<int64_t>(ts.size()), std::min(steps, T)) << what;
        EXPECT_EQ(ts.front(), T - 1) << what;
        if (steps > 1 || T == 1) {
          EXPECT_EQ(ts.back(), 0) << what;
        }
        for (size_t i = 1; i < ts.size(); ++i) EXPECT_LT(ts[i], ts[i - 1]) << what;
      }
  EXPECT_EQ(ddim_timesteps(500, 1), (std::vector<int64_t>{499}));
  EXPECT_EQ(ddim_timesteps(10, 4), (std::vector<int64_t>{9, 6, 3, 0}));
  EXPECT_EQ(ddim_timesteps(5, 5), (std::vector<int64_t>{4, 3, 2, 1, 0}));
  // Quadratic: 9 u^2 for u = 1, 2/3, 1/3, 0; where rounding collides, the earlier step moves up.
  EXPECT_EQ(ddim_timesteps(10, 4, TimestepSpacing::kQuadratic), (std::vector<int64_t>{9, 4, 1, 0}));
  EXPECT_EQ(ddim_timesteps(5, 5, TimestepSpacing::kQuadratic),
            (std::vector<int64_t>{4, 3, 2, 1, 0}));
  // Half of 25 quadratic steps fall in the lowest quarter of the schedule (uniform: 7 of 25).
  const auto quad = ddim_timesteps(500, 25, TimestepSpacing::kQuadratic);
  EXPECT_EQ(std::count_if(quad.begin(), quad.end(), [](int64_t t) { return t < 125; }), 12);
  EXPECT_EQ(parse_spacing("quadratic"), TimestepSpacing::kQuadratic);
  EXPECT_THROW(parse_spacing("karras"), Error);
}

TEST(Sampler, OracleEpsMakesEverySamplerReturnTheCleanImage) {
  const NoiseSchedule schedule;  // the generator's own: T = 500
  const auto [x0, noise] = clean_and_noise(4, 8, 21);
  const auto xT = noised(schedule, x0, noise);
  for (int64_t steps : {1, 2, 25, 500}) {
    Oracle oracle(x0, schedule);
    const auto out = ddim_sample_eps(oracle.model(), schedule, xT, steps, 0.0);
    EXPECT_TRUE(torch::allclose(out, x0, 0, 1e-4))
        << "DDIM eta 0, " << steps << " steps, max error " << (out - x0).abs().max().item<double>();
    EXPECT_EQ(oracle.calls, ddim_timesteps(500, steps));
    // Deterministic DDIM keeps x_t on q(x_t | x0) with the starting noise: eps never changes.
    for (size_t i = 0; i < oracle.eps.size(); ++i)
      EXPECT_TRUE(torch::allclose(oracle.eps[i], noise, 0, 1e-3))
          << steps << " steps, call " << i << " (t = " << oracle.calls[i] << ")";
  }
  for (int64_t steps : {25, 500}) {
    Oracle oracle(x0, schedule);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    const auto out = ddim_sample_eps(oracle.model(), schedule, xT, steps, 1.0, gen);
    EXPECT_TRUE(torch::allclose(out, x0, 0, 1e-4)) << "DDIM eta 1, " << steps << " steps";
  }
  Oracle oracle(x0, schedule);
  const auto out =
      ddpm_sample_eps(oracle.model(), schedule, xT, at::make_generator<at::CPUGeneratorImpl>(4));
  EXPECT_TRUE(torch::allclose(out, x0, 0, 1e-4))
      << "DDPM, max error " << (out - x0).abs().max().item<double>();
  ASSERT_EQ(oracle.calls.size(), 500u);
  for (int64_t i = 0; i < 500; ++i) EXPECT_EQ(oracle.calls[i], 499 - i);
}

// The oracle's eps turned into what a v- or x0-predicting net would output:
// v = sqrt(abar) eps - sqrt(1 - abar) x0, or x0 itself.
EpsModel as_prediction(Oracle& oracle, Prediction p) {
  return [&oracle, p, eps_model = oracle.model()](const torch::Tensor& x, const torch::Tensor& t) {
    const auto e = eps_model(x, t).to(torch::kFloat64);
    const double a = oracle.ab.at(static_cast<size_t>(t[0].item<int64_t>()));
    const auto x0 = oracle.x0.to(torch::kFloat64);
    if (p == Prediction::kX0) return oracle.x0.clone();
    if (p == Prediction::kV)
      return (std::sqrt(a) * e - std::sqrt(1.0 - a) * x0).to(torch::kFloat32);
    return e.to(torch::kFloat32);
  };
}

// The same for v and x0 predictions, on both schedules: whatever the net predicts, the sampler
// must turn the exact prediction into the clean image.
TEST(Sampler, OracleVAndX0MakeEverySamplerReturnTheCleanImage) {
  for (const auto kind : {ScheduleKind::kLinear, ScheduleKind::kCosine}) {
    const NoiseSchedule schedule(500, kind);
    const auto [x0, noise] = clean_and_noise(4, 8, 23);
    const auto xT = noised(schedule, x0, noise);
    for (const auto p : {Prediction::kV, Prediction::kX0, Prediction::kEps}) {
      const std::string what = schedule_name(kind) + ", " + prediction_name(p);
      for (int64_t steps : {1, 25}) {
        // eps at the cosine schedule's last step (abar ~1e-8) divides x_T by sqrt(abar) ~ 1e-4:
        // float32 rounding of x_T alone gives ~1e-3 in x0_hat. One step from there is what eps
        // prediction cannot do (why v is the default); later steps correct it.
        if (p == Prediction::kEps && kind == ScheduleKind::kCosine && steps == 1) continue;
        for (const auto spacing : {TimestepSpacing::kUniform, TimestepSpacing::kQuadratic}) {
          const std::string how =
              what + ", " + std::to_string(steps) + " " + spacing_name(spacing) + " steps, ";
          Oracle oracle(x0, schedule);
          const auto out = ddim_sample_eps(as_prediction(oracle, p), schedule, xT, steps, 0.0,
                                           std::nullopt, p, spacing);
          EXPECT_TRUE(torch::allclose(out, x0, 0, 1e-4))
              << how << "DDIM eta 0, max error " << (out - x0).abs().max().item<double>();
          Oracle second(x0, schedule);
          const auto out2m =
              dpm_solver_sample_eps(as_prediction(second, p), schedule, xT, steps, p, spacing);
          EXPECT_TRUE(torch::allclose(out2m, x0, 0, 1e-4))
              << how << "DPM-Solver++(2M), max error " << (out2m - x0).abs().max().item<double>();
          EXPECT_EQ(second.calls, ddim_timesteps(500, steps, spacing)) << how;
        }
      }
      Oracle eta1(x0, schedule);
      const auto out1 = ddim_sample_eps(as_prediction(eta1, p), schedule, xT, 25, 1.0,
                                        at::make_generator<at::CPUGeneratorImpl>(3), p);
      EXPECT_TRUE(torch::allclose(out1, x0, 0, 1e-4)) << what << ", DDIM eta 1";
      Oracle ddpm(x0, schedule);
      const auto out2 = ddpm_sample_eps(as_prediction(ddpm, p), schedule, xT,
                                        at::make_generator<at::CPUGeneratorImpl>(4), p);
      EXPECT_TRUE(torch::allclose(out2, x0, 0, 1e-4))
          << what << ", DDPM, max error " << (out2 - x0).abs().max().item<double>();
    }
  }
}

// A v-model read as if it predicted eps must not give the clean image in one step: the
// prediction kind is not ignored. (Over many steps the oracle, which knows x0, would correct it.)
TEST(Sampler, PredictionKindChangesTheStep) {
  const NoiseSchedule schedule(500, ScheduleKind::kLinear);
  const auto [x0, noise] = clean_and_noise(2, 8, 24);
  const auto xT = noised(schedule, x0, noise);
  Oracle right(x0, schedule), wrong(x0, schedule);
  const auto ok = ddim_sample_eps(as_prediction(right, Prediction::kV), schedule, xT, 1, 0.0,
                                  std::nullopt, Prediction::kV);
  const auto out = ddim_sample_eps(as_prediction(wrong, Prediction::kV), schedule, xT, 1, 0.0,
                                   std::nullopt, Prediction::kEps);
  EXPECT_TRUE(torch::allclose(ok, x0, 0, 1e-4));
  EXPECT_GT((out - x0).abs().max().item<double>(), 0.1);
}

TEST(NoiseSchedule, CosineEndsAtPureNoise) {
  const NoiseSchedule cosine(500, ScheduleKind::kCosine), linear(500, ScheduleKind::kLinear);
  EXPECT_EQ(cosine.kind(), ScheduleKind::kCosine);
  EXPECT_EQ(linear.kind(), ScheduleKind::kLinear);
  const auto& ab = cosine.host_alpha_bars();
  const auto& betas = cosine.host_betas();
  ASSERT_EQ(ab.size(), 500u);
  for (size_t t = 1; t < ab.size(); ++t) EXPECT_LT(ab[t], ab[t - 1]) << t;
  for (double b : betas) EXPECT_TRUE(b > 0 && b <= 0.999) << b;
  EXPECT_GT(ab[0], 0.9998);  // the first step adds almost no noise
  EXPECT_LT(ab[499], 1e-6);  // x_T keeps nothing of the image: N(0, I) is where sampling starts
  EXPECT_NEAR(ab[249], 0.5, 0.02);  // cos^2 at the middle, shifted by s = 0.008
  // The linear schedule is the DDPM paper's, as before: its end keeps sqrt(0.0064) of the image.
  EXPECT_NEAR(linear.host_alpha_bars()[499], NoiseSchedule(500).host_alpha_bars()[499], 1e-15);
  EXPECT_GT(linear.host_alpha_bars()[499], 0.006);
  // The float32 tensors agree with the host values; snr and velocity follow their definitions.
  const auto t = torch::tensor({0, 100, 499}, torch::kInt64);
  const auto snr = cosine.snr(t);
  EXPECT_NEAR(snr[1].item<double>(), ab[100] / (1 - ab[100]), 1e-3 * ab[100] / (1 - ab[100]));
  torch::manual_seed(5);
  const auto x0 = torch::rand({3, 4, 2, 2}) * 2 - 1, e = torch::randn({3, 4, 2, 2});
  const auto v = cosine.velocity(x0, t, e);
  const double a = ab[100];
  EXPECT_TRUE(torch::allclose(v[1], std::sqrt(a) * e[1] - std::sqrt(1 - a) * x0[1], 1e-5, 1e-5));
  EXPECT_THROW(parse_schedule("quadratic"), Error);
  EXPECT_THROW(parse_prediction("noise"), Error);
}

// min-SNR-gamma: every prediction's weighted loss is min(SNR, gamma) x the MSE of x0.
TEST(GeneratorTraining, MinSnrWeightIsTheSameX0WeightForEveryPrediction) {
  const auto snr = torch::tensor({0.01, 1.0, 5.0, 400.0}, torch::kFloat32);
  const auto x0_weight = snr.clamp_max(5.0);
  // MSE(eps) = snr MSE(x0), MSE(v) = (snr + 1) MSE(x0).
  EXPECT_TRUE(torch::allclose(min_snr_weight(snr, Prediction::kEps, 5) * snr, x0_weight));
  EXPECT_TRUE(torch::allclose(min_snr_weight(snr, Prediction::kV, 5) * (snr + 1), x0_weight));
  EXPECT_TRUE(torch::allclose(min_snr_weight(snr, Prediction::kX0, 5), x0_weight));
  EXPECT_TRUE(torch::equal(min_snr_weight(snr, Prediction::kV, 0), torch::ones_like(snr)));
}

// The UNet's upsampling repeats each pixel into a 2x2 block, as repeat_interleave does on both
// axes; its gradient sums the block's four gradients.
TEST(UNet, UpsamplingRepeatsEachPixelIntoATwoByTwoBlock) {
  torch::manual_seed(3);
  const auto x = torch::randn({2, 3, 4, 5}, torch::requires_grad());
  const auto up = upsample_nearest_x2(x);
  EXPECT_TRUE(torch::equal(up, x.repeat_interleave(2, 2).repeat_interleave(2, 3)));
  const auto g = torch::randn({2, 3, 8, 10});
  const auto grad = torch::autograd::grad({up}, {x}, {g})[0];
  const auto want = g.view({2, 3, 4, 2, 5, 2}).sum({3, 5});
  EXPECT_TRUE(torch::allclose(grad, want, 1e-6, 1e-6));
}

TEST(UNet, AttentionStartsAsTheIdentityAndIsRecorded) {
  torch::manual_seed(6);
  AttentionBlock block(32, 2);
  const auto x = torch::randn({2, 32, 4, 4});
  EXPECT_TRUE(torch::equal(block(x), x));  // the projection starts at zero
  {
    torch::NoGradGuard no_grad;
    block->proj->weight.normal_(0, 0.1);
  }
  // Attention mixes positions: changing one position changes the output at another.
  auto y = x.clone();
  y[0][0][0][0] += 5.0;
  EXPECT_FALSE(torch::allclose(block(x)[0].select(1, 3).select(1, 3),
                               block(y)[0].select(1, 3).select(1, 3)));
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.attention = true;
  UNet net(o);
  EXPECT_EQ(net->forward(torch::randn({2, 4, 16, 16}), torch::tensor({1, 2}), torch::tensor({0, 4}))
                .sizes(),
            (std::vector<int64_t>{2, 4, 16, 16}));
  EXPECT_FALSE(net->up2_attn);
}

// attention_s2 adds a block after the decoder's S/2 block, over its S/2 x S/2 positions. It
// starts as the identity, so a UNet with it computes what the same weights compute without it,
// until training moves its projection.
TEST(UNet, AttentionAtHalfSizeStartsAsTheIdentity) {
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.attention = true;
  torch::manual_seed(3);
  UNet without(o);
  o.attention_s2 = true;
  UNet with(o);
  ASSERT_TRUE(with->up2_attn);
  EXPECT_EQ(with->up2_attn->norm->options.num_channels(), 16);  // the S/2 width, base x 2
  {
    torch::NoGradGuard no_grad;
    without->out_conv->weight.normal_(0, 0.1);  // zero at the start: every output would be zero
    const auto from = without->named_parameters();
    for (const auto& p : with->named_parameters())
      if (p.key().rfind("up2_attn.", 0) != 0) p.value().copy_(from[p.key()]);
  }
  const auto x = torch::randn({2, 4, 16, 16});
  const auto t = torch::tensor({1, 300}), c = torch::tensor({0, 4});
  EXPECT_TRUE(torch::allclose(with->forward(x, t, c), without->forward(x, t, c), 1e-6, 1e-6));
  // Once its projection is not zero, it mixes positions of the S/2 map.
  {
    torch::NoGradGuard no_grad;
    with->up2_attn->proj->weight.normal_(0, 0.5);
  }
  EXPECT_FALSE(torch::allclose(with->forward(x, t, c), without->forward(x, t, c), 1e-4, 1e-4));
}

TEST(UNet, ScaleShiftNormsTakeTheEmbeddingAsScaleAndShift) {
  torch::manual_seed(8);
  ResBlock plain(8, 8, 16), adaptive(8, 8, 16, /*scale_shift=*/true);
  EXPECT_EQ(plain->emb_proj->weight.size(0), 8);
  EXPECT_EQ(adaptive->emb_proj->weight.size(0), 16);  // scale and shift for each channel
  const auto x = torch::randn({2, 8, 4, 4}), emb = torch::randn({2, 16});
  torch::NoGradGuard no_grad;
  for (const char* name : {"conv1", "conv2"}) {
    auto* from = plain->named_modules()[name]->as<torch::nn::Conv2d>();
    auto* to = adaptive->named_modules()[name]->as<torch::nn::Conv2d>();
    to->weight.copy_(from->weight);
    to->bias.copy_(from->bias);
  }
  // With no embedding either way, the two blocks are one function.
  for (auto* block : {plain.get(), adaptive.get()}) {
    block->emb_proj->weight.zero_();
    block->emb_proj->bias.zero_();
  }
  EXPECT_TRUE(torch::allclose(plain(x, emb), adaptive(x, emb), 1e-6, 1e-6));
  // Scale s and shift b (the first and second halves of emb_proj's output) act on the norm.
  const auto s = torch::randn({8}), b = torch::randn({8});
  adaptive->emb_proj->bias.copy_(torch::cat({s, b}));
  const auto h = adaptive->conv1(torch::silu(adaptive->norm1(x)));
  const auto normed = adaptive->norm2(h) * (1 + s.view({1, 8, 1, 1})) + b.view({1, 8, 1, 1});
  EXPECT_TRUE(
      torch::allclose(adaptive(x, emb), adaptive->conv2(torch::silu(normed)) + x, 1e-5, 1e-5));
  // The UNet passes the option to every block.
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.scale_shift = true;
  UNet net(o);
  for (auto* block : {net->block1.get(), net->block2.get(), net->mid1.get(), net->mid2.get(),
                      net->up2.get(), net->up1.get()})
    EXPECT_EQ(block->emb_proj->weight.size(0), 2 * block->norm2->options.num_channels());
}

// --unet-mult sets the widths at S, S/2 and S/4 (base x mult), attention included, and the
// UNet still maps (B, 4, S, S) to (B, 4, S, S).
TEST(UNet, MultipliersSetTheWidthOfEachLevel) {
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.attention = true;
  o.mult = {1, 2, 4};
  UNet net(o);
  EXPECT_EQ(net->block1->conv2->weight.size(0), 8);   // S
  EXPECT_EQ(net->block2->conv2->weight.size(0), 16);  // S/2
  EXPECT_EQ(net->mid1->conv1->weight.size(0), 32);    // S/4
  EXPECT_EQ(net->mid2->conv2->weight.size(0), 32);
  EXPECT_EQ(net->mid_attn->norm->options.num_channels(), 32);
  EXPECT_EQ(net->up2->conv1->weight.size(1), 32 + 16);  // S/4 upsampled beside the S/2 skip
  EXPECT_EQ(net->up1->conv1->weight.size(1), 16 + 8);
  EXPECT_EQ(net->forward(torch::randn({2, 4, 16, 16}), torch::tensor({1, 2}), torch::tensor({0, 4}))
                .sizes(),
            (std::vector<int64_t>{2, 4, 16, 16}));

  EXPECT_EQ(parse_unet_mult("1,2,4"), (std::array<int64_t, 3>{1, 2, 4}));
  EXPECT_EQ(unet_mult_text({1, 2, 4}), "1,2,4");
  for (const char* bad :
       {"", "1,2", "1,2,4,8", "1,0,2", "1,2,x", "1,,2", "1,2,17", "-1,2,2", "1 2 2"})
    EXPECT_THROW(parse_unet_mult(bad), Error) << bad;
}

// The ResBlocks' 3x3 convolutions take spritetorch's AVX2 kernels where they run
// (models/conv3x3.h): the output and every gradient agree with oneDNN's to float rounding, and the
// bits differ where the kernels ran (they sum in another order), so the route is taken.
TEST(UNet, ResBlockConvolutionsTakeTheAvx2KernelsWhereTheyRun) {
  UNet net = testing::unet_whose_every_weight_learns(/*classes=*/3, /*seed=*/3);
  if (!models::conv3x3_fused(*net->block1->conv1, torch::zeros({1, 16, 4, 4})))
    GTEST_SKIP() << "the AVX2 3x3 kernels do not run here (no AVX2, AVX-512, or threads)";
  const auto x = torch::randn({3, 4, 16, 16});
  const auto t = torch::tensor({3, 250, 499}, torch::kInt64);
  const auto c = torch::tensor({0, 2, 3}, torch::kInt64);
  auto run = [&](bool kernels) {
    models::set_conv3x3_kernel(kernels);
    net->zero_grad();
    const auto y = net->forward(x, t, c);
    y.pow(2).mean().backward();
    std::vector<torch::Tensor> out = {y.detach()};
    for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
    models::set_conv3x3_kernel(true);
    return out;
  };
  const auto own = run(true), onednn = run(false);
  ASSERT_EQ(own.size(), onednn.size());
  for (size_t i = 0; i < own.size(); ++i) {
    const double scale = onednn[i].abs().max().item<double>() + 1e-12;
    EXPECT_LT((own[i] - onednn[i]).abs().max().item<double>() / scale, 1e-4)
        << (i == 0 ? "the output" : "parameter " + std::to_string(i - 1));
  }
  // block1.conv1's weight gradient: its position among the parameters, found by identity.
  const auto params = net->parameters();
  const auto at = std::find_if(params.begin(), params.end(), [&](const torch::Tensor& p) {
    return p.is_same(net->block1->conv1->weight);
  });
  ASSERT_NE(at, params.end());
  const size_t index = 1 + static_cast<size_t>(at - params.begin());
  EXPECT_FALSE(torch::equal(own[index], onednn[index])) << "the kernels did not run";
  EXPECT_FALSE(torch::equal(own[0], onednn[0])) << "the kernels did not run";
}

// Sampling in bf16 runs a bf16 copy of the UNet (with attention): its output is the fp32 one up to
// bf16 rounding, and the generator's own net stays fp32.
TEST(Sampler, Bf16RunsACopyOfTheNetInBf16) {
  auto g = tiny_generator();
  const auto x = torch::randn({3, 4, 16, 16});
  const auto t = torch::tensor({5, 20, 40}), c = torch::tensor({0, 1, 3});
  auto copy = bf16_copy(*g.net);
  EXPECT_EQ(copy->out_conv->weight.scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(copy->is_training());
  torch::NoGradGuard no_grad;
  const auto want = g.net->forward(x, t, c), got = copy->forward(x, t, c);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  const double scale = want.abs().max().item<double>();
  EXPECT_GT(scale, 0.01);
  // Without native bf16 (an AVX2-only CPU) LibTorch's bf16 kernels round differently: 5.5% of the
  // scale on one, under 5% where the CPU has native bf16.
  const double tolerance = device::describe_device(torch::kCPU).bf16 ? 0.05 : 0.1;
  EXPECT_LT((got.to(torch::kFloat32) - want).abs().max().item<double>(), tolerance * scale);
  SampleOptions o;  // sampling in bf16 (graph_sampler_test: near fp32) leaves g.net in fp32
  o.steps = 2;
  o.precision = "bf16";
  sample(g, torch::tensor({0, 1}, torch::kInt64), o);
  EXPECT_EQ(g.net->out_conv->weight.scalar_type(), torch::kFloat32);
}

// Sampling channels_last runs a copy of the UNet whose convolution weights are channels_last: the
// activations stay NHWC through the whole net (its output too), the values are the NCHW pass's up
// to the kernels' rounding, and the generator's own net keeps its NCHW weights.
TEST(Sampler, ChannelsLastRunsAnNhwcCopyOfTheNet) {
  auto g = tiny_generator();
  const auto x = torch::randn({3, 4, 16, 16}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto t = torch::tensor({5, 20, 40}), c = torch::tensor({0, 1, 3});
  auto copy = sampling_copy(*g.net, torch::kFloat32, /*channels_last=*/true);
  EXPECT_FALSE(copy->is_training());
  for (const auto& p : copy->parameters()) {
    if (p.dim() == 4) {
      EXPECT_TRUE(p.is_contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  torch::NoGradGuard no_grad;
  const auto want = g.net->forward(x.contiguous(), t, c), got = copy->forward(x, t, c);
  EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast)) << got.strides();
  const double scale = want.abs().max().item<double>();
  EXPECT_GT(scale, 0.01);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-4 * scale);

  SampleOptions o;
  o.steps = 3;
  o.eta = 0;
  o.precision = "fp32";
  const auto labels = torch::tensor({0, 1, 2}, torch::kInt64);
  const auto nchw = sample(g, labels, o);
  o.channels_last = true;
  const auto nhwc = sample(g, labels, o);
  EXPECT_LT((nhwc - nchw).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(g.net->out_conv->weight.is_contiguous());
  EXPECT_FALSE(g.net->out_conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
}

// --precision auto (generate's and eval's default) samples in bf16 only on a CPU whose native bf16
// pays (DeviceInfo::bf16_auto), and what it samples is exactly what the precision it resolves to
// samples.
TEST(Sampler, AutoPrecisionIsBf16OnlyOnACpuWhoseNativeBf16Pays) {
  const torch::Device cpu(torch::kCPU);
  const std::string native = device::describe_device(cpu).bf16_auto ? "bf16" : "fp32";
  EXPECT_EQ(resolve_sampling_precision("auto", cpu), native);
  EXPECT_EQ(resolve_sampling_precision("auto", torch::Device("cuda:0")), "fp32");
  EXPECT_EQ(resolve_sampling_precision("fp32", cpu), "fp32");
  EXPECT_EQ(resolve_sampling_precision("bf16", torch::Device("cuda:0")), "bf16");
  try {
    resolve_sampling_precision("fp16", cpu);
    ADD_FAILURE() << "fp16 sampling was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, fp32 or bf16"), std::string::npos);
  }
  // MPS: auto is fp32, and bf16 is refused in the library, not only by the CLI.
  const torch::Device mps(torch::kMPS);
  EXPECT_EQ(resolve_sampling_precision("auto", mps), "fp32");
  try {
    resolve_sampling_precision("bf16", mps);
    ADD_FAILURE() << "bf16 sampling on MPS was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs on CUDA and the CPU, not mps"), std::string::npos);
  }
  auto g = tiny_generator();
  SampleOptions o;
  o.steps = 3;
  o.precision = "auto";
  const auto labels = torch::tensor({0, 1, 2}, torch::kInt64);
  const auto automatic = sample(g, labels, o);
  o.precision = native;
  EXPECT_TRUE(torch::equal(automatic, sample(g, labels, o)));
  o.precision = native == "bf16" ? "fp32" : "bf16";  // the other one rounds differently
  EXPECT_FALSE(torch::equal(automatic, sample(g, labels, o)));
}

TEST(GeneratorTraining, DefaultEpochsFollowTheDataset) {
  EXPECT_EQ(default_steps(64), 4500);
  EXPECT_EQ(default_steps(32), 9000);  // the same sprites in steps of half as many
  EXPECT_EQ(default_steps(7) * 7 - kDefaultSprites, 1);  // rounded up to whole steps
  EXPECT_EQ(default_epochs(64 * 20, 64), (4500 + 19) / 20);
  EXPECT_EQ(default_epochs(32 * 20, 32), 9000 / 20);
  EXPECT_EQ(default_epochs(64 * 4500 * 3, 64), 1);  // at least one
  EXPECT_EQ(default_epochs(10, 64), 4500);          // one step per epoch
}

TEST(GeneratorTraining, DefaultBatchIsSmallerOnTheCpu) {
  EXPECT_EQ(default_batch(torch::kCPU), 16);
  EXPECT_EQ(default_batch(torch::Device(torch::kCUDA, 0)), 64);  // a device type, none needed
  EXPECT_EQ(default_batch(torch::Device(torch::kMPS)), 64);
}

// With the oracle, every x_t a stochastic sampler visits must again be a draw from q(x_t | x0): the
// eps the oracle reads back is N(0, 1) at every step. A variance other than the posterior's (e.g.
// beta_t instead of beta~_t) shows at the last steps, where beta_t is ~2x beta~_t.
TEST(Sampler, StochasticSamplersKeepTheForwardMarginals) {
  const NoiseSchedule schedule;
  const auto [x0, noise] = clean_and_noise(16, 16, 22);  // 16,384 values per step
  const auto xT = noised(schedule, x0, noise);
  auto check = [](const Oracle& oracle, const std::string& what) {
    for (size_t i = 0; i < oracle.eps.size(); ++i) {
      const double mean = oracle.eps[i].mean().item<double>(),
                   sd = oracle.eps[i].std().item<double>();
      EXPECT_NEAR(mean, 0.0, 0.05) << what << ", t = " << oracle.calls[i];
      EXPECT_NEAR(sd, 1.0, 0.05) << what << ", t = " << oracle.calls[i];
    }
  };
  Oracle ddpm(x0, schedule);
  ddpm_sample_eps(ddpm.model(), schedule, xT, at::make_generator<at::CPUGeneratorImpl>(5));
  check(ddpm, "DDPM");
  Oracle ddim(x0, schedule);
  ddim_sample_eps(ddim.model(), schedule, xT, 25, 1.0, at::make_generator<at::CPUGeneratorImpl>(6));
  check(ddim, "DDIM eta 1");
}

// The exact eps-prediction of a known data distribution: every value independently `lo` with
// probability 1 - p_hi or `hi` with probability p_hi, so that E[x0 | x_t] is a logistic mix of the
// two and x0_hat never leaves [-1, 1] (no clipping). Unlike the x0 oracle above it does not know
// the answer: a correct sampler must carry draws of q(x_T) to the data distribution itself.
struct TwoPointData {
  double lo = -1.0, hi = 0.5, p_hi = 0.3;
  std::vector<double> ab;

  explicit TwoPointData(const NoiseSchedule& schedule) : ab(schedule.host_alpha_bars()) {}
  torch::Tensor draw(std::vector<int64_t> shape, uint64_t seed) const {
    torch::manual_seed(seed);
    return torch::where(torch::rand(shape) < p_hi, torch::full(shape, hi), torch::full(shape, lo));
  }
  EpsModel model() const {
    return [this](const torch::Tensor& x, const torch::Tensor& t) {
      const double a = ab.at(static_cast<size_t>(t[0].item<int64_t>()));
      const auto xd = x.to(torch::kFloat64);
      // log p(v | x_t) = log p(v) - (x_t - sqrt(a) v)^2 / (2 (1 - a)) + const
      const auto log_lo = std::log(1 - p_hi) - (xd - std::sqrt(a) * lo).pow(2) / (2 * (1 - a));
      const auto log_hi = std::log(p_hi) - (xd - std::sqrt(a) * hi).pow(2) / (2 * (1 - a));
      const auto x0 = lo + (hi - lo) * torch::sigmoid(log_hi - log_lo);  // E[x0 | x_t]
      return ((xd - std::sqrt(a) * x0) / std::sqrt(1 - a)).to(torch::kFloat32);
    };
  }
  // Share of values within 0.01 of lo or hi, and share at hi.
  std::pair<double, double> shares(const torch::Tensor& out) const {
    const auto at_lo = (out - lo).abs() < 0.01, at_hi = (out - hi).abs() < 0.01;
    return {(at_lo | at_hi).to(torch::kFloat64).mean().item<double>(),
            at_hi.to(torch::kFloat64).mean().item<double>()};
  }
};

TEST(Sampler, ExactEpsOfAKnownDistributionGivesThatDistribution) {
  const NoiseSchedule schedule;
  const TwoPointData data(schedule);
  const std::vector<int64_t> shape = {16, 4, 16, 16};  // 16,384 values: the share's sd is 0.0036
  const auto xT = noised(schedule, data.draw(shape, 31), torch::randn(shape));  // q(x_T)
  auto check = [&](const torch::Tensor& out, const std::string& what) {
    const auto [on_support, at_hi] = data.shares(out);
    EXPECT_GT(on_support, 0.995) << what;
    EXPECT_NEAR(at_hi, data.p_hi, 0.02) << what;
  };
  check(ddim_sample_eps(data.model(), schedule, xT, 25, 0.0), "DDIM eta 0, 25 steps");
  check(ddim_sample_eps(data.model(), schedule, xT, 100, 0.0), "DDIM eta 0, 100 steps");
  check(ddim_sample_eps(data.model(), schedule, xT, 25, 1.0,
                        at::make_generator<at::CPUGeneratorImpl>(32)),
        "DDIM eta 1, 25 steps");
  check(ddpm_sample_eps(data.model(), schedule, xT, at::make_generator<at::CPUGeneratorImpl>(33)),
        "DDPM");
  check(ddim_sample_eps(data.model(), schedule, xT, 25, 0.0, std::nullopt, Prediction::kEps,
                        TimestepSpacing::kQuadratic),
        "DDIM eta 0, 25 quadratic steps");
  check(dpm_solver_sample_eps(data.model(), schedule, xT, 25), "DPM-Solver++(2M), 25 steps");
  check(dpm_solver_sample_eps(data.model(), schedule, xT, 25, Prediction::kEps,
                              TimestepSpacing::kQuadratic),
        "DPM-Solver++(2M), 25 quadratic steps");
}

// Data x0 ~ N(0, s^2) in every value: E[x0 | x_t] = sqrt(a) s^2 x_t / (a s^2 + 1 - a), and the ODE
// that DDIM (eta 0) and DPM-Solver solve keeps x_t / sqrt(a s^2 + 1 - a) constant, so its exact
// end from x_T is known. The samplers' error against it: DPM-Solver++(2M) is second order (twice
// the steps, about a quarter of the error), DDIM first order (about half); quadratic spacing
// halves DDIM's error at 25 steps. What is left at 100 steps is the last step's x0_hat at t = 0.
TEST(Sampler, SecondOrderSolverConvergesFasterThanDdim) {
  const NoiseSchedule schedule(500, ScheduleKind::kCosine);
  const auto& ab = schedule.host_alpha_bars();
  const double s = 0.2;  // |x0_hat| stays well inside [-1, 1]: no clipping
  const EpsModel model = [&](const torch::Tensor& x, const torch::Tensor& t) {
    const double a = ab.at(static_cast<size_t>(t[0].item<int64_t>()));
    const auto x0 = std::sqrt(a) * s * s / (a * s * s + 1 - a) * x.to(torch::kFloat64);
    return ((x.to(torch::kFloat64) - std::sqrt(a) * x0) / std::sqrt(1 - a)).to(torch::kFloat32);
  };
  torch::manual_seed(12);
  const auto z = torch::randn({16, 4, 8, 8});
  const double a_T = ab.back(), a_0 = ab.front();
  const auto xT = z * std::sqrt(a_T * s * s + 1 - a_T);
  // The ODE's x at t = 0, then the x0_hat there that every sampler's last step takes.
  const auto end =
      std::sqrt(a_0) * s * s / (a_0 * s * s + 1 - a_0) * z * std::sqrt(a_0 * s * s + 1 - a_0);
  auto error = [&](const torch::Tensor& out) { return (out - end).abs().max().item<double>(); };
  const auto quadratic = TimestepSpacing::kQuadratic;
  const double ddim25 = error(ddim_sample_eps(model, schedule, xT, 25, 0.0));
  const double ddim50 = error(ddim_sample_eps(model, schedule, xT, 50, 0.0));
  const double ddim_q25 = error(
      ddim_sample_eps(model, schedule, xT, 25, 0.0, std::nullopt, Prediction::kEps, quadratic));
  const double dpm_q25 =
      error(dpm_solver_sample_eps(model, schedule, xT, 25, Prediction::kEps, quadratic));
  const double dpm_q50 =
      error(dpm_solver_sample_eps(model, schedule, xT, 50, Prediction::kEps, quadratic));
  const double dpm_q100 =
      error(dpm_solver_sample_eps(model, schedule, xT, 100, Prediction::kEps, quadratic));
  EXPECT_GT(ddim25, 0.02);  // DDIM's 25 uniform steps are visibly off (8-bit levels: 0.008)
  EXPECT_NEAR(ddim25 / ddim50, 2.0, 0.3) << ddim25 << " " << ddim50;
  EXPECT_LT(ddim_q25, ddim25 / 1.5) << ddim_q25 << " " << ddim25;
  EXPECT_LT(dpm_q25, ddim_q25 / 3) << dpm_q25 << " " << ddim_q25;
  EXPECT_GT(dpm_q25 / dpm_q50, 3.0) << dpm_q25 << " " << dpm_q50;
  EXPECT_LT(dpm_q100, 1e-3);
}

// Eq. 12 of Song et al. with x0_hat clipped to [-1, 1] and eps re-derived from the clipped x0_hat,
// against a constant eps large enough that many x0_hat fall outside [-1, 1].
TEST(Sampler, DdimStepClipsX0AndRederivesEps) {
  const NoiseSchedule schedule(50);
  torch::manual_seed(9);
  const auto xT = torch::randn({2, 4, 8, 8}), e = 2.0 * torch::randn({2, 4, 8, 8});
  std::vector<torch::Tensor> seen;
  const EpsModel model = [&](const torch::Tensor& x, const torch::Tensor&) {
    seen.push_back(x.clone());
    return e;
  };
  const auto out = ddim_sample_eps(model, schedule, xT, 2, 0.0);  // t = 49, then 0
  ASSERT_EQ(seen.size(), 2u);
  const auto& ab = schedule.host_alpha_bars();
  const double a = ab[49], a_prev = ab[0];
  const auto raw = (xT - std::sqrt(1 - a) * e) / std::sqrt(a);
  ASSERT_GT((raw.abs() > 1).sum().item<int64_t>(), 0);  // the clip matters here
  const auto x0 = raw.clamp(-1, 1);
  const auto eps = (xT - std::sqrt(a) * x0) / std::sqrt(1 - a);
  const auto x1 = std::sqrt(a_prev) * x0 + std::sqrt(1 - a_prev) * eps;
  EXPECT_TRUE(torch::allclose(seen[1], x1, 1e-5, 1e-5));
  // The last step goes to abar = 1: the clipped x0_hat itself.
  const auto last = ((x1 - std::sqrt(1 - a_prev) * e) / std::sqrt(a_prev)).clamp(-1, 1);
  EXPECT_TRUE(torch::allclose(out, last, 1e-5, 1e-5));
}

TEST(Sampler, DdimEtaZeroIsDeterministicAndDrawsNoNoise) {
  auto g = tiny_generator();
  torch::manual_seed(2);
  const auto x = torch::randn({3, 4, 16, 16});
  const auto c = torch::tensor({0, 1, 2}, torch::kInt64);
  const auto a = ddim_sample(g.net, g.schedule, x, c, 6, 2.0);
  EXPECT_TRUE(torch::equal(a, ddim_sample(g.net, g.schedule, x, c, 6, 2.0)));
  // A generator given with eta 0 is not used.
  EXPECT_TRUE(torch::equal(a, ddim_sample(g.net, g.schedule, x, c, 6, 2.0, 0.0,
                                          at::make_generator<at::CPUGeneratorImpl>(7))));
  EXPECT_THROW(ddim_sample(g.net, g.schedule, x, c, 6, 2.0, 0.5),
               Error);  // noise needs a generator
  const auto n1 = ddim_sample(g.net, g.schedule, x, c, 6, 2.0, 1.0,
                              at::make_generator<at::CPUGeneratorImpl>(7));
  EXPECT_TRUE(torch::equal(n1, ddim_sample(g.net, g.schedule, x, c, 6, 2.0, 1.0,
                                           at::make_generator<at::CPUGeneratorImpl>(7))));
  EXPECT_FALSE(torch::equal(n1, a));
}

// DDPM's posterior step is DDIM's eta = 1 step between consecutive timesteps (Song et al.,
// sec. 4.1): over all T steps, with the same noise, the two samplers agree.
TEST(Sampler, DdpmIsDdimOverAllStepsWithEtaOne) {
  auto g = tiny_generator();
  torch::manual_seed(4);
  const auto x = torch::randn({3, 4, 16, 16});
  const auto c = torch::tensor({2, 0, 1}, torch::kInt64);
  const auto ddpm =
      ddpm_sample(g.net, g.schedule, x, c, 2.0, at::make_generator<at::CPUGeneratorImpl>(8));
  const auto ddim = ddim_sample(g.net, g.schedule, x, c, g.schedule.steps(), 2.0, 1.0,
                                at::make_generator<at::CPUGeneratorImpl>(8));
  EXPECT_TRUE(torch::allclose(ddpm, ddim, 1e-4, 1e-4))
      << "max difference " << (ddpm - ddim).abs().max().item<double>();
}

TEST(Sampler, TheReportNamesWhatRuns) {
  SampleOptions o;  // the defaults: DDIM, 50 uniform steps, eta 1, guidance 4 at t/T 0.3-0.9
  EXPECT_EQ(describe_sampler(o, 500), "ddim 50 uniform steps, eta 1, guidance 4 at t/T 0.3-0.9");
  EXPECT_EQ(sampler_json(o, 500), (nlohmann::json{{"sampler", "ddim"},
                                                  {"steps", 50},
                                                  {"spacing", "uniform"},
                                                  {"eta", 1.0},
                                                  {"guidance", 4.0},
                                                  {"guidance_interval", {0.3, 0.9}}}));
  EXPECT_EQ(guidance_interval_text(o.guidance_interval), "0.3:0.9");
  // Guidance on every step, or none at all, names no interval.
  o.guidance_interval = {};
  EXPECT_EQ(describe_sampler(o, 500), "ddim 50 uniform steps, eta 1, guidance 4");
  o.guidance = 1;
  o.guidance_interval = {0.4, 1.0};
  EXPECT_EQ(describe_sampler(o, 500), "ddim 50 uniform steps, eta 1, guidance 1");
  o.guidance = 2;
  o.guidance_interval = {};
  // DDPM takes every step of the schedule, whatever --steps held; it has no spacing or eta.
  o.sampler = "ddpm";
  EXPECT_EQ(describe_sampler(o, 500), "ddpm, all 500 steps, guidance 2");
  const auto ddpm = sampler_json(o, 500);
  EXPECT_EQ(ddpm["steps"], 500);
  EXPECT_TRUE(ddpm["spacing"].is_null());
  EXPECT_TRUE(ddpm["eta"].is_null());
  // DPM-Solver++(2M) has steps and spacing, no eta.
  o.sampler = "dpm++2m";
  o.steps = 25;
  o.spacing = TimestepSpacing::kQuadratic;
  o.guidance = 4;
  EXPECT_EQ(describe_sampler(o, 500), "dpm++2m 25 quadratic steps, guidance 4");
  EXPECT_TRUE(sampler_json(o, 500)["eta"].is_null());
  EXPECT_EQ(sampler_json(o, 500)["spacing"], "quadratic");
  // One step samples at t/T 1 alone: outside 0.3-0.9, the guidance changes nothing, and says so.
  o = SampleOptions();
  o.steps = 1;
  EXPECT_EQ(describe_sampler(o, 500),
            "ddim 1 uniform step, eta 1, guidance 4 at t/T 0.3-0.9 (its one step is outside it: "
            "unguided; widen --guidance-interval)");
  o.steps = 2;  // t/T 1 and 0
  EXPECT_EQ(describe_sampler(o, 500),
            "ddim 2 uniform steps, eta 1, guidance 4 at t/T 0.3-0.9 (none of its steps falls in "
            "it: unguided; widen --guidance-interval)");
  o.steps = 3;  // t/T 1, 0.5, 0: the middle one is guided
  EXPECT_EQ(describe_sampler(o, 500), "ddim 3 uniform steps, eta 1, guidance 4 at t/T 0.3-0.9");
}

TEST(Sprites, AlphaBinaryAndPaletteOnly) {
  auto g = tiny_generator();
  SampleOptions o;
  o.steps = 3;
  const auto sprites = to_sprites(sample(g, torch::arange(6, torch::kInt64).remainder(3), o));
  const auto alpha = sprites.select(1, 3);
  EXPECT_TRUE(((alpha == 0) | (alpha == 255)).all().item<bool>());
  EXPECT_EQ(sprites.narrow(1, 0, 3)
                .masked_select((alpha == 0).unsqueeze(1).expand({-1, 3, -1, -1}))
                .sum()
                .item<int64_t>(),
            0);

  const auto snapped = snap_to_palette(sprites, g.palette);
  ScratchDir dir;
  io::write_png(dir.file("sheet.png"), io::make_sheet(snapped, {3, 1, 2}));
  const auto sheet = io::read_png(dir.file("sheet.png"));
  // 2 rows x 3 columns of 16x16 with 1-pixel padding, scaled 2x.
  EXPECT_EQ(sheet.sizes(), (std::vector<int64_t>{2 * (2 * 17 + 1), 2 * (3 * 17 + 1), 4}));
  const auto px = sheet.reshape({-1, 4});
  const auto opaque = px.index({px.select(1, 3) == 255}).narrow(1, 0, 3);
  const auto transparent = px.index({px.select(1, 3) == 0});
  EXPECT_EQ(opaque.size(0) + transparent.size(0), px.size(0));
  ASSERT_GT(opaque.size(0), 0);
  // Every opaque pixel's colour is one of the palette's.
  const auto dist = torch::cdist(opaque.to(torch::kFloat32), g.palette.to(torch::kFloat32));
  EXPECT_EQ(std::get<0>(dist.min(1)).max().item<float>(), 0.0f);
}

// Soft alpha keeps 8-bit alpha from kAlphaFloor up and clears the haze below it; binary cuts at
// 128; RGB is 0 under every transparent pixel in both.
TEST(Sprites, SoftAlphaKeepsEightBitsAboveTheFloor) {
  const std::vector<int> alphas = {0, 10, 15, 16, 100, 127, 128, 255};
  const int64_t n = static_cast<int64_t>(alphas.size());
  auto px = torch::full({1, 4, 1, n}, 200, torch::kUInt8);
  for (int64_t i = 0; i < n; ++i) px[0][3][0][i] = alphas[static_cast<size_t>(i)];
  const auto x = px.to(torch::kFloat32) / 127.5 - 1.0;
  const auto soft = to_sprites(x, AlphaMode::kSoft), binary = to_sprites(x, AlphaMode::kBinary);
  const std::vector<int> soft_alpha = {0, 0, 0, 16, 100, 127, 128, 255};
  const std::vector<int> binary_alpha = {0, 0, 0, 0, 0, 0, 255, 255};
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    EXPECT_EQ(soft[0][3][0][i].item<int>(), soft_alpha[k]) << "alpha " << alphas[k];
    EXPECT_EQ(binary[0][3][0][i].item<int>(), binary_alpha[k]) << "alpha " << alphas[k];
    EXPECT_EQ(soft[0][0][0][i].item<int>(), soft_alpha[k] ? 200 : 0);
    EXPECT_EQ(binary[0][2][0][i].item<int>(), binary_alpha[k] ? 200 : 0);
  }
  // finish_sprites keeps the alpha to_sprites made (the colour reduction leaves alpha alone).
  EXPECT_TRUE(
      torch::equal(finish_sprites(x, 16, AlphaMode::kSoft).select(1, 3), soft.select(1, 3)));
  EXPECT_EQ(parse_alpha_mode("soft"), AlphaMode::kSoft);
  EXPECT_EQ(alpha_mode_name(AlphaMode::kBinary), "binary");
  EXPECT_THROW(parse_alpha_mode("auto"), Error);
}

// The mode a set calls for: the share of its visible pixels that are partly transparent.
TEST(Sprites, AlphaModeFollowsTheShareOfPartlyTransparentPixels) {
  auto sprites = torch::zeros({2, 4, 10, 10}, torch::kUInt8);
  sprites.select(1, 3).narrow(1, 0, 5).fill_(255);  // 100 visible pixels, all opaque
  EXPECT_EQ(partial_alpha_share(sprites), 0.0);
  EXPECT_EQ(alpha_mode_of(sprites), AlphaMode::kBinary);
  sprites[0][3][0][0] = 60;  // 1 of 100: under kSoftAlphaShare
  EXPECT_DOUBLE_EQ(partial_alpha_share(sprites), 0.01);
  EXPECT_EQ(alpha_mode_of(sprites), AlphaMode::kBinary);
  sprites[1][3][4][9] = 1;  // 2 of 100
  EXPECT_DOUBLE_EQ(partial_alpha_share(sprites), 0.02);
  EXPECT_EQ(alpha_mode_of(sprites), AlphaMode::kSoft);
  EXPECT_EQ(partial_alpha_share(torch::zeros({1, 4, 4, 4}, torch::kUInt8)), 0.0);
  EXPECT_THROW(partial_alpha_share(torch::zeros({1, 3, 4, 4}, torch::kUInt8)), Error);
}

// Per-sprite colour reduction: a sprite of 3 flat colours with small noise on every pixel comes
// back with exactly 3 colours, near the flat ones; alpha and transparent pixels are untouched; a
// sprite with fewer colours than asked keeps them exactly.
TEST(Palette, ReduceColoursFlattensSmallNoise) {
  torch::manual_seed(12);
  auto sprites = torch::zeros({2, 4, 8, 8}, torch::kUInt8);
  const std::vector<std::array<int, 3>> flat = {{200, 40, 40}, {30, 30, 160}, {240, 220, 90}};
  for (int64_t y = 0; y < 8; ++y)
    for (int64_t x = 1; x < 8; ++x)
      for (int64_t i = 0; i < 2; ++i) {
        const auto& c = flat[static_cast<size_t>(y % 3)];
        for (int ch = 0; ch < 3; ++ch) {
          const int noise =
              i == 0 ? static_cast<int>(torch::randint(-6, 7, {1}).item<int64_t>()) : 0;
          sprites[i][ch][y][x] = std::clamp(c[static_cast<size_t>(ch)] + noise, 0, 255);
        }
        sprites[i][3][y][x] = 255;
      }
  const auto out = reduce_colours(sprites, 4);
  EXPECT_TRUE(torch::equal(out.select(1, 3), sprites.select(1, 3)));
  EXPECT_TRUE(torch::equal(out.narrow(3, 0, 1), sprites.narrow(3, 0, 1)));  // transparent column
  const auto opaque = out[0].narrow(0, 0, 3).narrow(2, 1, 7).reshape({3, -1}).t();  // (56, 3)
  const auto distinct = std::get<0>(torch::unique_dim(opaque, 0));
  EXPECT_LE(distinct.size(0), 4);
  for (int64_t y = 0; y < 8; ++y)
    for (int ch = 0; ch < 3; ++ch)
      EXPECT_NEAR(out[0][ch][y][3].item<int>(),
                  flat[static_cast<size_t>(y % 3)][static_cast<size_t>(ch)], 4)
          << y << " " << ch;
  EXPECT_TRUE(torch::equal(out[1], sprites[1]));  // 3 exact colours, 4 allowed: unchanged
  EXPECT_TRUE(torch::equal(reduce_colours(sprites, 0), sprites));
}

namespace {

// Sprites of a few base colours with noise, random alpha; one fully transparent, one with a
// single opaque pixel, one with two flat colours.
torch::Tensor noisy_sprites(int64_t n, int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  const auto base = torch::randint(0, 256, {n, 3, 1, 1}, torch::kInt64);
  const auto pattern = torch::randint(0, 4, {n, 1, size, size}, torch::kInt64) * 40;
  const auto noise = torch::randint(-9, 10, {n, 3, size, size}, torch::kInt64);
  auto rgb = (base + pattern + noise).remainder(256);
  auto alpha = (torch::rand({n, 1, size, size}) < 0.6).to(torch::kInt64) * 255;
  auto sprites = torch::cat({rgb, alpha}, 1).to(torch::kUInt8);
  sprites[0].select(0, 3).zero_();
  sprites[1].select(0, 3).zero_();
  sprites[1][3][2][3] = 255;
  sprites[2].narrow(0, 0, 3).fill_(70);
  sprites[2].narrow(0, 0, 3).narrow(1, 0, size / 2).fill_(200);
  return to_sprites(sprites.to(torch::kFloat32) / 127.5 - 1.0);
}

}  // namespace

// The two forms of reduce_colours give the same bytes: the tensor form (all sprites of a chunk at
// once, what a GPU runs) and the per-sprite loop (the CPU's), in the same float arithmetic.
TEST(Palette, ReduceColoursBatchedEqualsThePerSpriteLoop) {
  const auto sprites = noisy_sprites(24, 16, 5);
  for (const int64_t k : {1, 2, 5, 16}) {
    const auto out = reduce_colours_batched(sprites, k);
    EXPECT_TRUE(torch::equal(out, reduce_colours_loop(sprites, k))) << "k " << k;
    EXPECT_TRUE(torch::equal(out[0], sprites[0]));  // transparent: unchanged
    EXPECT_TRUE(torch::equal(out[1], sprites[1]));  // one opaque pixel keeps its colour
    const auto rgb = out[5].narrow(0, 0, 3).reshape({3, -1}).t();
    const auto opaque = out[5][3].flatten() > 0;
    EXPECT_LE(std::get<0>(torch::unique_dim(rgb.index({opaque}), 0)).size(0), k);
  }
  EXPECT_TRUE(torch::equal(reduce_colours_batched(sprites, 2)[2], sprites[2]));  // 2 flat colours
  EXPECT_TRUE(torch::equal(reduce_colours_loop(sprites, 2)[2], sprites[2]));
  EXPECT_FALSE(torch::equal(reduce_colours(sprites, 2), sprites));
}

// A soft-alpha model's sprites have partly transparent edges: they are snapped to the colours of
// the opaque pixels too, so a sprite holds at most K colours over every visible pixel (the audit
// found 103-123 at --colours 4); a sprite with no opaque pixel keeps its own. Both forms agree.
TEST(Palette, ReduceColoursCountsPartlyTransparentPixels) {
  auto sprites = noisy_sprites(12, 16, 8);
  torch::manual_seed(9);
  // Alpha 1-127 on about a third of each sprite's pixels (the edges of soft-alpha art).
  const auto soft = torch::rand({12, 16, 16}) < 0.33;
  auto alpha = sprites.select(1, 3);
  alpha.copy_(
      torch::where(soft, torch::randint(1, 128, {12, 16, 16}, torch::kLong), alpha.to(torch::kLong))
          .to(torch::kUInt8));
  sprites[3].select(0, 3).fill_(60);  // only partly transparent pixels
  for (const int64_t k : {2, 4}) {
    const auto out = reduce_colours_batched(sprites, k);
    EXPECT_TRUE(torch::equal(out, reduce_colours_loop(sprites, k))) << "k " << k;
    for (const int64_t i : {4, 5, 6, 7}) {
      const auto rgb = out[i].narrow(0, 0, 3).reshape({3, -1}).t();
      const auto visible = out[i][3].flatten() > 0;
      EXPECT_LE(std::get<0>(torch::unique_dim(rgb.index({visible}), 0)).size(0), k)
          << "sprite " << i << ", k " << k;
    }
    EXPECT_TRUE(torch::equal(out[3], sprites[3]));
    EXPECT_TRUE(torch::equal(out.select(1, 3), sprites.select(1, 3)));  // alpha as it was
  }
}

// 64x64 sprites at 16 colours span several chunks of the tensor form on the CPU: the same result
// as one sprite at a time, and as the loop.
TEST(Palette, ReduceColoursInChunksEqualsOneSpriteAtATime) {
  const auto sprites = noisy_sprites(70, 64, 6);
  const auto out = reduce_colours_batched(sprites, 16);
  for (int64_t i = 0; i < sprites.size(0); ++i)
    ASSERT_TRUE(torch::equal(out[i], reduce_colours_batched(sprites.narrow(0, i, 1), 16)[0])) << i;
  EXPECT_TRUE(torch::equal(out, reduce_colours_loop(sprites, 16)));
}

// On a GPU the reduction runs where the sprites are (generate's finish_sprites) and gives the
// CPU's bytes: the cluster sums are exact integers whatever order the atomics add them in.
TEST(PaletteCuda, ReduceColoursOnTheGpuEqualsTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto sprites = noisy_sprites(40, 32, 7);
  const auto on_gpu = reduce_colours(sprites.to(torch::kCUDA), 16);
  EXPECT_TRUE(on_gpu.is_cuda());
  EXPECT_TRUE(torch::equal(on_gpu.cpu(), reduce_colours(sprites, 16)));
  const auto x = sprites.to(torch::kFloat32) / 127.5 - 1.0;
  EXPECT_TRUE(torch::equal(finish_sprites(x.to(torch::kCUDA), 16), finish_sprites(x, 16)));
}

TEST(Palette, KMeansFindsTheColours) {
  auto sprites = torch::zeros({30, 4, 4, 4}, torch::kUInt8);
  const std::vector<std::array<uint8_t, 3>> colours = {
      {{250, 10, 10}}, {{10, 250, 10}}, {{20, 20, 240}}};
  for (int i = 0; i < 30; ++i)
    for (int c = 0; c < 3; ++c) sprites[i][c].narrow(0, 0, 2).fill_(colours[i % 3][c]);
  sprites.select(1, 3).narrow(1, 0, 2).fill_(255);  // top half opaque, bottom transparent
  const auto p = kmeans_palette(sprites, 3, 1);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{3, 3}));
  for (const auto& c : colours) {
    const auto want = torch::tensor({c[0], c[1], c[2]}, torch::kUInt8);
    EXPECT_TRUE((p == want).all(1).any().item<bool>())
        << int(c[0]) << "," << int(c[1]) << "," << int(c[2]);
  }
}

TEST(Palette, FromPngTakesDistinctOpaqueColours) {
  ScratchDir dir;
  auto strip = torch::zeros({1, 5, 4}, torch::kUInt8);
  const uint8_t px[5][4] = {
      {10, 20, 30, 255}, {200, 0, 0, 255}, {10, 20, 30, 255}, {99, 99, 99, 0}, {0, 0, 255, 255}};
  for (int x = 0; x < 5; ++x)
    for (int c = 0; c < 4; ++c) strip[0][x][c] = px[x][c];
  io::write_png(dir.file("palette.png"), strip);
  const auto p = palette_from_png(dir.file("palette.png"));
  EXPECT_TRUE(torch::equal(
      p, torch::tensor({10, 20, 30, 200, 0, 0, 0, 0, 255}, torch::kUInt8).view({3, 3})));
  io::write_png(dir.file("clear.png"), torch::zeros({2, 2, 4}, torch::kUInt8));
  EXPECT_THROW(palette_from_png(dir.file("clear.png")), DataError);
}

// One epoch of a generator on the CPU, batch 16, from `dataset`, saved to `save`.
train::TrainConfig one_epoch_generator(const std::string& dataset, const std::string& save) {
  train::TrainConfig config;
  config.task = train::TaskKind::kGenerate;
  config.dataset = dataset;
  config.epochs = 1;
  config.batch_size = 16;
  config.device = "cpu";
  config.save = save;
  return config;
}

// One epoch of a UNet of base 8 on 64 procedural sprites, saved at `save`; its config, to train
// variants of it.
train::TrainConfig trained_tiny_generator(const std::string& save) {
  auto config = one_epoch_generator("sprites", save);
  config.sprites.count = 64;
  config.unet_base = 8;
  run_training(config);
  return config;
}

TEST(GeneratorTraining, TinyRunSavesALoadableCheckpoint) {
  ScratchDir dir;
  auto config = one_epoch_generator("sprites", dir.file("g.pt"));
  config.sprites.count = 64;
  const auto report = run_training(config);
  EXPECT_EQ(report.task, "generate");
  EXPECT_EQ(report.steps, 3);  // 58 training sprites, drop_last: 3 batches of 16
  ASSERT_EQ(report.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(report.epochs[0].loss));
  EXPECT_FALSE(report.has_accuracy);
  // The held-out denoising loss of the EMA weights: 6 held-out sprites.
  EXPECT_TRUE(report.has_test);
  EXPECT_EQ(report.test.samples, 6);
  EXPECT_TRUE(std::isfinite(report.test.loss) && report.test.loss > 0);
  auto g = load_generator(config.save, torch::kCPU);
  EXPECT_EQ(g.class_names.size(), 4u);
  EXPECT_EQ(g.palette.size(1), 3);
  EXPECT_EQ(g.alpha, AlphaMode::kBinary);  // the procedural sprites have no partial alpha
  EXPECT_EQ(g.meta.at("alpha"), "binary");
  SampleOptions o;
  o.steps = 2;
  EXPECT_EQ(sample(g, torch::tensor({0, 3}, torch::kInt64), o).sizes(),
            (std::vector<int64_t>{2, 4, 16, 16}));
  config.save.clear();
  config.dataset = "dummy";
  EXPECT_THROW(run_training(config), Error);
}

// SampleOptions::stop is asked before each UNet pass and ends the sampling when it says so.
TEST(Sampling, AStopAskedBeforeEachPassEndsItWithSamplingStopped) {
  ScratchDir dir;
  const auto config = trained_tiny_generator(dir.file("g.pt"));
  auto g = load_generator(config.save, torch::kCPU);
  SampleOptions o;
  o.steps = 5;
  int asked = 0;
  o.stop = [&asked] { return ++asked == 3; };
  EXPECT_THROW(sample(g, torch::tensor({0, 1}, torch::kInt64), o), SamplingStopped);
  EXPECT_EQ(asked, 3);
  o.stop = [&asked] { return ++asked < 0; };
  asked = 0;
  EXPECT_EQ(sample(g, torch::tensor({0, 1}, torch::kInt64), o).size(0), 2);
  EXPECT_EQ(asked, 1 + 5);  // the batch, then each of its 5 passes
}

// Weights that overflow (a diverging run's; here one made infinite in memory) sampled NaN, which
// became a blank sheet written as a result; and a checkpoint holding NaN weights is refused before
// anything is built from it.
TEST(Sampling, AGeneratorWhoseOutputIsNotFiniteIsAnErrorNotABlankSheet) {
  ScratchDir dir;
  const auto config = trained_tiny_generator(dir.file("g.pt"));
  auto g = load_generator(config.save, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    g.net->parameters().front().fill_(std::numeric_limits<float>::infinity());
  }
  SampleOptions o;
  o.steps = 3;
  try {
    sample(g, torch::tensor({0, 1}, torch::kInt64), o);
    FAIL() << "sampled an infinite weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the generator's output is not finite (NaN or infinity) "
                                         "for sprites 1-2"),
              std::string::npos)
        << e.what();
  }
  train::Checkpoint checkpoint = train::load_checkpoint(config.save);
  checkpoint.model.begin()->second.view(-1)[0] = std::nan("");
  train::save_checkpoint(dir.file("nan.pt"), checkpoint);
  try {
    load_generator(dir.file("nan.pt"), torch::kCPU);
    FAIL() << "loaded NaN weights";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("expected finite weights, found NaN or infinity in '" +
                                         checkpoint.model.begin()->first + "'"),
              std::string::npos)
        << e.what();
  }
}

// A SIGTERM while the sample sheet is drawn (~40 s on 2 CPU cores) leaves the sheet out: the run
// stops with its checkpoint at the next step.
TEST(GeneratorTraining, AnInterruptDuringTheSampleSheetLeavesItOut) {
  ScratchDir dir;
  auto config = one_epoch_generator("sprites", dir.file("g.pt"));
  config.sprites.count = 64;
  config.unet_base = 8;
  config.epochs = 2;
  config.sample_every = 1;
  struct InterruptAtTheEpochsEnd : train::TrainObserver {
    int sheets = 0;
    void on_epoch(const train::EpochReport& r) override {
      if (r.epoch == 1) train::request_interrupt(SIGTERM);
    }
    void on_samples(int64_t, const torch::Tensor&, int64_t) override { ++sheets; }
  } observer;
  std::string checkpoint;
  try {
    run_training(config, &observer);
  } catch (const train::Interrupted& e) {
    checkpoint = e.checkpoint();
  }
  ASSERT_FALSE(checkpoint.empty());
  EXPECT_EQ(observer.sheets, 0);
  EXPECT_TRUE(train::load_checkpoint(checkpoint).meta.contains("run"));
}

// A set whose art is partly transparent gets a soft-alpha generator, recorded in its checkpoint.
TEST(GeneratorTraining, SoftArtGivesASoftAlphaGenerator) {
  ScratchDir dir;
  auto sprites = data::make_procedural_sprites(32, 3).inputs;  // (32, 4, 16, 16)
  auto alpha = sprites.select(1, 3);
  alpha.copy_(torch::where(alpha > 0, torch::full_like(alpha, 180), alpha));  // translucent art
  for (int64_t i = 0; i < 32; ++i) {
    const std::string folder = dir.file(i % 2 ? "set/ghost" : "set/glass");
    std::filesystem::create_directories(folder);
    io::write_png(folder + "/" + std::to_string(i) + ".png", sprites[i].permute({1, 2, 0}));
  }
  auto config = one_epoch_generator("folder:" + dir.file("set"), dir.file("g.pt"));
  config.unet_base = 8;
  run_training(config);
  auto g = load_generator(config.save, torch::kCPU);
  EXPECT_EQ(g.alpha, AlphaMode::kSoft);
  EXPECT_EQ(g.meta.at("alpha"), "soft");
}

// A generator checkpoint whose metadata was damaged or edited is a DataError naming the file and
// the field before anything is built from it: no schedule of 10^9 steps (memory), no LibTorch
// message for a broken palette, no sampling with fewer class names than classes.
TEST(GeneratorTraining, DamagedMetadataIsRefusedBeforeAnythingIsBuilt) {
  ScratchDir dir;
  const auto config = trained_tiny_generator(dir.file("g.pt"));
  const auto good = train::load_checkpoint(config.save);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> damaged = {
      {[](nlohmann::json& m) { m["schedule_steps"] = 1000000000; },
       "'schedule_steps' from 2 to 100000, found 1000000000"},
      {[](nlohmann::json& m) {
         m["palette"] = {{1, 2}};
       },
       "'palette' of [r, g, b] colours from 0 to 255, found [1,2]"},
      {[](nlohmann::json& m) { m["class_names"] = nlohmann::json::array(); },
       "'class_names' with one name per class of its UNet (4), found 0 names"},
      {[](nlohmann::json& m) { m["size"] = 48; }, "'size' of 16, 32 or 64, found 48"},
      {[](nlohmann::json& m) { m["unet"]["embed"] = -1; }, "'unet.embed' from 1 to 8192"},
      {[](nlohmann::json& m) { m["schedule"] = "weird"; },
       "'schedule' of linear or cosine, found 'weird'"},
      {[](nlohmann::json& m) { m["prediction"] = "z"; }, "'prediction' of eps, v or x0, found 'z'"},
      {[](nlohmann::json& m) { m["alpha"] = "sometimes"; },
       "'alpha' of binary or soft, found 'sometimes'"},
  };
  for (const auto& [damage, message] : damaged) {
    auto bad = good;
    damage(bad.meta);
    train::save_checkpoint(dir.file("bad.pt"), bad);
    try {
      load_generator(dir.file("bad.pt"), torch::kCPU);
      ADD_FAILURE() << message << ": accepted";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(dir.file("bad.pt") + ": expected generator metadata " +
                                           message),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(load_generator(config.save, torch::kCPU));
}

// A checkpoint written before the prediction / schedule / attention / scale-shift keys existed
// loads as what it was trained as (eps, linear betas, no attention, additive embedding) and samples
// exactly as a checkpoint that says so; the new defaults are recorded in new checkpoints.
TEST(GeneratorTraining, OldCheckpointsLoadAsEpsLinearWithoutAttention) {
  ScratchDir dir;
  auto config = trained_tiny_generator(dir.file("new.pt"));
  const auto fresh = train::load_checkpoint(config.save);
  EXPECT_EQ(fresh.meta.at("prediction"), "v");
  EXPECT_EQ(fresh.meta.at("schedule"), "cosine");
  EXPECT_EQ(fresh.meta.at("unet").at("attention"), true);
  EXPECT_EQ(fresh.meta.at("unet").at("scale_shift"), true);
  auto g_new = load_generator(config.save, torch::kCPU);
  EXPECT_EQ(g_new.prediction, Prediction::kV);
  EXPECT_EQ(g_new.schedule.kind(), ScheduleKind::kCosine);
  EXPECT_TRUE(g_new.net->mid_attn);
  EXPECT_TRUE(g_new.net->options().scale_shift);

  config.prediction = "eps";
  config.noise_schedule = "linear";
  config.unet_attention = 0;
  config.unet_scale_shift = false;
  config.unet_mult = "1,2,2";
  config.save = dir.file("explicit.pt");
  run_training(config);
  auto old = train::load_checkpoint(config.save);
  for (const char* key : {"prediction", "schedule", "min_snr_gamma", "alpha"}) old.meta.erase(key);
  old.meta["unet"].erase("attention");
  old.meta["unet"].erase("attention_s2");
  old.meta["unet"].erase("scale_shift");
  old.meta["unet"].erase("mult");
  train::save_checkpoint(dir.file("old.pt"), old);
  auto g_old = load_generator(dir.file("old.pt"), torch::kCPU);
  auto g_explicit = load_generator(config.save, torch::kCPU);
  EXPECT_EQ(g_old.prediction, Prediction::kEps);
  EXPECT_EQ(g_old.schedule.kind(), ScheduleKind::kLinear);
  EXPECT_FALSE(g_old.net->mid_attn);
  EXPECT_FALSE(g_old.net->options().scale_shift);
  EXPECT_EQ(g_old.net->options().mult, (std::array<int64_t, 3>{1, 2, 2}));
  EXPECT_EQ(g_old.alpha, AlphaMode::kBinary);
  SampleOptions o;
  o.steps = 3;
  const auto labels = torch::tensor({0, 3}, torch::kInt64);
  EXPECT_TRUE(torch::equal(sample(g_old, labels, o), sample(g_explicit, labels, o)));
  // And an old checkpoint resumes only as what it was.
  config.resume = dir.file("old.pt");
  config.epochs = 2;
  config.save = dir.file("resumed.pt");
  EXPECT_NO_THROW(run_training(config));
  config.prediction = "v";
  config.save = dir.file("resumed_v.pt");
  try {
    run_training(config);
    ADD_FAILURE() << "resumed an eps checkpoint as v";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prediction"), std::string::npos) << e.what();
  }
}

TEST(GeneratorTraining, CheckpointDesignFillsWhatOldMetadataLacks) {
  nlohmann::json meta = {{"unet", {{"channels", 4}, {"base", 16}, {"classes", 3}, {"embed", 64}}}};
  CheckpointDesign old = checkpoint_design(meta);
  EXPECT_EQ(old.unet.channels, 4);
  EXPECT_EQ(old.unet.base, 16);
  EXPECT_EQ(old.unet.classes, 3);
  EXPECT_EQ(old.unet.embed, 64);
  EXPECT_FALSE(old.unet.attention);
  EXPECT_FALSE(old.unet.attention_s2);
  EXPECT_FALSE(old.unet.scale_shift);
  EXPECT_EQ(old.unet.mult, (std::array<int64_t, 3>{1, 2, 2}));
  EXPECT_EQ(old.schedule, ScheduleKind::kLinear);
  EXPECT_EQ(old.prediction, Prediction::kEps);

  meta["unet"]["attention"] = true;
  meta["unet"]["attention_s2"] = true;
  meta["unet"]["scale_shift"] = true;
  meta["unet"]["mult"] = {1, 2, 4};
  meta["schedule"] = "cosine";
  meta["prediction"] = "x0";
  const CheckpointDesign now = checkpoint_design(meta);
  EXPECT_TRUE(now.unet.attention);
  EXPECT_TRUE(now.unet.attention_s2);
  EXPECT_TRUE(now.unet.scale_shift);
  EXPECT_EQ(now.unet.mult, (std::array<int64_t, 3>{1, 2, 4}));
  EXPECT_EQ(now.schedule, ScheduleKind::kCosine);
  EXPECT_EQ(now.prediction, Prediction::kX0);
  // What save writes reads back as the same design, and holds every key the reader takes.
  const nlohmann::json saved = design_json(now);
  EXPECT_EQ(design_json(checkpoint_design(saved)), saved);
  EXPECT_EQ(saved["unet"], meta["unet"]);
  EXPECT_EQ(saved["schedule"], "cosine");
  EXPECT_EQ(saved["prediction"], "x0");

  meta["unet"]["mult"] = {1, 0, 2};  // a damaged width fails here, not inside LibTorch
  EXPECT_THROW(checkpoint_design(meta), Error);
  meta["unet"]["mult"] = {1, 2, 4};
  meta["prediction"] = "score";
  EXPECT_THROW(checkpoint_design(meta), Error);
  meta["prediction"] = "v";
  // Missing, mistyped or absurd fields are DataErrors naming the field, never LibTorch's or
  // nlohmann's own messages.
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> damaged = {
      {[](nlohmann::json& m) { m["unet"].erase("embed"); }, "'unet.embed', found none"},
      {[](nlohmann::json& m) { m["unet"]["embed"] = -1; }, "'unet.embed' from 1 to 8192, found -1"},
      {[](nlohmann::json& m) { m["unet"]["base"] = 100000; }, "'unet.base' from 1 to 512"},
      {[](nlohmann::json& m) { m["unet"]["mult"] = nlohmann::json::array(); },
       "'unet.mult' of 3 multipliers, found 0"},
      {[](nlohmann::json& m) { m["unet"]["attention"] = 5; }, "'unet.attention' as true or false"},
      {[](nlohmann::json& m) { m.erase("unet"); }, "'unet', found none"},
  };
  for (const auto& [damage, message] : damaged) {
    nlohmann::json bad = meta;
    damage(bad);
    try {
      checkpoint_design(bad, "g.pt");
      ADD_FAILURE() << message << ": accepted";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("g.pt"), std::string::npos) << e.what();
    }
  }
}

TEST(GeneratorTraining, EmaDecayWarmsUpToItsCeiling) {
  EXPECT_DOUBLE_EQ(ema_decay(0), 0.1);  // the first update keeps 10% of the initial weights
  EXPECT_DOUBLE_EQ(ema_decay(10), 11.0 / 20.0);
  for (int64_t k = 0; k < 5000; ++k) EXPECT_LE(ema_decay(k), ema_decay(k + 1)) << k;
  EXPECT_DOUBLE_EQ(ema_decay(100000), kEmaDecay);
  // What is left of the initial weights after 336 updates (3 epochs of the default run): the
  // product of the decays, against 0.995^336 = 0.19 without the warm-up.
  double left = 1;
  for (int64_t k = 0; k < 336; ++k) left *= ema_decay(k);
  EXPECT_LT(left, 1e-3);
}

// 58 training sprites of 16 px, batches of 16 (drop_last): 3 steps per epoch, UNet base 8.
train::TrainConfig tiny_generator(const ScratchDir& dir, int64_t epochs,
                                  const std::string& save = "g.pt") {
  train::TrainConfig c;
  c.task = train::TaskKind::kGenerate;
  c.dataset = "sprites";
  c.sprites.count = 64;
  c.unet_base = 8;
  c.epochs = epochs;
  c.batch_size = 16;
  c.device = "cpu";
  c.log_every = 2;  // a log inside each epoch: the resumed interval sums must line up
  c.save = dir.file(save);
  return c;
}

// Every tensor of two checkpoints: EMA model, raw weights, Adam state, all bit-equal.
void expect_same_training_state(const std::string& a_path, const std::string& b_path) {
  const auto a = train::load_checkpoint(a_path), b = train::load_checkpoint(b_path);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;
  ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
  for (const auto& [name, t] : a.optimizer)
    EXPECT_TRUE(torch::equal(t, b.optimizer.at(name))) << name;
  EXPECT_EQ(a.meta.at("steps"), b.meta.at("steps"));
  EXPECT_EQ(a.meta.at("epoch"), b.meta.at("epoch"));
}

TEST(GeneratorResume, FromTheFinalCheckpointEqualsOneLongerRun) {
  ScratchDir dir;
  run_training(tiny_generator(dir, 2, "straight.pt"));
  run_training(tiny_generator(dir, 1));
  auto second = tiny_generator(dir, 2);
  second.resume = second.save;  // in place
  const auto report = run_training(second);
  EXPECT_EQ(report.steps, 6);
  expect_same_training_state(dir.file("straight.pt"), dir.file("g.pt"));
  // What `generate` loads is the EMA model, as before.
  EXPECT_EQ(load_generator(dir.file("g.pt"), torch::kCPU).class_names.size(), 4u);
}

// Requests SIGTERM's stop after step `step` of epoch `epoch` (1-based), as a signal would.
class InterruptAt : public train::TrainObserver {
 public:
  InterruptAt(int64_t epoch, int64_t step) : epoch_(epoch), step_(step) {}
  void on_step(const train::StepTick& tick) override {
    if (tick.epoch == epoch_ && tick.step == step_) train::request_interrupt(SIGTERM);
  }

 private:
  int64_t epoch_, step_;
};

TEST(GeneratorResume, InterruptedMidEpochResumesBitIdentically) {
  ScratchDir dir;
  run_training(tiny_generator(dir, 2, "straight.pt"));
  auto config = tiny_generator(dir, 2);
  InterruptAt stop(2, 1);  // after global step 4 (epoch 2, step 1): mid-epoch, mid-log-interval
  std::string checkpoint;
  try {
    run_training(config, &stop);
    ADD_FAILURE() << "the run was not interrupted";
  } catch (const train::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
    EXPECT_EQ(e.epoch(), 2);
    EXPECT_EQ(e.step(), 1);
    checkpoint = e.checkpoint();
  }
  EXPECT_EQ(checkpoint, train::periodic_checkpoint_path(config.save, 4));
  EXPECT_FALSE(std::filesystem::exists(config.save));  // only the run checkpoint was written
  config.resume = checkpoint;
  const auto report = run_training(config);
  EXPECT_EQ(report.steps, 6);
  expect_same_training_state(dir.file("straight.pt"), config.save);
}

TEST(GeneratorResume, CheckpointEveryAndKeepLast) {
  ScratchDir dir;
  auto config = tiny_generator(dir, 2);
  config.checkpoint_every = 2;
  config.keep_last = 2;
  run_training(config);
  EXPECT_EQ(train::periodic_checkpoints(config.save),
            (std::vector<std::string>{train::periodic_checkpoint_path(config.save, 4),
                                      train::periodic_checkpoint_path(config.save, 6)}));
  // A periodic checkpoint resumes like the final one: from step 4 to the end of epoch 2.
  auto again = tiny_generator(dir, 2);
  again.resume = train::periodic_checkpoint_path(config.save, 4);
  again.overwrite = true;
  EXPECT_EQ(run_training(again).steps, 6);
}

TEST(GeneratorResume, RefusesAnotherUNetAClassifierAndAStaleFile) {
  ScratchDir dir;
  run_training(tiny_generator(dir, 1));
  auto bigger = tiny_generator(dir, 2);
  bigger.resume = bigger.save;
  bigger.unet_base = 16;
  try {
    run_training(bigger);
    ADD_FAILURE() << "resumed a base-8 UNet as base 16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a UNet for"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--unet-base"), std::string::npos) << e.hint();
  }
  // A generator checkpoint without its training state (as written before resuming existed).
  auto c = train::load_checkpoint(dir.file("g.pt"));
  c.optimizer.clear();
  train::save_checkpoint(dir.file("ema-only.pt"), c);
  auto stale = tiny_generator(dir, 2);
  stale.resume = dir.file("ema-only.pt");
  stale.save = dir.file("g2.pt");
  EXPECT_THROW(run_training(stale), DataError);
}

}  // namespace
}  // namespace spritetorch::diffusion
