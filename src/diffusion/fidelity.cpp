#include "diffusion/fidelity.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "common/timer.h"
#include "diffusion/generator.h"

namespace spritetorch::diffusion {

namespace {

constexpr int64_t kCoverageNeighbours = 3;  // k of the k-NN balls (the paper's choice)

// (rows) float64 CPU weights: `weights` checked (one per row, none negative, some above 0), or 1
// for every row when undefined.
torch::Tensor row_weights(const torch::Tensor& weights, int64_t rows, const std::string& who) {
  if (!weights.defined()) return torch::ones({rows}, torch::kFloat64);
  if (weights.dim() != 1 || weights.size(0) != rows)
    throw Error(who + " needs one weight per row, got " + c10::str(weights.sizes()) + " for " +
                std::to_string(rows) + " rows");
  const auto w = weights.cpu().to(torch::kFloat64);
  if (w.min().item<double>() < 0 || !(w.sum().item<double>() > 0))
    throw Error(who + " needs weights >= 0 with a sum above 0");
  return w;
}

// Alpha as `mode` makes it and RGB 0 under transparent pixels, as to_sprites makes generated
// sprites.
torch::Tensor prepared(const torch::Tensor& sprites, AlphaMode mode) {
  check_sprites(sprites, "fidelity");
  return to_sprites(sprites.cpu().to(torch::kFloat32) / 127.5 - 1.0, mode);
}

// The two-sample test's critic. Mean and max of the features at full resolution (one stray or
// off-palette pixel moves the max of a 3x3 filter) and at S/4 (shapes and overall colour).
struct CriticImpl : torch::nn::Module {
  torch::nn::Conv2d c1{torch::nn::Conv2dOptions(4, 32, 3).padding(1)};
  torch::nn::Conv2d c2{torch::nn::Conv2dOptions(32, 32, 3).padding(1)};
  torch::nn::Conv2d c3{torch::nn::Conv2dOptions(32, 32, 3).padding(1)};
  torch::nn::Linear head{128, 1};
  CriticImpl() {
    register_module("c1", c1);
    register_module("c2", c2);
    register_module("c3", c3);
    register_module("head", head);
  }
  // x: (B, 4, S, S) in [-1, 1] -> (B) logits
  torch::Tensor forward(const torch::Tensor& x) {
    const auto h1 = torch::relu(c1(x));                  // (B, 32, S, S)
    auto h = torch::avg_pool2d(torch::relu(c2(h1)), 4);  // (B, 32, S/4, S/4)
    h = torch::relu(c3(h)).flatten(2);                   // (B, 32, S*S/16)
    const auto f1 = h1.flatten(2);                       // (B, 32, S*S)
    return head(torch::cat({f1.mean(2), f1.amax(2), h.mean(2), h.amax(2)}, 1)).squeeze(1);
  }
};
TORCH_MODULE(Critic);

// Seeds the global CPU generator (module initialisation draws from it) and restores its state.
class GlobalSeed {
 public:
  explicit GlobalSeed(uint64_t seed) : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_current_seed(seed);
  }
  ~GlobalSeed() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(saved_);
  }
  GlobalSeed(const GlobalSeed&) = delete;
  GlobalSeed& operator=(const GlobalSeed&) = delete;

 private:
  at::Generator gen_;
  torch::Tensor saved_;
};

torch::Tensor model_input(const torch::Tensor& sprites) {
  return sprites.to(torch::kFloat32) / 127.5 - 1.0;
}

}  // namespace

PixelArtStats pixel_art_stats(const torch::Tensor& sprites_in) {
  const auto sprites = prepared(sprites_in, AlphaMode::kBinary);
  const int64_t n = sprites.size(0), s = sprites.size(2), w = sprites.size(3);
  PixelArtStats r;
  r.sprites = n;
  if (n == 0) return r;
  const auto opaque = sprites.select(1, 3) >= 128;  // (N, S, W)
  const auto padded = torch::constant_pad_nd(opaque.to(torch::kUInt8), {1, 1, 1, 1});
  const auto neighbour = padded.slice(1, 0, s).slice(2, 1, w + 1) |
                         padded.slice(1, 2, s + 2).slice(2, 1, w + 1) |
                         padded.slice(1, 1, s + 1).slice(2, 0, w) |
                         padded.slice(1, 1, s + 1).slice(2, 2, w + 2);  // (N, S, W)
  const auto stray = opaque & (neighbour == 0);
  r.stray_pixels = stray.sum().item<double>() / static_cast<double>(n);
  r.alpha_coverage = opaque.to(torch::kFloat64).mean().item<double>();
  // One key per (sprite, quantised colour) of every opaque pixel; distinct keys per sprite.
  const auto q = sprites.narrow(1, 0, 3).to(torch::kInt64).div(16, "floor");  // (N, 3, S, W)
  const auto colour = q.select(1, 0) * 256 + q.select(1, 1) * 16 + q.select(1, 2);
  const auto index = torch::arange(n, torch::kInt64).view({n, 1, 1}).expand_as(colour);
  const auto keys = (index * 4096 + colour).masked_select(opaque);
  const auto distinct = std::get<0>(at::_unique(keys, /*sorted=*/false));
  r.colours = static_cast<double>(distinct.numel()) / static_cast<double>(n);
  return r;
}

namespace {

// A set of sprites for one critic: inputs (M, 4, S, S) in [-1, 1], labels (M) 0 or 1 as float,
// weights (M) or undefined (every sprite 1: the loss and accuracy of an unweighted test, kept
// bit for bit), all on the critic's device.
struct CriticSet {
  torch::Tensor x, y, w;
};

// One critic: trained on `train`, the mean of its weighted accuracies on `test`'s label-0 and
// label-1 sprites.
double critic_accuracy(const CriticSet& train, const CriticSet& test, uint64_t seed,
                       at::Generator& gen, const TwoSampleOptions& o) {
  Critic critic{nullptr};
  {
    GlobalSeed seeded(seed);
    critic = Critic();
  }
  critic->to(o.device);
  critic->train();
  torch::optim::Adam adam(critic->parameters(), torch::optim::AdamOptions(o.lr));
  const int64_t m = train.x.size(0), batch = std::max<int64_t>(1, o.batch);
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    const auto order = torch::randperm(m, gen).to(o.device);
    for (int64_t start = 0; start < m; start += batch) {
      const auto idx = order.narrow(0, start, std::min(batch, m - start));
      const auto loss = torch::binary_cross_entropy_with_logits(
          critic->forward(train.x.index_select(0, idx)), train.y.index_select(0, idx),
          train.w.defined() ? train.w.index_select(0, idx) : torch::Tensor());
      adam.zero_grad();
      loss.backward();
      adam.step();
    }
  }
  torch::NoGradGuard no_grad;
  critic->eval();
  const auto right = ((critic->forward(test.x) > 0).to(torch::kFloat32) == test.y)
                         .to(torch::kFloat64);  // (M) 0 or 1
  const auto w = test.w.defined() ? test.w.to(torch::kFloat64) : torch::ones_like(right);
  // Weighted accuracy on one label's sprites; a side whose weights are all 0 in this half (a class
  // mix the half does not hold) leaves the score to the other side.
  std::vector<double> sides;
  for (int label : {0, 1}) {
    const auto weight = (test.y == label).to(torch::kFloat64) * w;
    const double total = weight.sum().item<double>();
    if (total > 0) sides.push_back((right * weight).sum().item<double>() / total);
  }
  if (sides.empty())
    throw Error("a two-sample test's held-out half has no sprite of weight above 0");
  return sides.size() == 1 ? sides[0] : (sides[0] + sides[1]) / 2;
}

}  // namespace

torch::Tensor class_weights(const torch::Tensor& labels_in, const torch::Tensor& target_in) {
  const auto labels = labels_in.cpu().to(torch::kInt64), target = target_in.cpu().to(torch::kInt64);
  if (labels.dim() != 1 || target.dim() != 1 || labels.numel() == 0 || target.numel() == 0 ||
      labels.min().item<int64_t>() < 0 || target.min().item<int64_t>() < 0)
    throw Error("class weights need two non-empty lists of class labels >= 0, got " +
                c10::str(labels.sizes()) + " and " + c10::str(target.sizes()));
  const int64_t classes = std::max(labels.max().item<int64_t>(), target.max().item<int64_t>()) + 1;
  const auto share = [classes](const torch::Tensor& l) {
    return torch::bincount(l, {}, classes).to(torch::kFloat64) / static_cast<double>(l.numel());
  };
  const auto ratio = share(target) / share(labels).clamp_min(1e-300);  // (classes)
  return ratio.index_select(0, labels);
}

double two_sample_accuracy(const torch::Tensor& a_in, const torch::Tensor& b_in,
                           const TwoSampleOptions& o, const torch::Tensor& a_weights,
                           const torch::Tensor& b_weights) {
  const int64_t n = std::min(a_in.size(0), b_in.size(0));
  if (n < 2)
    throw Error("a two-sample test needs at least 2 sprites per set, got " + std::to_string(n));
  if (a_in.sizes().slice(1) != b_in.sizes().slice(1))
    throw Error("a two-sample test needs sprites of one shape, got " + c10::str(a_in.sizes()) +
                " and " + c10::str(b_in.sizes()));
  if (o.repeats < 1) throw Error("a two-sample test needs at least 1 repeat");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto a_all = prepared(a_in.narrow(0, 0, n), o.alpha);
  const auto b_all = prepared(b_in.narrow(0, 0, n), o.alpha);
  const bool weighted = a_weights.defined() || b_weights.defined();
  const auto wa_all = row_weights(a_weights, a_in.size(0), "a two-sample test").narrow(0, 0, n);
  const auto wb_all = row_weights(b_weights, b_in.size(0), "a two-sample test").narrow(0, 0, n);
  double sum = 0;
  for (int64_t r = 0; r < o.repeats; ++r) {
    // Each set split in two by its own permutation; a critic trained on the first halves is
    // scored on the second, and one trained on the second on the first (each sprite is scored
    // once per repeat). One critic on one split scored one generator 0.69 and 0.95 at two seeds.
    const auto order_a = torch::randperm(n, gen), order_b = torch::randperm(n, gen);
    const auto a = a_all.index_select(0, order_a), wa = wa_all.index_select(0, order_a);
    const auto b = b_all.index_select(0, order_b), wb = wb_all.index_select(0, order_b);
    const int64_t half = n / 2, rest = n - half;
    const auto part = [&](int64_t start, int64_t size) {
      CriticSet set{model_input(torch::cat({a.narrow(0, start, size), b.narrow(0, start, size)}))
                        .to(o.device),
                    torch::cat({torch::zeros({size}), torch::ones({size})}).to(o.device),
                    {}};
      if (weighted)
        set.w = torch::cat({wa.narrow(0, start, size), wb.narrow(0, start, size)})
                    .to(torch::kFloat32)
                    .to(o.device);
      return set;
    };
    const CriticSet first = part(0, half), second = part(half, rest);
    const uint64_t seed = o.seed + 1000 * static_cast<uint64_t>(r);
    const double on_second = critic_accuracy(first, second, seed, gen, o);
    const double on_first = critic_accuracy(second, first, seed + 1, gen, o);
    sum += (on_second * static_cast<double>(2 * rest) + on_first * static_cast<double>(2 * half)) /
           static_cast<double>(2 * n);
  }
  return sum / static_cast<double>(o.repeats);
}

namespace {

// Weighted mean (D) and covariance (D, D) of rows x (N, D), float64; w (N) >= 0, the reliability
// weights' unbiased estimate (N - 1 in the denominator when every weight is 1).
std::pair<torch::Tensor, torch::Tensor> moments(const torch::Tensor& x, const torch::Tensor& w) {
  const double v1 = w.sum().item<double>(), v2 = w.pow(2).sum().item<double>();
  if (!(v1 > 0) || !(v1 - v2 / v1 > 0))
    throw Error("a Fréchet distance needs weights of at least two rows above 0");
  const auto mean = (x * w.unsqueeze(1)).sum(0) / v1;
  const auto centred = x - mean;
  return {mean, centred.t().mm(centred * w.unsqueeze(1)) / (v1 - v2 / v1)};
}

}  // namespace

double frechet_distance(const torch::Tensor& a_in, const torch::Tensor& b_in,
                        const torch::Tensor& a_weights, const torch::Tensor& b_weights) {
  if (a_in.dim() != 2 || b_in.dim() != 2 || a_in.size(1) != b_in.size(1) || a_in.size(0) < 2 ||
      b_in.size(0) < 2)
    throw Error("a Fréchet distance needs two sets of at least 2 feature rows of one width, got " +
                c10::str(a_in.sizes()) + " and " + c10::str(b_in.sizes()));
  const auto a = a_in.cpu().to(torch::kFloat64), b = b_in.cpu().to(torch::kFloat64);
  const auto [mean_a, cov_a] = moments(a, row_weights(a_weights, a.size(0), "a Fréchet distance"));
  const auto [mean_b, cov_b] = moments(b, row_weights(b_weights, b.size(0), "a Fréchet distance"));
  // tr (C_a C_b)^(1/2) = tr (C_a^(1/2) C_b C_a^(1/2))^(1/2): the inner matrix is symmetric positive
  // semi-definite, so both roots come from symmetric eigendecompositions (no general sqrtm).
  const auto [values_a, vectors_a] = torch::linalg_eigh(cov_a, "L");
  const auto root_a = vectors_a.mm(torch::diag(values_a.clamp_min(0).sqrt())).mm(vectors_a.t());
  const auto inner = root_a.mm(cov_b).mm(root_a);
  const auto inner_values = torch::linalg_eigvalsh((inner + inner.t()) / 2, "L");
  const double trace_root = inner_values.clamp_min(0).sqrt().sum().item<double>();
  const double mean_term = (mean_a - mean_b).pow(2).sum().item<double>();
  const double value =
      mean_term + cov_a.trace().item<double>() + cov_b.trace().item<double>() - 2 * trace_root;
  return std::max(0.0, value);  // rounding can leave -1e-12 for identical sets
}

Coverage precision_recall(const torch::Tensor& real_in, const torch::Tensor& generated_in,
                          int64_t k, const torch::Tensor& real_weights,
                          const torch::Tensor& generated_weights) {
  if (real_in.dim() != 2 || generated_in.dim() != 2 || real_in.size(1) != generated_in.size(1) ||
      real_in.size(0) <= k || generated_in.size(0) <= k || k < 1)
    throw Error("precision and recall need two sets of more than k = " + std::to_string(k) +
                " feature rows of one width, got " + c10::str(real_in.sizes()) + " and " +
                c10::str(generated_in.sizes()));
  const auto real = real_in.cpu().to(torch::kFloat64);
  const auto generated = generated_in.cpu().to(torch::kFloat64);
  // Radius of each sample's ball: the distance to its k-th nearest neighbour in its own set (the
  // (k + 1)-th smallest distance, the first being the sample itself).
  const auto radius = [k](const torch::Tensor& x) {
    return std::get<0>(torch::cdist(x, x).topk(k + 1, 1, /*largest=*/false)).select(1, k);
  };
  // Weighted share of `points` (P, D) inside at least one ball of `centres`; weights (P).
  const auto inside = [](const torch::Tensor& points, const torch::Tensor& centres,
                         const torch::Tensor& radii, const torch::Tensor& weights) {
    const auto within = torch::cdist(points, centres) <= radii.unsqueeze(0);  // (P, C)
    return ((within.any(1).to(torch::kFloat64) * weights).sum() / weights.sum()).item<double>();
  };
  Coverage c;
  c.precision = inside(generated, real, radius(real),
                       row_weights(generated_weights, generated.size(0), "precision"));
  c.recall =
      inside(real, generated, radius(generated), row_weights(real_weights, real.size(0), "recall"));
  return c;
}

namespace {

// (N, D) judge features of sprites prepared as the two-sample test prepares them.
torch::Tensor judge_features(models::ClassifierImpl& judge, const torch::Tensor& sprites,
                             AlphaMode alpha) {
  return classifier_pass(judge, prepared(sprites, alpha), &models::ClassifierImpl::features)
      .flatten(1);
}

}  // namespace

FidelityReport fidelity(const torch::Tensor& generated, const torch::Tensor& real,
                        const TwoSampleOptions& o, models::ClassifierImpl* judge,
                        const FidelityLabels& labels) {
  DeviceTimer timer(o.device);
  const int64_t n = std::min(generated.size(0), real.size(0) / 2);
  if (n < 2)
    throw Error("a fidelity report needs at least 2 generated and 4 real sprites, got " +
                std::to_string(generated.size(0)) + " and " + std::to_string(real.size(0)));
  if (generated.sizes().slice(1) != real.sizes().slice(1))
    throw Error("generated sprites " + c10::str(generated.sizes()) +
                " do not have the real ones' shape " + c10::str(real.sizes()));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed + 1);
  const auto order = torch::randperm(real.size(0), gen);
  const auto real_a = real.index_select(0, order.narrow(0, 0, n));
  const auto real_b = real.index_select(0, order.narrow(0, n, n));
  // Each real set weighted to the generated set's class mix (none: every sprite 1).
  torch::Tensor weights_a, weights_b;
  if (labels.generated.defined() && labels.real.defined()) {
    if (labels.real.dim() != 1 || labels.real.size(0) != real.size(0) ||
        labels.generated.dim() != 1 || labels.generated.size(0) < n)
      throw Error("a fidelity report's labels need one per sprite, got " +
                  c10::str(labels.generated.sizes()) + " and " + c10::str(labels.real.sizes()) +
                  " for " + std::to_string(generated.size(0)) + " and " +
                  std::to_string(real.size(0)) + " sprites");
    const auto real_labels = labels.real.cpu().to(torch::kInt64);
    const auto generated_labels = labels.generated.cpu().to(torch::kInt64).narrow(0, 0, n);
    weights_a = class_weights(real_labels.index_select(0, order.narrow(0, 0, n)), generated_labels);
    weights_b = class_weights(real_labels.index_select(0, order.narrow(0, n, n)), generated_labels);
  }
  FidelityReport r;
  r.per_set = n;
  r.max_per_set = real.size(0) / 2;
  r.class_weighted = weights_a.defined();
  r.c2st = two_sample_accuracy(real_a, generated.narrow(0, 0, n), o, weights_a);
  r.c2st_real = two_sample_accuracy(real_a, real_b, o, weights_a, weights_b);
  if (judge != nullptr) {
    const auto fa = judge_features(*judge, real_a, o.alpha);
    const auto fb = judge_features(*judge, real_b, o.alpha);
    const auto fg = judge_features(*judge, generated.narrow(0, 0, n), o.alpha);
    r.judged = true;
    r.feature_dims = fa.size(1);
    r.frechet = frechet_distance(fa, fg, weights_a);
    r.frechet_real = frechet_distance(fa, fb, weights_a, weights_b);
    if (n > kCoverageNeighbours) {
      r.coverage = precision_recall(fa, fg, kCoverageNeighbours, weights_a);
      r.coverage_real = precision_recall(fa, fb, kCoverageNeighbours, weights_a, weights_b);
    }
  }
  r.generated = pixel_art_stats(generated);
  r.real = pixel_art_stats(real);
  r.seconds = timer.seconds();
  return r;
}

}  // namespace spritetorch::diffusion
