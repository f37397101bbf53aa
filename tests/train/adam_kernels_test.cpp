// Every Adam kernel this CPU can run against the plain loop (Kernel::loops), on lengths around
// the vector widths (tails of 1-15 lanes, ranges that start and end mid-vector), with and without
// weight decay, zero second moments and gradients spanning many magnitudes.
#include "train/adam_kernels.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

namespace spritetorch::train {
namespace {

using gemm::Kernel;

struct Buffers {
  torch::Tensor p, g, m, v;
  Buffers clone() const { return {p.clone(), g.clone(), m.clone(), v.clone()}; }
};

Buffers random_buffers(int64_t n) {
  Buffers b;
  b.p = torch::randn({n});
  // Gradients from 1e-6 to 1e2, some exactly 0.
  b.g = torch::randn({n}) * torch::pow(10.0, torch::randint(-6, 3, {n}).to(torch::kFloat32));
  b.g.masked_fill_(torch::rand({n}) < 0.1, 0.0);
  b.m = torch::randn({n}) * 0.01;
  b.v = torch::rand({n}) * 1e-4;
  b.v.masked_fill_(torch::rand({n}) < 0.1, 0.0);  // with g = 0 too: sqrt(v) = 0 must stay exact
  return b;
}

void run(Buffers& b, int64_t begin, int64_t end, const AdamScalars& k, Kernel kernel) {
  adam_update(b.p.data_ptr<float>(), b.g.data_ptr<float>(), b.m.data_ptr<float>(),
              b.v.data_ptr<float>(), begin, end, k, kernel);
}

TEST(AdamKernels, EveryKernelMatchesTheLoop) {
  torch::manual_seed(5);
  std::vector<Kernel> kernels;
  for (Kernel k : {Kernel::avx512, Kernel::avx2})
    if (gemm::available(k)) kernels.push_back(k);
  if (kernels.empty()) GTEST_SKIP() << "this CPU has only the loop";
  // Adam at step 3 with L2 decay, AdamW with decoupled decay, plain Adam at step 1.
  const std::vector<AdamScalars> settings = {
      {0.9f, 0.999f, 0.1f, 0.001f, 1.0f / std::sqrt(1.0f - 0.997003f), 1e-8f, -1e-3f / 0.271f,
       0.01f, 1.0f},
      {0.9f, 0.999f, 0.1f, 0.001f, 1.0f / std::sqrt(0.001f), 1e-8f, -0.05f / 0.1f, 0.0f,
       1.0f - 0.05f * 0.01f},
      {0.8f, 0.99f, 0.2f, 0.01f, 1.0f / std::sqrt(0.01f), 1e-6f, -0.1f / 0.2f, 0.0f, 1.0f}};
  for (Kernel kernel : kernels)
    for (size_t s = 0; s < settings.size(); ++s)
      for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000})
        for (int64_t begin : {int64_t{0}, std::min<int64_t>(3, n - 1)}) {
          const auto start = random_buffers(n);
          auto expected = start.clone(), got = start.clone();
          const int64_t end = n > 4 ? n - 2 : n;  // and nothing past it is touched
          run(expected, begin, end, settings[s], Kernel::loops);
          run(got, begin, end, settings[s], kernel);
          const std::string where = std::string(gemm::kernel_name(kernel)) + " setting " +
                                    std::to_string(s) + " n " + std::to_string(n) + " begin " +
                                    std::to_string(begin);
          // The moments may differ by rounding: the compiler may fuse a multiply and an add into
          // one FMA (one rounding instead of two), and with weight decay the kernels form g + l2 p
          // as an FMA. So each moment is held to a few ulps of the terms it sums (b1 m + (1 - b1)
          // g', which can cancel to far less than either). The parameters also go through the
          // estimated 1/sqrt and 1/x, each refined by one Newton step: a few ulps of the update
          // and of the decayed parameter it is added to (8 ulps of the larger).
          const auto& k = settings[s];
          const auto g_terms = start.g.abs() + k.l2 * start.p.abs();
          auto within = [&](const torch::Tensor& got_moment, const torch::Tensor& want,
                            const torch::Tensor& terms) {
            return ((got_moment - want).abs() <= 4 * FLT_EPSILON * terms).all().item<bool>();
          };
          EXPECT_TRUE(within(got.m, expected.m, k.b1 * start.m.abs() + k.one_minus_b1 * g_terms))
              << where;
          EXPECT_TRUE(
              within(got.v, expected.v, k.b2 * start.v + k.one_minus_b2 * g_terms * g_terms))
              << where;
          const auto decayed = start.p * k.decay;
          EXPECT_TRUE(within(got.p, expected.p, 2 * (decayed.abs() + (expected.p - decayed).abs())))
              << where << ": " << (got.p - expected.p).abs().max().item<float>();
          // Outside [begin, end) nothing moves; inside, the update did something.
          for (const auto& [after, before] :
               {std::pair{got.p, start.p}, {got.m, start.m}, {got.v, start.v}}) {
            EXPECT_TRUE(torch::equal(after.narrow(0, 0, begin), before.narrow(0, 0, begin)))
                << where;
            EXPECT_TRUE(torch::equal(after.narrow(0, end, n - end), before.narrow(0, end, n - end)))
                << where;
          }
          if (end - begin >= 8) {
            EXPECT_FALSE(torch::equal(got.p, start.p)) << where;
          }
        }
}

// A range updated in pieces gives the same bits as in one go, for every kernel: each element takes
// the same arithmetic wherever a piece starts or ends (a tail through the exact loop, beside
// estimated lanes, made the optimizer's result depend on how the step threads split it).
TEST(AdamKernels, ARangeUpdatedInPiecesGivesTheSameBitsAsInOneGo) {
  torch::manual_seed(6);
  const AdamScalars k{0.9f,  0.999f,          0.1f,  0.001f, 1.0f / std::sqrt(1.0f - 0.997003f),
                      1e-8f, -1e-3f / 0.271f, 0.01f, 1.0f};
  const int64_t n = 46;
  for (Kernel kernel : {Kernel::loops, Kernel::avx2, Kernel::avx512}) {
    if (kernel != Kernel::loops && !gemm::available(kernel)) continue;
    for (int64_t cut : {1, 5, 7, 13, 23, 40}) {
      const auto start = random_buffers(n);
      auto whole = start.clone(), pieces = start.clone();
      run(whole, 0, n, k, kernel);
      run(pieces, cut, n, k, kernel);  // the end first, as a thread's share may be
      run(pieces, 0, cut, k, kernel);
      const std::string where =
          std::string(gemm::kernel_name(kernel)) + " cut at " + std::to_string(cut);
      EXPECT_TRUE(torch::equal(whole.p, pieces.p)) << where;
      EXPECT_TRUE(torch::equal(whole.m, pieces.m)) << where;
      EXPECT_TRUE(torch::equal(whole.v, pieces.v)) << where;
    }
  }
}

// A parameter whose gradient stays 0 has its first moment decay into float's subnormal range, where
// Intel cores take a microcode assist on every vector op that touches one (the update ran 5x
// slower); the update flushes subnormals to 0 (common/flush_subnormals.h).
// Every kernel, the loop included, gives 0 for such a moment, leaves its weight exactly where the
// exact arithmetic would, and hands the caller's floating-point mode back as it was.
TEST(AdamKernels, SubnormalMomentsAreFlushedWithoutMovingAWeight) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the update flushes subnormals on x86 only";
#endif
  const float subnormal = FLT_MIN / 64;  // 1.8e-40
  ASSERT_EQ(std::fpclassify(subnormal), FP_SUBNORMAL);
  // Adam at step 1000, lr 1e-3: the moments of parameters with g = 0 for a long while.
  const AdamScalars k{
      0.9f,  0.999f, 0.1f, 0.001f, 1.0f / std::sqrt(1.0f - std::pow(0.999f, 1000.0f)),
      1e-8f, -1e-3f, 0.0f, 1.0f};
  const int64_t n = 37;  // a vector or two and a tail for every kernel
  for (Kernel kernel : {Kernel::loops, Kernel::avx2, Kernel::avx512}) {
    if (kernel != Kernel::loops && !gemm::available(kernel)) continue;
    const std::string where = gemm::kernel_name(kernel);
    auto p = torch::linspace(-1.0, 1.0, n) + 0.01;  // no weight near 0
    auto g = torch::zeros({n});
    auto m = torch::full({n}, subnormal), v = torch::full({n}, subnormal);
    m.narrow(0, 0, n / 2).fill_(-subnormal);
    const auto p0 = p.clone();
    adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                0, n, k, kernel);
    EXPECT_TRUE(torch::equal(m, torch::zeros({n}))) << where;
    EXPECT_TRUE(torch::equal(v, torch::zeros({n}))) << where;
    // The exact update of each weight, in double: smaller than half its ulp, so the weight stays.
    for (int64_t i = 0; i < n; ++i) {
      const double m1 = 0.9 * (i < n / 2 ? -subnormal : subnormal);
      const double exact =
          p0[i].item<double>() +
          k.neg_step * m1 / (std::sqrt(0.999 * subnormal) * k.inv_bias2_sqrt + k.eps);
      EXPECT_EQ(p[i].item<float>(), static_cast<float>(exact)) << where << " element " << i;
      EXPECT_EQ(p[i].item<float>(), p0[i].item<float>()) << where << " element " << i;
    }
    // The caller's mode is back: a subnormal result is still a subnormal here.
    volatile float tiny = FLT_MIN;
    EXPECT_EQ(std::fpclassify(tiny / 4), FP_SUBNORMAL) << where;
  }
}

// `devices` names the update that runs: the matrix kernel's width where the CPU has it.
TEST(AdamKernels, TheNamedKernelFollowsTheMatrixKernel) {
  EXPECT_STREQ(adam_kernel_name(Kernel::loops), "loops");
  const bool avx2 = gemm::available(Kernel::avx2);
  EXPECT_STREQ(adam_kernel_name(Kernel::avx2), avx2 ? "avx2" : "loops");
  EXPECT_STREQ(adam_kernel_name(Kernel::blas), avx2 ? "avx2" : "loops");
  if (gemm::available(Kernel::avx512)) {
    EXPECT_STREQ(adam_kernel_name(Kernel::avx512), "avx512");
  }
}

}  // namespace
}  // namespace spritetorch::train
