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
#include "models/classifier.h"

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
// (label 1), cross-fitted (each half held out once) and averaged over `repeats` random splits: the
// mean of its accuracy on a's sprites and on b's. a, b: (N, 4, S, S) uint8 with N >= 2 each (the
// first min(Na, Nb) of each are used). a_weights (Na), b_weights (Nb), optional: how much each
// sprite counts, in the critic's loss and in its accuracy on its set (class_weights: a real set
// weighted to a generated set's class mix, so that the mix cannot tell them apart). Deterministic
// for a seed on one device and thread count; the global RNG is left as it was.
double two_sample_accuracy(const torch::Tensor& a, const torch::Tensor& b,
                           const TwoSampleOptions& options, const torch::Tensor& a_weights = {},
                           const torch::Tensor& b_weights = {});

// Weights (N) for sprites of `labels` (N) that give each class c the share it has in
// `target_labels`: share_target(c) / share(c). Classes absent from target_labels weigh 0.
torch::Tensor class_weights(const torch::Tensor& labels, const torch::Tensor& target_labels);

// The Fréchet distance between Gaussians fitted to two sets of features, a: (N, D) and b: (M, D),
// N, M >= 2: |mu_a - mu_b|^2 + tr(C_a + C_b - 2 (C_a C_b)^(1/2)) (Heusel et al. 2017's FID, in
// whatever features are given). Computed in float64; 0 for identical sets, symmetric. Its value
// grows as the sets shrink (the covariances' sampling noise), so compare it only with a value
// from sets of the same sizes and weights. a_weights (N), b_weights (M), optional: each set's
// rows weighted in its mean and covariance (as class_weights gives them).
double frechet_distance(const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& a_weights = {}, const torch::Tensor& b_weights = {});

// Kynkäänniemi et al. 2019's improved precision and recall, from k-nearest-neighbour balls in a
// feature space. precision: the share of `generated` (N, D) inside some real sample's ball (the
// radius to its k-th nearest real neighbour): how many generated images look like something real.
// recall: the share of `real` (M, D) inside some generated sample's ball: how much of the real
// set the generator covers. With weights (M) and (N), each share is a weighted one (as
// class_weights gives them). Needs N, M > k.
struct Coverage {
  double precision = 0, recall = 0;
};
Coverage precision_recall(const torch::Tensor& real, const torch::Tensor& generated, int64_t k = 3,
                          const torch::Tensor& real_weights = {},
                          const torch::Tensor& generated_weights = {});

struct FidelityReport {
  int64_t per_set = 0;  // sprites in each set of each test
  // The most the real set allows (half of it): a critic trained on more sprites sees more (on a
  // set of game characters 0.65 at 512 a set, 0.92 at 1,800; docs/sprites.md).
  int64_t max_per_set = 0;
  double c2st = 0;       // real vs generated
  double c2st_real = 0;  // real vs other real: what an indistinguishable generator would score
  bool class_weighted = false;  // real sets weighted to the generated set's class mix
  // In the judge's features (with a judge only): real set A against generated, and against real
  // set B (what an indistinguishable generator would score).
  bool judged = false;
  int64_t feature_dims = 0;
  double frechet = 0, frechet_real = 0;
  Coverage coverage, coverage_real;
  PixelArtStats generated, real;  // real: the whole real pool
  double seconds = 0;
};

// Class labels of both sets, when known: the real sets are then weighted to the generated set's
// class mix (class_weights) in every test. eval draws every class equally often, and real sets
// are uneven (the DCSS items: 3% staves, 27% weapons); unweighted, the mix alone gave a Fréchet
// distance 3.3x that of real against real and added 0.04 to the two-sample accuracy.
struct FidelityLabels {
  torch::Tensor generated, real;  // (N), (M) int64
};

// generated: (N, 4, S, S), real: (M, 4, S, S) uint8, M >= 4. Takes n = min(N, M / 2) sprites of
// each: real set A and a disjoint real set B (a seeded permutation of `real`), generated vs A and
// B vs A. Error if fewer than 2 sprites per set remain. With a `judge` (a classifier trained on
// the real set, on any device) the report adds the Fréchet distance and the precision and recall
// in its features (ClassifierImpl::features), both sets prepared as for the two-sample test.
FidelityReport fidelity(const torch::Tensor& generated, const torch::Tensor& real,
                        const TwoSampleOptions& options, models::ClassifierImpl* judge = nullptr,
                        const FidelityLabels& labels = {});

}  // namespace spritetorch::diffusion
