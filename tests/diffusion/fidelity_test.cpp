// The fidelity report: pixel-art statistics on hand-made sprites, and the classifier two-sample
// test ranking real < real with noisy pixels < noise on the procedural sprites.
#include "diffusion/fidelity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <ATen/CPUGeneratorImpl.h>

#include "common/error.h"
#include "data/procedural_sprites.h"
#include "diffusion/generator.h"

namespace spritetorch::diffusion {
namespace {

// `share` of the opaque pixels given uniformly random colours (alpha unchanged).
torch::Tensor with_noisy_pixels(const torch::Tensor& sprites, double share, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto out = sprites.clone();
  auto rgb = out.narrow(1, 0, 3);
  const auto pick = (out.narrow(1, 3, 1) >= 128) &
                    (at::rand(out.narrow(1, 3, 1).sizes(), gen) < share);  // (N, 1, S, S)
  const auto colours = at::randint(0, 256, rgb.sizes(), gen, torch::kUInt8);
  rgb.copy_(torch::where(pick, colours, rgb));
  return out;
}

TEST(PixelArtStats, CountsStrayPixelsColoursAndCoverage) {
  // Two 4x4 sprites. The first: a lone pixel at (0, 0), a bar of two at (2, 1)-(2, 2), a pixel at
  // (3, 3) touching nothing but a diagonal. The second: empty.
  auto s = torch::zeros({2, 4, 4, 4}, torch::kUInt8);
  auto put = [&](int64_t y, int64_t x, int r, int g, int b) {
    s[0][0][y][x] = r;
    s[0][1][y][x] = g;
    s[0][2][y][x] = b;
    s[0][3][y][x] = 255;
  };
  put(0, 0, 200, 10, 10);
  put(2, 1, 10, 200, 10);
  put(2, 2, 12, 205, 3);  // the same colour at 4 bits per channel
  put(3, 3, 10, 10, 200);
  s[1][0][1][1] = 99;   // RGB under a transparent pixel: not a colour of the sprite
  s[0][3][1][3] = 100;  // alpha < 128: transparent
  const auto r = pixel_art_stats(s);
  EXPECT_EQ(r.sprites, 2);
  EXPECT_DOUBLE_EQ(r.stray_pixels, 2.0 / 2);  // (0, 0) and (3, 3)
  EXPECT_DOUBLE_EQ(r.colours, 3.0 / 2);       // red, green, blue
  EXPECT_DOUBLE_EQ(r.alpha_coverage, 4.0 / 32);
  EXPECT_THROW(pixel_art_stats(torch::zeros({2, 3, 4, 4}, torch::kUInt8)), Error);
}

TEST(TwoSampleTest, RanksRealBelowNoisyPixelsBelowNoise) {
  // 25 epochs (the command's default: 40; 15 or 192 sprites a set leave 5% noisy pixels at
  // 0.53-0.59), and 3 for pure noise, which any critic tells at once: a third of 40 epochs'
  // work, which keeps this test short under the sanitizers.
  const auto pool = data::make_procedural_sprites(768, 5).inputs;  // (768, 4, 16, 16) uint8
  const auto a = pool.narrow(0, 0, 256), b = pool.narrow(0, 256, 256);
  const auto noisy = with_noisy_pixels(pool.narrow(0, 512, 256), 0.05, 6);
  const auto noise = at::randint(0, 256, {256, 4, 16, 16},
                                 at::make_generator<at::CPUGeneratorImpl>(7), torch::kUInt8);
  TwoSampleOptions o;
  o.seed = 3;
  o.epochs = 25;
  o.repeats = 1;  // one split, scored both ways (Fidelity.* runs the default two)
  const double real = two_sample_accuracy(a, b, o);
  const double noisy_acc = two_sample_accuracy(a, noisy, o);
  TwoSampleOptions quick = o;
  quick.epochs = 3;
  const double noise_acc = two_sample_accuracy(a, noise, quick);
  std::cout << "two-sample accuracy: real " << real << ", 5% noisy pixels " << noisy_acc
            << ", noise " << noise_acc << "\n";
  EXPECT_LT(real, noisy_acc - 0.1);
  EXPECT_LT(noisy_acc, noise_acc);
  EXPECT_NEAR(real, 0.5, 0.1);  // 256 held-out sprites a set: sd 0.03 around 0.5
  EXPECT_GT(noise_acc, 0.95);
  // Deterministic for a seed, and the global RNG is left alone (a small run is enough to show it).
  o.epochs = 2;
  const auto a_few = a.narrow(0, 0, 48), noisy_few = noisy.narrow(0, 0, 48);
  const double once = two_sample_accuracy(a_few, noisy_few, o);
  torch::manual_seed(11);
  const auto before = torch::rand({4});
  torch::manual_seed(11);
  EXPECT_EQ(two_sample_accuracy(a_few, noisy_few, o), once);
  EXPECT_TRUE(torch::equal(torch::rand({4}), before));
}

// A soft shadow (alpha 96) under each sprite's opaque pixels, two pixels down and right, where the
// sprite leaves it transparent.
torch::Tensor with_soft_shadow(const torch::Tensor& sprites) {
  auto out = sprites.clone();
  const auto opaque = sprites.narrow(1, 3, 1) >= 128;  // (N, 1, S, S)
  const int64_t s = sprites.size(2);
  auto shadow = torch::zeros_like(opaque);
  shadow.narrow(2, 2, s - 2)
      .narrow(3, 2, s - 2)
      .copy_(opaque.narrow(2, 0, s - 2).narrow(3, 0, s - 2));
  shadow = shadow & ~opaque;
  out.narrow(1, 0, 3).masked_fill_(shadow.expand({-1, 3, -1, -1}), 0);
  out.narrow(1, 3, 1).masked_fill_(shadow, 96);
  return out;
}

// Real sprites with soft shadows against the same kind of sprites whose shadows a binary cut
// dropped: a critic that sees soft alpha tells them apart at once; prepared as binary sprites
// (what generated sprites were before soft alpha) the two sets are the same and it cannot.
TEST(TwoSampleTest, SoftAlphaSeesTheShadowsABinaryCutDrops) {
  const auto pool = data::make_procedural_sprites(256, 12).inputs;  // (256, 4, 16, 16)
  const auto real = with_soft_shadow(pool.narrow(0, 0, 128));
  auto cut = with_soft_shadow(pool.narrow(0, 128, 128));
  cut = to_sprites(cut.to(torch::kFloat32) / 127.5 - 1.0, AlphaMode::kBinary);
  EXPECT_GE(partial_alpha_share(real), kSoftAlphaShare);
  EXPECT_EQ(partial_alpha_share(cut), 0.0);
  TwoSampleOptions o;
  o.seed = 4;
  o.epochs = 12;  // 24 Adam steps a critic
  o.repeats = 1;
  o.alpha = AlphaMode::kSoft;
  const double soft = two_sample_accuracy(real, cut, o);
  o.alpha = AlphaMode::kBinary;
  const double binary = two_sample_accuracy(real, cut, o);
  std::cout << "two-sample accuracy, soft shadows against none: soft alpha " << soft << ", binary "
            << binary << "\n";
  EXPECT_GT(soft, 0.72);
  EXPECT_GT(soft, binary + 0.2);
  EXPECT_NEAR(binary, 0.5, 0.13);  // 128 held-out sprites a set: sd 0.044 around 0.5
}

TEST(Fidelity, ReportsBothTestsAndTheStatistics) {
  const auto pool = data::make_procedural_sprites(300, 8).inputs;
  const auto real = pool.narrow(0, 0, 200);
  const auto generated = with_noisy_pixels(pool.narrow(0, 200, 100), 0.05, 9);
  TwoSampleOptions o;
  o.epochs = 3;
  const auto r = fidelity(generated, real, o);
  EXPECT_EQ(r.per_set, 100);  // min(100 generated, 200 real / 2)
  EXPECT_EQ(r.max_per_set, 100);
  EXPECT_GE(r.c2st, 0.0);
  EXPECT_LE(r.c2st, 1.0);
  EXPECT_EQ(r.generated.sprites, 100);
  EXPECT_EQ(r.real.sprites, 200);
  // Random colours on 5% of the opaque pixels: more colours per sprite, the same alpha.
  EXPECT_GT(r.generated.colours, r.real.colours);
  EXPECT_NEAR(r.generated.alpha_coverage, r.real.alpha_coverage, 0.05);
  EXPECT_THROW(fidelity(generated, real.narrow(0, 0, 3), o), Error);
  EXPECT_THROW(fidelity(generated, torch::zeros({8, 4, 32, 32}, torch::kUInt8), o), Error);
}

// The Fréchet distance against a second computation of tr (C_a C_b)^(1/2): the square roots of
// the (real, non-negative) eigenvalues of C_a C_b from a general eigensolver, where the function
// under test takes two symmetric ones.
TEST(FrechetDistance, AgreesWithTheEigenvaluesOfTheCovarianceProduct) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  const auto a =
      at::randn({200, 6}, gen, torch::kFloat64).mm(at::randn({6, 6}, gen, torch::kFloat64));
  const auto b = at::randn({150, 6}, gen, torch::kFloat64) * 0.7 + 0.3;
  const auto cov = [](const torch::Tensor& x) {
    const auto c = x - x.mean(0);
    return c.t().mm(c) / static_cast<double>(x.size(0) - 1);
  };
  const auto product_values = torch::real(torch::linalg_eigvals(cov(a).mm(cov(b))));
  const double expected = (a.mean(0) - b.mean(0)).pow(2).sum().item<double>() +
                          cov(a).trace().item<double>() + cov(b).trace().item<double>() -
                          2 * product_values.clamp_min(0).sqrt().sum().item<double>();
  EXPECT_NEAR(frechet_distance(a, b), expected, 1e-9 * expected);
  EXPECT_NEAR(frechet_distance(b, a), expected, 1e-9 * expected);  // symmetric
  EXPECT_NEAR(frechet_distance(a.to(torch::kFloat32), b), expected, 1e-5 * expected);
  EXPECT_NEAR(frechet_distance(a, a), 0.0, 1e-9);
  // A shift moves the means alone: the distance grows by exactly its squared length.
  const auto shift = torch::tensor({1.0, -2.0, 0.0, 0.5, 0.0, 3.0}, torch::kFloat64);
  EXPECT_NEAR(frechet_distance(a, a + shift), 1 + 4 + 0.25 + 9, 1e-9);
  // One dimension: (mean_a - mean_b)^2 + (sd_a - sd_b)^2.
  const auto x = torch::tensor({1.0, 2.0, 4.0}).unsqueeze(1),
             y = torch::tensor({0.0, 10.0}).unsqueeze(1);
  EXPECT_NEAR(frechet_distance(x, y),
              std::pow(7.0 / 3 - 5, 2) + std::pow(std::sqrt(7.0 / 3) - std::sqrt(50.0), 2), 1e-9);
  EXPECT_THROW(frechet_distance(a, b.narrow(1, 0, 5)), Error);
  EXPECT_THROW(frechet_distance(a.narrow(0, 0, 1), b), Error);
}

TEST(PrecisionRecall, CountsPointsInsideTheOtherSetsNeighbourBalls) {
  // One dimension, k = 1. Real 0, 1, 2, 3, 4: every ball has radius 1, covering [-1, 5].
  // Generated 0.5, 2.2, 10, 30: balls of radius 1.7, 1.7, 7.8, 20 around them.
  const auto real = torch::tensor({0.0, 1.0, 2.0, 3.0, 4.0}).unsqueeze(1);
  const auto generated = torch::tensor({0.5, 2.2, 10.0, 30.0}).unsqueeze(1);
  const Coverage c = precision_recall(real, generated, 1);
  EXPECT_DOUBLE_EQ(c.precision, 2.0 / 4);  // 0.5 and 2.2 lie among the real points
  EXPECT_DOUBLE_EQ(c.recall, 5.0 / 5);     // 0-3.9 by the first two balls, 4 by 10's (2.2 to 17.8)
  // Far away, the generated points cover nothing and land nowhere real.
  const Coverage far = precision_recall(real, generated.narrow(0, 2, 2) + 100, 1);
  EXPECT_DOUBLE_EQ(far.precision, 0.0);
  EXPECT_DOUBLE_EQ(far.recall, 0.0);
  EXPECT_THROW(precision_recall(real, generated.narrow(0, 0, 1), 1), Error);
}

// Class weights give each class its share in the target labels; weighted statistics equal those
// of the set with its rows repeated by the weights.
TEST(ClassWeights, GiveEachClassItsTargetShare) {
  const auto labels = torch::tensor({0, 0, 0, 1}, torch::kInt64);
  const auto target = torch::tensor({0, 1, 2, 1}, torch::kInt64);  // shares 1/4, 1/2, 1/4
  const auto w = class_weights(labels, target);
  // Class 0: 3/4 of labels, 1/4 of the target: 1/3 each; class 1: 1/4 -> 1/2: 2.
  EXPECT_TRUE(torch::allclose(w, torch::tensor({1.0 / 3, 1.0 / 3, 1.0 / 3, 2.0}, torch::kFloat64)));
  EXPECT_THROW(class_weights(labels, torch::tensor({-1}, torch::kInt64)), Error);
  // Weights 1 and 2 on rows x0, x1 against the set x0, x1, x1: the same means; the covariance of
  // reliability weights is the unbiased one of the repeated set up to its effective size.
  const auto a = torch::tensor({{0.0, 1.0}, {2.0, 5.0}, {1.0, 1.0}}, torch::kFloat64);
  const auto b = torch::tensor({{1.0, 0.0}, {3.0, 2.0}, {0.0, 4.0}}, torch::kFloat64);
  const auto ones = torch::ones({3}, torch::kFloat64);
  EXPECT_NEAR(frechet_distance(a, b, ones, ones), frechet_distance(a, b), 1e-12);
  const auto shifted_mean_only =
      frechet_distance(a, a + 1.5, torch::tensor({1.0, 2.0, 1.0}), torch::tensor({1.0, 2.0, 1.0}));
  EXPECT_NEAR(shifted_mean_only, 2 * 1.5 * 1.5, 1e-9);  // same weights: only the means move
  // A weight of 0 drops a row: the distance is that of the other rows.
  const auto c =
      torch::tensor({{0.0, 1.0}, {2.0, 5.0}, {1.0, 1.0}, {50.0, -20.0}}, torch::kFloat64);
  EXPECT_NEAR(frechet_distance(c, b, torch::tensor({1.0, 1.0, 1.0, 0.0})), frechet_distance(a, b),
              1e-9);
  EXPECT_THROW(frechet_distance(a, b, torch::ones({2})), Error);
  EXPECT_THROW(frechet_distance(a, b, torch::tensor({1.0, -1.0, 1.0})), Error);
}

// Real sprites of two classes, one a small share of the set, against a "generated" set of the
// same kind of sprites drawn equally from both classes: unweighted, the class mix alone tells
// them apart; weighted to the generated mix, the critic cannot.
TEST(TwoSampleTest, ClassWeightsTakeTheClassMixOut) {
  const auto set = data::make_procedural_sprites(2000, 13);  // 4 classes, 16 x 16
  const auto pick = [&](int64_t cls, int64_t skip, int64_t count) {
    return set.inputs.index_select(
        0, torch::nonzero(set.labels == cls).squeeze(1).narrow(0, skip, count));
  };
  // Real: 240 of class 0 and 16 of class 1; generated: 128 of each (other sprites).
  const auto real = torch::cat({pick(0, 0, 240), pick(1, 0, 16)});
  const auto real_labels = torch::cat({torch::zeros({240}), torch::ones({16})}).to(torch::kInt64);
  const auto generated = torch::cat({pick(0, 240, 128), pick(1, 16, 128)});
  const auto generated_labels =
      torch::cat({torch::zeros({128}), torch::ones({128})}).to(torch::kInt64);
  TwoSampleOptions o;
  o.seed = 5;
  o.epochs = 12;
  o.repeats = 1;
  const double plain = two_sample_accuracy(real, generated, o);
  const double weighted =
      two_sample_accuracy(real, generated, o, class_weights(real_labels, generated_labels));
  std::cout << "two-sample accuracy, 94% / 6% real against 50% / 50% generated: " << plain
            << " unweighted, " << weighted << " weighted\n";
  EXPECT_GT(plain, 0.65);  // class 1 alone gives away half the generated set
  EXPECT_NEAR(weighted, 0.5, 0.1);
}

// A CNN judge trained a few epochs on the procedural sprites' classes. In its features, held-out
// real sprites are as far from the real set as other real ones; a generator that draws one class
// only (mode collapse) lands among real sprites (precision) but covers a quarter of them (recall)
// and is far by the Fréchet distance; noise is far and lands nowhere real. The judge is trained to
// name classes, so 5% noisy pixels hardly move its features: the two-sample test is what sees them
// (TwoSampleTest.RanksRealBelowNoisyPixels...).
TEST(Fidelity, TheJudgesFeaturesSeeMissingClassesAndNoise) {
  // (1536, 4, 16, 16) uint8, 4 classes: the judge learns from the last 512, the real sets A and B
  // are drawn from the first 512, and the sets compared with them come from the 512 between.
  const auto set = data::make_procedural_sprites(1536, 5);
  torch::manual_seed(2);
  auto judge = models::make_model({"cnn", {4, 16, 16}, set.num_classes()});
  {
    torch::optim::Adam adam(judge->parameters(), torch::optim::AdamOptions(1e-3));
    judge->train();
    const auto x = data::to_model_input(set.inputs.narrow(0, 1024, 512));
    const auto y = set.labels.narrow(0, 1024, 512);
    for (int epoch = 0; epoch < 3; ++epoch)
      for (int64_t i = 0; i < 512; i += 64) {
        const auto loss =
            torch::cross_entropy_loss(judge->forward(x.narrow(0, i, 64)), y.narrow(0, i, 64));
        adam.zero_grad();
        loss.backward();
        adam.step();
      }
  }
  const auto pool = set.inputs.narrow(0, 0, 512);
  const auto held_out = set.inputs.narrow(0, 512, 512);
  const auto held_out_labels = set.labels.narrow(0, 512, 512);
  const auto one_class = held_out.index_select(0, torch::nonzero(held_out_labels == 0).squeeze(1));
  const auto noise = at::randint(0, 256, {256, 4, 16, 16},
                                 at::make_generator<at::CPUGeneratorImpl>(7), torch::kUInt8);
  TwoSampleOptions o;
  o.epochs = 1;  // the critic is not what this test is about
  o.repeats = 1;
  // Real sets A and B: n sprites each from `pool`, n = min(generated, 256).
  const auto real = fidelity(held_out.narrow(0, 0, 256), pool, o, judge.get());
  const auto collapsed = fidelity(one_class, pool, o, judge.get());
  const auto noise_r = fidelity(noise, pool, o, judge.get());
  const auto print = [](const char* what, const FidelityReport& r) {
    std::cout << what << ": Fréchet " << r.frechet << " (real " << r.frechet_real << "), precision "
              << r.coverage.precision << " (" << r.coverage_real.precision << "), recall "
              << r.coverage.recall << " (" << r.coverage_real.recall << ")\n";
  };
  print("held-out real", real);
  print("one class", collapsed);
  print("noise", noise_r);
  ASSERT_TRUE(real.judged);
  EXPECT_FALSE(real.class_weighted);
  EXPECT_EQ(real.feature_dims, 128);                   // the cnn's hidden units
  EXPECT_EQ(real.frechet_real, noise_r.frechet_real);  // the same real sets each time
  EXPECT_LT(real.frechet, 2 * real.frechet_real);
  EXPECT_GT(collapsed.frechet, 3 * collapsed.frechet_real);
  // Noise is far from real sprites, but the distance does not rank it beyond one class drawn
  // alone (63.6 against 123.7 here: the judge maps noise to few, similar features); precision
  // does (0 against 0.93).
  EXPECT_GT(noise_r.frechet, 10 * real.frechet);
  EXPECT_GT(real.coverage.precision, 0.8);
  EXPECT_GT(real.coverage.recall, 0.8);
  EXPECT_GT(collapsed.coverage.precision, 0.8);
  EXPECT_LT(collapsed.coverage.recall, 0.5);
  EXPECT_EQ(noise_r.coverage.precision, 0.0);
  EXPECT_EQ(noise_r.coverage.recall, 0.0);
  EXPECT_FALSE(fidelity(noise, pool, o).judged);
  // With labels, a real set weighted to the one class drawn finds the collapsed set close again:
  // weighting asks "are these sprites like real ones of the classes drawn?"
  const auto weighted =
      fidelity(one_class, pool, o, judge.get(),
               {torch::zeros({one_class.size(0)}, torch::kInt64), set.labels.narrow(0, 0, 512)});
  print("one class, real weighted to it", weighted);
  EXPECT_TRUE(weighted.class_weighted);
  EXPECT_LT(weighted.frechet, collapsed.frechet / 3);
  EXPECT_GT(weighted.coverage.recall, 0.8);
}

// The agreement counts the classifier's argmax against the labels, overall and per class, over
// more sprites than one slice of 1,000; a class without sprites reads NaN.
TEST(ClassifierAgreement, CountsArgmaxHitsPerClass) {
  torch::manual_seed(3);
  auto classifier = models::make_model({"ann", {4, 4, 4}, 3});
  const int64_t n = 2500;
  const auto sprites = torch::randint(0, 256, {n, 4, 4, 4}, torch::kUInt8);
  torch::Tensor predicted;
  {
    torch::NoGradGuard no_grad;
    classifier->eval();
    predicted = classifier->forward(data::to_model_input(sprites)).argmax(1);
  }
  // Labels: the prediction on even rows, another class on odd ones (exactly half the hits).
  auto labels = predicted.clone();
  for (int64_t i = 1; i < n; i += 2) labels[i] = (predicted[i].item<int64_t>() + 1) % 3;
  const Agreement a = classifier_agreement(*classifier, sprites, labels, 4);
  EXPECT_NEAR(a.mean, 0.5, 1e-12);
  ASSERT_EQ(a.per_class.size(), 4u);
  for (int64_t c = 0; c < 3; ++c) {
    const auto mask = labels == c;
    const double expected =
        (predicted.index({mask}) == c).to(torch::kFloat64).mean().item<double>();
    EXPECT_NEAR(a.per_class[c], expected, 1e-12) << "class " << c;
  }
  EXPECT_TRUE(std::isnan(a.per_class[3]));  // no sprite labelled 3
}

}  // namespace
}  // namespace spritetorch::diffusion
