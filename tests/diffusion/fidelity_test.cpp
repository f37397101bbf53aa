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
