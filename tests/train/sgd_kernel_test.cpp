// The CPU SGD update against PyTorch's arithmetic (the tensor ops FlatOptimizer runs on other
// devices), over ranges that start and end anywhere, with and without momentum and weight decay;
// and subnormal momentum flushed without moving a weight.
#include "train/sgd_kernel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cfloat>
#include <cmath>
#include <string>

namespace spritetorch::train {
namespace {

TEST(SgdKernel, MatchesPyTorchsArithmeticOverAnyRange) {
  torch::manual_seed(3);
  for (float momentum : {0.0f, 0.9f})
    for (float wd : {0.0f, 0.01f})
      for (bool first : {true, false})
        for (int64_t n : {1, 7, 16, 33, 1000}) {
          const int64_t begin = std::min<int64_t>(3, n - 1), end = n > 4 ? n - 2 : n;
          const auto p0 = torch::randn({n}), g = torch::randn({n}) * 0.1;
          const auto buf0 = torch::randn({n}) * 0.1;
          auto p = p0.clone(), buf = buf0.clone();
          const SgdScalars k{0.05f, momentum, wd, first};
          sgd_update(p.data_ptr<float>(), g.data_ptr<float>(),
                     momentum != 0.0f ? buf.data_ptr<float>() : nullptr, begin, end, k);
          // torch.optim.SGD's step, over the same range.
          const auto r = torch::indexing::Slice(begin, end);
          auto want_p = p0.clone(), want_buf = buf0.clone();
          const auto gr = wd != 0.0f ? g.index({r}) + wd * p0.index({r}) : g.index({r});
          auto d = gr;
          if (momentum != 0.0f) {
            d = first ? gr : buf0.index({r}) * momentum + gr;
            want_buf.index_put_({r}, d);
          }
          want_p.index_put_({r}, p0.index({r}) - 0.05f * d);
          const std::string where = "momentum " + std::to_string(momentum) + " wd " +
                                    std::to_string(wd) + " first " + std::to_string(first) + " n " +
                                    std::to_string(n);
          // Within an ulp or two of the terms (the compiler may contract a multiply and an add).
          EXPECT_TRUE(torch::allclose(p, want_p, 0, 4 * FLT_EPSILON * 4)) << where;
          EXPECT_TRUE(torch::allclose(buf, want_buf, 0, 4 * FLT_EPSILON * 4)) << where;
          // Outside [begin, end) nothing moves; inside, every weight did.
          EXPECT_TRUE(torch::equal(p.narrow(0, 0, begin), p0.narrow(0, 0, begin))) << where;
          EXPECT_TRUE(torch::equal(p.narrow(0, end, n - end), p0.narrow(0, end, n - end))) << where;
          if (momentum == 0.0f) {
            EXPECT_TRUE(torch::equal(buf, buf0)) << where;
          }
          EXPECT_TRUE((p.index({r}) != p0.index({r})).all().item<bool>()) << where;
        }
}

// A parameter whose gradient stays 0 has its momentum decay into float's subnormal range, where
// Intel cores slow every vector op (common/flush_subnormals.h): the update flushes it to 0, its
// weight stays where the exact arithmetic puts it, and the caller's mode is back afterwards.
TEST(SgdKernel, SubnormalMomentumIsFlushedWithoutMovingAWeight) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the update flushes subnormals on x86 only";
#endif
  const float subnormal = FLT_MIN / 64;
  ASSERT_EQ(std::fpclassify(subnormal), FP_SUBNORMAL);
  const int64_t n = 37;
  auto p = torch::linspace(-1.0, 1.0, n) + 0.01, g = torch::zeros({n});
  auto buf = torch::full({n}, subnormal);
  const auto p0 = p.clone();
  sgd_update(p.data_ptr<float>(), g.data_ptr<float>(), buf.data_ptr<float>(), 0, n,
             {0.1f, 0.9f, 0.0f, false});
  EXPECT_TRUE(torch::equal(buf, torch::zeros({n})));
  EXPECT_TRUE(torch::equal(p, p0));  // 0.1 * 0.9 * 2.2e-40 is far below half an ulp of each
  volatile float tiny = FLT_MIN;
  EXPECT_EQ(std::fpclassify(tiny / 4), FP_SUBNORMAL);
}

}  // namespace
}  // namespace spritetorch::train
