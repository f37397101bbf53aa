#include "common/blas.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

namespace spritetorch::blas {
namespace {

// Every transpose combination, with leading dimensions wider than the matrices (C written into a
// column slice of a larger buffer, as the CPU MLP step does) and beta 0 and 1.
TEST(Blas, SgemmMatchesTorchMmForEveryLayout) {
  SKIP_WITHOUT_CBLAS();
  torch::manual_seed(5);
  const int m = 7, n = 5, k = 9, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        // Stored shapes with padding columns: A (m x k) or (k x m), B (k x n) or (n x k).
        auto a_store = torch::randn({ta ? k : m, (ta ? m : k) + pad});
        auto b_store = torch::randn({tb ? n : k, (tb ? k : n) + pad});
        auto c_store = torch::randn({m, n + pad});
        auto a = a_store.narrow(1, 0, ta ? m : k), b = b_store.narrow(1, 0, tb ? k : n);
        auto expected = c_store.clone();
        expected.narrow(1, 1, n).mul_(beta).add_(torch::mm(ta ? a.t() : a, tb ? b.t() : b));
        sgemm(ta, tb, m, n, k, a_store.data_ptr<float>(), static_cast<int>(a_store.size(1)),
              b_store.data_ptr<float>(), static_cast<int>(b_store.size(1)), beta,
              c_store.data_ptr<float>() + 1, static_cast<int>(c_store.size(1)));
        EXPECT_TRUE(torch::allclose(c_store, expected, 1e-5, 1e-5))
            << "trans_a " << ta << " trans_b " << tb << " beta " << beta;
      }
}

}  // namespace
}  // namespace spritetorch::blas
