// The bf16 kernels against plain loops over the same bf16 values, on every edge size their blocks
// have; skipped where the CPU has no AVX512_BF16 (then every entry point must refuse).
#include "common/bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"

namespace spritetorch {
namespace {

#define REQUIRE_BF16() \
  if (!bf16::available()) GTEST_SKIP() << "this CPU has no AVX512_BF16"

std::vector<float> random_floats(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Bf16, ToBf16RoundsToNearestEven) {
  EXPECT_EQ(bf16::to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16::to_bf16(-2.0f), 0xc000);
  // Halfway between 0x3f80 and 0x3f81: to the even one; just above: up.
  EXPECT_EQ(bf16::to_bf16(bits_to_float(0x3f808000u)), 0x3f80);
  EXPECT_EQ(bf16::to_bf16(bits_to_float(0x3f818000u)), 0x3f82);
  EXPECT_EQ(bf16::to_bf16(bits_to_float(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16::to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16::to_bf16(3.0e38f), 0x7f62);
  EXPECT_TRUE(std::isnan(bf16::to_float(bf16::to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16::to_bf16(-1e-40f), 0x8000) << "subnormals read as signed zero";
  EXPECT_EQ(bf16::to_float(0x3f80), 1.0f);
}

TEST(Bf16, EveryEntryPointRefusesWithoutTheInstructions) {
  if (bf16::available()) GTEST_SKIP() << "this CPU has AVX512_BF16";
  float x = 1.0f, c = 0.0f;
  uint16_t b = 0;
  EXPECT_THROW(bf16::pack_row_pairs(&x, 1, 1, 1, &b), Error);
  EXPECT_THROW(bf16::pack_col_pairs(&x, 1, 1, 1, &b), Error);
  EXPECT_THROW(bf16::nt_pairs(1, 1, 1, &b, 2, &b, 1, &c, 1, nullptr, false), Error);
  EXPECT_THROW(bf16::tn(1, 1, 1, &b, 1, &b, 1, &c, 1), Error);
}

// The vector rounding (one row through pack_row_pairs, both layouts) against the scalar one, on
// the cases the scalar rounding treats apart: ties, infinities, NaN, subnormals, the largest.
TEST(Bf16, PackRoundsAsToBf16AtEveryLength) {
  REQUIRE_BF16();
  auto values = random_floats(100, 1);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                              0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x00800000u, 0x80000000u};
  for (size_t i = 0; i < std::size(special); ++i) values[7 * i] = bits_to_float(special[i]);
  for (int n : {1, 15, 16, 17, 31, 32, 33, 63, 64, 100}) {
    const int even = n + n % 2;
    std::vector<uint16_t> pairs(n * 2 + 1, 0xabcd), row(even + 1, 0xabcd);
    bf16::pack_row_pairs(values.data(), 1, n, n, pairs.data(), row.data());
    for (int i = 0; i < n; ++i)
      for (const uint16_t got : {pairs[i * 2], row[i]}) {
        if (std::isnan(values[i]))
          EXPECT_TRUE(std::isnan(bf16::to_float(got))) << i;
        else
          EXPECT_EQ(got, bf16::to_bf16(values[i])) << "n " << n << " i " << i;
      }
    EXPECT_EQ(pairs[n * 2], 0xabcd) << "wrote past n = " << n;
    EXPECT_EQ(row[even], 0xabcd) << "wrote past n = " << n;
  }
}

TEST(Bf16, PackRowPairsInterleavesRowsAndCopiesThemRowMajor) {
  REQUIRE_BF16();
  for (int rows : {1, 2, 5, 8})
    for (int cols : {1, 15, 16, 17, 40}) {
      const int ld = cols + 3;
      const auto src = random_floats(int64_t{rows} * ld, rows * 100 + cols);
      const int pairs = (rows + 1) / 2;
      const int even = cols + cols % 2;  // rows_out's row length, the pad 0
      std::vector<uint16_t> out(pairs * cols * 2 + 1, 0xabcd), row_major(rows * even + 1, 0xabcd);
      bf16::pack_row_pairs(src.data(), rows, cols, ld, out.data(), row_major.data());
      for (int q = 0; q < pairs; ++q)
        for (int j = 0; j < cols; ++j)
          for (int e = 0; e < 2; ++e) {
            const int r = 2 * q + e;
            const uint16_t want = r < rows ? bf16::to_bf16(src[r * ld + j]) : uint16_t{0};
            ASSERT_EQ(out[(q * cols + j) * 2 + e], want)
                << rows << "x" << cols << " q " << q << " j " << j << " e " << e;
          }
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < even; ++j)
          ASSERT_EQ(row_major[r * even + j], j < cols ? bf16::to_bf16(src[r * ld + j]) : 0)
              << r << ", " << j;
      EXPECT_EQ(out.back(), 0xabcd);
      EXPECT_EQ(row_major.back(), 0xabcd);
    }
}

TEST(Bf16, PackColPairsInterleavesColumnsForEveryTransposeEdge) {
  REQUIRE_BF16();
  for (int rows : {1, 15, 16, 17, 64})
    for (int cols : {1, 2, 31, 32, 33, 784}) {
      const int ld = cols + 1;
      const auto src = random_floats(int64_t{rows} * ld, rows * 1000 + cols);
      const int pairs = (cols + 1) / 2;
      std::vector<uint16_t> out(int64_t{pairs} * rows * 2 + 1, 0xabcd);
      bf16::pack_col_pairs(src.data(), rows, cols, ld, out.data());
      for (int q = 0; q < pairs; ++q)
        for (int r = 0; r < rows; ++r)
          for (int e = 0; e < 2; ++e) {
            const int j = 2 * q + e;
            const uint16_t want = j < cols ? bf16::to_bf16(src[r * ld + j]) : uint16_t{0};
            ASSERT_EQ(out[(int64_t{q} * rows + r) * 2 + e], want)
                << rows << "x" << cols << " q " << q << " r " << r << " e " << e;
          }
      EXPECT_EQ(out.back(), 0xabcd);
    }
}

// The sum of bf16 products in double: the kernels sum in float, in another order.
void expect_close(float got, double want, double scale, const char* what) {
  EXPECT_NEAR(got, want, 1e-5 * scale + 1e-6) << what;
}

// The forward's form: A's rows as pack_row_pairs leaves them (even stride, zero pad), B in pairs
// of columns.
TEST(Bf16, NtPairsMatchesLoopsForEveryBlockEdge) {
  REQUIRE_BF16();
  for (int m : {1, 3, 4, 7, 64})
    for (int n : {1, 15, 16, 17, 64, 70})
      for (int k : {1, 2, 3, 32, 784}) {
        const int lda = k + k % 2, ldc = n + 2;
        const auto fa = random_floats(int64_t{m} * k, m + n + k);
        const auto fb = random_floats(int64_t{n} * k, m * n + k);
        const auto bias = random_floats(n, k);
        std::vector<uint16_t> a(int64_t{(m + 1) / 2} * k * 2), a_rows(int64_t{m} * lda),
            b(int64_t{(k + 1) / 2} * n * 2);
        bf16::pack_row_pairs(fa.data(), m, k, k, a.data(), a_rows.data());
        bf16::pack_col_pairs(fb.data(), n, k, k, b.data());
        for (bool relu : {false, true}) {
          std::vector<float> c(int64_t{m} * ldc, -7.0f);
          bf16::nt_pairs(m, n, k, a_rows.data(), lda, b.data(), n, c.data(), ldc, bias.data(),
                         relu);
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
              double sum = bias[j];
              for (int p = 0; p < k; ++p)
                sum += double{bf16::to_float(bf16::to_bf16(fa[i * k + p]))} *
                       bf16::to_float(bf16::to_bf16(fb[j * k + p]));
              if (relu && sum < 0) sum = 0;
              expect_close(c[i * ldc + j], sum, k, "nt_pairs");
            }
          for (int i = 0; i < m; ++i)
            for (int j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], -7.0f);
        }
      }
  std::vector<uint16_t> any(8);
  float c = 0;
  EXPECT_THROW(bf16::nt_pairs(1, 1, 3, any.data(), 3, any.data(), 1, &c, 1, nullptr, false), Error)
      << "an odd row stride cannot hold pairs";
}

TEST(Bf16, NtPairsReluKeepsNaN) {
  REQUIRE_BF16();
  const uint16_t a[2] = {bf16::to_bf16(std::nanf("")), 0}, b[2] = {bf16::to_bf16(1.0f), 0};
  float c = 0.0f;
  bf16::nt_pairs(1, 1, 2, a, 2, b, 1, &c, 1, nullptr, /*relu=*/true);
  EXPECT_TRUE(std::isnan(c));
}

TEST(Bf16, TnMatchesLoopsOverThePairLayout) {
  REQUIRE_BF16();
  for (int m : {1, 3, 4, 6, 64})
    for (int n : {1, 15, 16, 17, 64, 65, 784})
      for (int rows : {1, 2, 7, 64}) {
        const int lda = m + 2, ldb = n + 1, ldc = n + 3;  // pair-layout widths beyond m and n
        const auto fa = random_floats(int64_t{rows} * lda, m + rows);
        const auto fb = random_floats(int64_t{rows} * ldb, n + rows);
        const int pairs = (rows + 1) / 2;
        std::vector<uint16_t> a(pairs * lda * 2), b(pairs * ldb * 2);
        bf16::pack_row_pairs(fa.data(), rows, lda, lda, a.data());
        bf16::pack_row_pairs(fb.data(), rows, ldb, ldb, b.data());
        std::vector<float> c(int64_t{m} * ldc, -7.0f);
        bf16::tn(m, n, pairs, a.data(), lda, b.data(), ldb, c.data(), ldc);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            double sum = 0;
            for (int r = 0; r < rows; ++r)
              sum += double{bf16::to_float(bf16::to_bf16(fa[r * lda + i]))} *
                     bf16::to_float(bf16::to_bf16(fb[r * ldb + j]));
            expect_close(c[i * ldc + j], sum, rows, "tn");
          }
        for (int i = 0; i < m; ++i)
          for (int j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], -7.0f);
      }
}

}  // namespace
}  // namespace spritetorch
