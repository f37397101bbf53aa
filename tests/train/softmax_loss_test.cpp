// The fused step's softmax cross-entropy: the loop against LibTorch's log_softmax and argmax, and
// the AVX-512 form (where the CPU has it) against the loop, on 1-40 classes, ties, logits far
// below the maximum (exp underflowing to 0) and exp's whole range.
#include "train/softmax_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cfloat>
#include <string>
#include <vector>

namespace spritetorch::train {
namespace {

using gemm::Kernel;

struct Result {
  SoftmaxLossSums sums;
  torch::Tensor dz;
};

Result run(const torch::Tensor& logits, const torch::Tensor& labels, float scale, Kernel kernel) {
  Result out;
  out.dz = torch::full_like(logits, 123.0f);  // every element must be written
  out.sums = softmax_cross_entropy(
      logits.data_ptr<float>(), labels.data_ptr<int64_t>(), static_cast<int>(logits.size(0)),
      static_cast<int>(logits.size(1)), scale, out.dz.data_ptr<float>(), kernel);
  return out;
}

// Rows of random logits (some rows with ties for the maximum, some with entries 1e30 below it),
// random labels.
std::pair<torch::Tensor, torch::Tensor> random_rows(int64_t rows, int64_t classes) {
  auto logits = torch::randn({rows, classes}) * 4.0;
  if (rows > 2 && classes > 3) {
    logits[1].fill_(0.5f);  // all equal: the first is the maximum
    logits[2][1] = 9.0f;
    logits[2][3] = 9.0f;  // a tie at 1 and 3
    logits[0][classes - 1] = -1e30f;
  }
  return {logits.contiguous(), torch::randint(0, classes, {rows}, torch::kInt64)};
}

TEST(SoftmaxLoss, LoopMatchesLibTorch) {
  torch::manual_seed(1);
  for (int64_t classes : {1, 2, 10, 16, 17, 40})
    for (int64_t rows : {1, 5, 33}) {
      SCOPED_TRACE(std::to_string(classes) + " classes, " + std::to_string(rows) + " rows");
      const auto [logits, labels] = random_rows(rows, classes);
      const float scale = 1.0f / 64.0f;
      const Result got = run(logits, labels, scale, Kernel::loops);
      const auto log_p = torch::log_softmax(logits, 1);
      const double want_loss = -log_p.gather(1, labels.unsqueeze(1)).sum().item<double>();
      EXPECT_NEAR(got.sums.loss, want_loss, 1e-5 * (1.0 + std::abs(want_loss)));
      const auto onehot = torch::zeros_like(logits).scatter_(1, labels.unsqueeze(1), 1.0);
      const auto want_dz = (log_p.exp() - onehot) * scale;
      EXPECT_LT((got.dz - want_dz).abs().max().item<double>(), 1e-7);
      const int64_t want_correct = logits.argmax(1).eq(labels).sum().item<int64_t>();
      EXPECT_EQ(got.sums.correct, want_correct);
    }
}

TEST(SoftmaxLoss, Avx512MatchesTheLoop) {
  if (!gemm::available(Kernel::avx512)) GTEST_SKIP() << "no AVX-512 here";
  torch::manual_seed(2);
  for (int64_t classes : {1, 2, 3, 10, 15, 16, 17, 40})  // 17, 40: the loop's, through the switch
    for (int64_t rows : {1, 7, 32}) {
      SCOPED_TRACE(std::to_string(classes) + " classes, " + std::to_string(rows) + " rows");
      const auto [logits, labels] = random_rows(rows, classes);
      const Result want = run(logits, labels, 0.25f, Kernel::loops);
      const Result got = run(logits, labels, 0.25f, Kernel::avx512);
      EXPECT_NEAR(got.sums.loss, want.sums.loss, 1e-6 * (1.0 + std::abs(want.sums.loss)));
      EXPECT_EQ(got.sums.correct, want.sums.correct);
      // Each gradient within a few float ulps of the loop's (exp to 3 ulp, another order of
      // summing the exponentials), and of the scale where the label's p - 1 cancels.
      EXPECT_TRUE(torch::allclose(got.dz, want.dz, 1e-6, 1e-6 * 0.25))
          << (got.dz - want.dz).abs().max().item<double>();
    }
}

// exp over its whole range, through two-class rows [0, x]: dz[0][1] = e^x / (1 + e^x) (label 0).
TEST(SoftmaxLoss, Avx512ExpHoldsOverItsRange) {
  if (!gemm::available(Kernel::avx512)) GTEST_SKIP() << "no AVX-512 here";
  std::vector<float> values;
  for (float x = -110.0f; x <= 0.0f; x += 0.173f) values.push_back(x);
  for (float x : {-87.5f, -87.3f, -0.3466f, 0.3466f, -1e-8f, 0.0f}) values.push_back(x);
  const auto xs = torch::tensor(values);
  const auto logits = torch::stack({torch::zeros_like(xs), xs}, 1).contiguous();
  const auto labels = torch::zeros({xs.size(0)}, torch::kInt64);
  const Result want = run(logits, labels, 1.0f, Kernel::loops);
  const Result got = run(logits, labels, 1.0f, Kernel::avx512);
  const auto p = got.dz.select(1, 1), q = want.dz.select(1, 1);
  // Relative error of e^x within 3 float ulps wherever it is a normal float.
  const auto normal = q.abs() >= FLT_MIN;
  const auto rel = ((p - q).abs() / q.abs()).masked_select(normal);
  EXPECT_LT(rel.max().item<double>(), 3 * 1.2e-7);
  // Below the normal range: 0 or a subnormal, never more.
  EXPECT_LT(p.masked_select(~normal).abs().max().item<double>(), FLT_MIN);
  EXPECT_TRUE(torch::isfinite(got.dz).all().item<bool>());
}

}  // namespace
}  // namespace spritetorch::train
