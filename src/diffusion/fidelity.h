// How close generated sprites are to real ones, in the ways a person sees: a classifier two-sample
// test (a small CNN trained to tell the two sets apart, scored on held-out halves: 0.5 when it
// cannot, 1.0 when it always can) and pixel-art statistics (stray pixels, colours, coverage).
//
// Sprites in: (N, 4, S, S) uint8 RGBA. The two-sample test prepares both sets as generated
// sprites come out (to_sprites with TwoSampleOptions::alpha): with binary alpha the real set's
// partial alpha cannot give it away; with soft alpha the critic sees the real set's shadows and
// glows as they are, and whether the generator drew them. The pixel-art statistics count opaque
// pixels (alpha >= 128) in either case.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "diffusion/generator.h"

namespace spritetorch::diffusion {

struct PixelArtStats {
  int64_t sprites = 0;
  double stray_pixels = 0;    // per sprite: opaque pixels without an opaque 4-neighbour
  double colours = 0;         // per sprite: distinct RGB of opaque pixels, 4 bits per channel
  double alpha_coverage = 0;  // share of opaque pixels
};
PixelArtStats pixel_art_stats(const torch::Tensor& sprites);

struct TwoSampleOptions {
  uint64_t seed = 1;    // split, CNN initialisation and batch order
  int64_t epochs = 40;  // passes over the training halves
  int64_t batch = 32;
  double lr = 2e-3;  // Adam
  // Splits (each scored both ways: two critics) whose accuracies are averaged.
  int64_t repeats = 2;
  torch::Device device = torch::kCPU;
  AlphaMode alpha = AlphaMode::kBinary;  // how both sets are prepared (to_sprites)
};

// Accuracy on held-out halves of a CNN trained on the other halves to tell `a` (label 0) from `b`
// (label 1), cross-fitted (each half held out once) and averaged over `repeats` random splits.
// a, b: (N, 4, S, S) uint8 with N >= 2 each (the first min(Na, Nb) of each are used).
// Deterministic for a seed on one device and thread count; the global RNG is left as it was.
double two_sample_accuracy(const torch::Tensor& a, const torch::Tensor& b,
                           const TwoSampleOptions& options);

struct FidelityReport {
  int64_t per_set = 0;   // sprites in each set of each test
  double c2st = 0;       // real vs generated
  double c2st_real = 0;  // real vs other real: what an indistinguishable generator would score
  PixelArtStats generated, real;  // real: the whole real pool
  double seconds = 0;
};

// generated: (N, 4, S, S), real: (M, 4, S, S) uint8, M >= 4. Takes n = min(N, M / 2) sprites of
// each: real set A and a disjoint real set B (a seeded permutation of `real`), generated vs A and
// B vs A. Error if fewer than 2 sprites per set remain.
FidelityReport fidelity(const torch::Tensor& generated, const torch::Tensor& real,
                        const TwoSampleOptions& options);

}  // namespace spritetorch::diffusion
