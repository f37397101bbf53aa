#include "common/small_gemm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace spritetorch::gemm {
namespace {

std::vector<Kernel> kernels_here() {
  std::vector<Kernel> out;
  for (Kernel k : {Kernel::avx512, Kernel::avx2, Kernel::blas, Kernel::loops})
    if (available(k)) out.push_back(k);
  return out;
}

// Sizes around the kernels' block edges (avx2: 3 x 4 for nt, 4 x 24 for nn, 8 lanes; avx512:
// 4 x 4 for nt, 6 x 64 for nn, 16 lanes), and the seed's.
const std::vector<int> kRows = {1, 2, 3, 4, 5, 6, 7, 13, 64};
const std::vector<int> kCols = {1, 3, 4, 5, 8, 9, 15, 16, 17, 24, 25, 33, 47, 63, 64, 65, 81};
const std::vector<int> kInner = {0, 1, 7, 8, 9, 15, 16, 17, 31, 130};

constexpr int kPad = 3;                 // extra columns in every stored matrix
constexpr float kSentinel = -12345.0f;  // C's padding: must survive every product

// A (rows x cols) view into a (rows x cols + kPad) buffer of N(0, 1) values.
torch::Tensor padded_randn(int rows, int cols) {
  return torch::randn({rows, cols + kPad}).narrow(1, 0, cols);
}

torch::Tensor padded_c(int rows, int cols) { return torch::full({rows, cols + kPad}, kSentinel); }

int stride(const torch::Tensor& t) { return static_cast<int>(t.stride(0)); }

void expect_padding_untouched(const torch::Tensor& c_store, int cols, const std::string& where) {
  EXPECT_TRUE(c_store.narrow(1, cols, kPad).eq(kSentinel).all().item<bool>())
      << where << ": wrote past n";
}

TEST(SmallGemm, BestKernelIsAvailable) {
  EXPECT_TRUE(available(best_kernel()));
  EXPECT_TRUE(available(Kernel::loops));
}

// The widest vectors the CPU has, unless SPRITETORCH_GEMM_KERNEL asks for another.
TEST(SmallGemm, BestKernelPrefersAvx512ThenAvx2) {
  if (std::getenv("SPRITETORCH_GEMM_KERNEL")) GTEST_SKIP() << "SPRITETORCH_GEMM_KERNEL is set";
  if (available(Kernel::avx512)) {
    EXPECT_EQ(best_kernel(), Kernel::avx512);
    EXPECT_TRUE(available(Kernel::avx2));  // the AVX-512 kernels need its features too
  } else if (available(Kernel::avx2)) {
    EXPECT_EQ(best_kernel(), Kernel::avx2);
  }
}

TEST(SmallGemm, NtMatchesTorchForEveryShapeAndKernel) {
  torch::manual_seed(11);
  for (Kernel kernel : kernels_here())
    for (int m : kRows)
      for (int n : kCols)
        for (int k : kInner)
          for (int epilogue = 0; epilogue < 3; ++epilogue) {  // none, bias, bias + relu
            const bool with_bias = epilogue > 0, relu = epilogue == 2;
            auto a = padded_randn(m, k), b = padded_randn(n, k);
            auto bias = torch::randn({n});
            auto c_store = padded_c(m, n);
            nt(m, n, k, a.data_ptr<float>(), stride(a), b.data_ptr<float>(), stride(b),
               c_store.data_ptr<float>(), stride(c_store),
               with_bias ? bias.data_ptr<float>() : nullptr, relu, kernel);
            auto expected = torch::mm(a.to(torch::kFloat64), b.to(torch::kFloat64).t());
            if (with_bias) expected += bias.to(torch::kFloat64);
            if (relu) expected = expected.clamp_min(0);
            const std::string where = std::string(kernel_name(kernel)) + " m " + std::to_string(m) +
                                      " n " + std::to_string(n) + " k " + std::to_string(k) +
                                      " epilogue " + std::to_string(epilogue);
            ASSERT_TRUE(
                torch::allclose(c_store.narrow(1, 0, n).to(torch::kFloat64), expected, 1e-5, 1e-5))
                << where;
            expect_padding_untouched(c_store, n, where);
          }
}

TEST(SmallGemm, NnMatchesTorchWithAAsStoredAndTransposed) {
  torch::manual_seed(12);
  for (Kernel kernel : kernels_here())
    for (int m : kRows)
      for (int n : kCols)
        for (int k : kInner)
          for (bool transposed : {false, true}) {
            // A (m x k): stored as is, or stored (k x m) and read transposed.
            auto a_stored = transposed ? padded_randn(k, m) : padded_randn(m, k);
            auto a = transposed ? a_stored.t() : a_stored;
            const int a_row = transposed ? 1 : stride(a_stored),
                      a_col = transposed ? stride(a_stored) : 1;
            auto b = padded_randn(k, n);
            auto c_store = padded_c(m, n);
            nn(m, n, k, a_stored.data_ptr<float>(), a_row, a_col, b.data_ptr<float>(), stride(b),
               c_store.data_ptr<float>(), stride(c_store), kernel);
            auto expected = torch::mm(a.to(torch::kFloat64), b.to(torch::kFloat64));
            const std::string where = std::string(kernel_name(kernel)) + " m " + std::to_string(m) +
                                      " n " + std::to_string(n) + " k " + std::to_string(k) +
                                      (transposed ? " A transposed" : " A as stored");
            ASSERT_TRUE(
                torch::allclose(c_store.narrow(1, 0, n).to(torch::kFloat64), expected, 1e-5, 1e-5))
                << where;
            expect_padding_untouched(c_store, n, where);
          }
}

// The CPU MLP step's diverged-run checks rely on NaN reaching the loss: the ReLU must keep it.
TEST(SmallGemm, NtReluKeepsNaN) {
  for (Kernel kernel : kernels_here()) {
    std::vector<float> a = {std::numeric_limits<float>::quiet_NaN(), 1.0f, -1.0f, 2.0f};
    std::vector<float> b = {1.0f, 1.0f};  // one row of B: c[i] = a[i][0] + a[i][1]
    std::vector<float> c(2, 0.0f);
    nt(2, 1, 2, a.data(), 2, b.data(), 2, c.data(), 1, nullptr, /*relu=*/true, kernel);
    EXPECT_TRUE(std::isnan(c[0])) << kernel_name(kernel);
    EXPECT_EQ(c[1], 1.0f) << kernel_name(kernel);
  }
}

TEST(SmallGemm, UnavailableKernelIsAClearError) {
  if (available(Kernel::avx512) && available(Kernel::avx2) && available(Kernel::blas))
    GTEST_SKIP() << "every kernel runs here";
  for (Kernel kernel : {Kernel::avx512, Kernel::avx2, Kernel::blas}) {
    if (available(kernel)) continue;
    float x = 1.0f, y = 0.0f;
    EXPECT_THROW(nt(1, 1, 1, &x, 1, &x, 1, &y, 1, nullptr, false, kernel), std::exception);
  }
}

}  // namespace
}  // namespace spritetorch::gemm
