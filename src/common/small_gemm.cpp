#include "common/small_gemm.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/blas.h"
#include "common/error.h"

namespace spritetorch::gemm {

namespace {

// The layer's epilogue on one value: + bias, then ReLU as torch's clamp_min(0) (NaN stays NaN).
inline float finish(float v, const float* bias, int j, bool relu) {
  if (bias) v += bias[j];
  return relu && v < 0.0f ? 0.0f : v;
}

void nt_loops(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
              int ldc, const float* bias, bool relu) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const float* ai = a + int64_t{i} * lda;
      const float* bj = b + int64_t{j} * ldb;
      float sum = 0.0f;
      for (int p = 0; p < k; ++p) sum += ai[p] * bj[p];
      c[int64_t{i} * ldc + j] = finish(sum, bias, j, relu);
    }
}

void nn_loops(int m, int n, int k, const float* a, int a_row, int a_col, const float* b, int ldb,
              float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    float* ci = c + int64_t{i} * ldc;
    std::fill_n(ci, n, 0.0f);
    for (int p = 0; p < k; ++p) {
      const float aip = a[int64_t{i} * a_row + int64_t{p} * a_col];
      const float* bp = b + int64_t{p} * ldb;
      for (int j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

void nt_blas(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
             int ldc, const float* bias, bool relu) {
  blas::sgemm(false, true, m, n, k, a, lda, b, ldb, 0.0f, c, ldc);
  if (!bias && !relu) return;
  for (int i = 0; i < m; ++i) {
    float* ci = c + int64_t{i} * ldc;
    for (int j = 0; j < n; ++j) ci[j] = finish(ci[j], bias, j, relu);
  }
}

void nn_blas(int m, int n, int k, const float* a, int a_row, int a_col, const float* b, int ldb,
             float* c, int ldc) {
  // cblas wants A's row stride at least its row length; other strides take the loops.
  if (a_col == 1 && a_row >= std::max(1, k))
    blas::sgemm(false, false, m, n, k, a, a_row, b, ldb, 0.0f, c, ldc);
  else if (a_row == 1 && a_col >= std::max(1, m))
    blas::sgemm(true, false, m, n, k, a, a_col, b, ldb, 0.0f, c, ldc);
  else
    nn_loops(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPRITETORCH_GEMM_AVX2 1
#define SPRITETORCH_AVX2 __attribute__((target("avx2,fma")))
// Loops over a block's registers, unrolled before GCC decides what lives in memory: without it
// the accumulator arrays were stored to the stack on every step (half the speed).
#define SPRITETORCH_UNROLL _Pragma("GCC unroll 16")

// Lanes [0, count) set.
SPRITETORCH_AVX2 inline __m256i lane_mask(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// {sum of v0's lanes, ..., sum of v3's lanes}.
SPRITETORCH_AVX2 inline __m128 lane_sums(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
  return _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
}

// nt, one MR x NR block of C (NR <= 4): MR * 4 accumulators of 8 lanes along the inner dimension,
// summed across lanes at the end. MR = 3, NR = 4 uses all 16 registers: 12 sums, 3 rows of A,
// 1 row of B; per 8 steps of k, 7 loads feed 12 FMAs.
template <int MR, int NR>
SPRITETORCH_AVX2 void nt_block(int k, const float* a, int lda, const float* b, int ldb, float* c,
                               int ldc, const float* bias, bool relu) {
  __m256 acc[MR][4];
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  int p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 av[MR];
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) av[i] = _mm256_loadu_ps(a + int64_t{i} * lda + p);
    SPRITETORCH_UNROLL
    for (int j = 0; j < NR; ++j) {
      const __m256 bv = _mm256_loadu_ps(b + int64_t{j} * ldb + p);
      SPRITETORCH_UNROLL
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(av[i], bv, acc[i][j]);
    }
  }
  if (p < k) {  // the last k % 8 steps; masked-off lanes read nothing and load 0
    const __m256i mask = lane_mask(k - p);
    __m256 av[MR];
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) av[i] = _mm256_maskload_ps(a + int64_t{i} * lda + p, mask);
    SPRITETORCH_UNROLL
    for (int j = 0; j < NR; ++j) {
      const __m256 bv = _mm256_maskload_ps(b + int64_t{j} * ldb + p, mask);
      SPRITETORCH_UNROLL
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(av[i], bv, acc[i][j]);
    }
  }
  float bias_lanes[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (bias) SPRITETORCH_UNROLL
  for (int j = 0; j < NR; ++j) bias_lanes[j] = bias[j];
  const __m128 bias4 = _mm_loadu_ps(bias_lanes);
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) {
    __m128 sums = _mm_add_ps(lane_sums(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), bias4);
    if (relu) sums = _mm_max_ps(_mm_setzero_ps(), sums);  // max(0, NaN) is NaN in this order
    float* ci = c + int64_t{i} * ldc;
    if (NR == 4) {
      _mm_storeu_ps(ci, sums);
    } else {
      float lanes[4];
      _mm_storeu_ps(lanes, sums);
      SPRITETORCH_UNROLL
      for (int j = 0; j < NR; ++j) ci[j] = lanes[j];
    }
  }
}

using NtBlock = void (*)(int, const float*, int, const float*, int, float*, int, const float*,
                         bool);
constexpr int kNtRows = 3, kNtCols = 4;
constexpr NtBlock kNtBlocks[kNtRows][kNtCols] = {
    {nt_block<1, 1>, nt_block<1, 2>, nt_block<1, 3>, nt_block<1, 4>},
    {nt_block<2, 1>, nt_block<2, 2>, nt_block<2, 3>, nt_block<2, 4>},
    {nt_block<3, 1>, nt_block<3, 2>, nt_block<3, 3>, nt_block<3, 4>},
};

// Columns outside, rows inside: the NR rows of B (4 * k floats: 12.5 KB for k = 784) stay in L1
// while the rows of A stream past them.
SPRITETORCH_AVX2 void nt_avx2(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                              float* c, int ldc, const float* bias, bool relu) {
  for (int j = 0; j < n; j += kNtCols) {
    const int nr = std::min(kNtCols, n - j);
    for (int i = 0; i < m; i += kNtRows) {
      const int mr = std::min(kNtRows, m - i);
      kNtBlocks[mr - 1][nr - 1](k, a + int64_t{i} * lda, lda, b + int64_t{j} * ldb, ldb,
                                c + int64_t{i} * ldc + j, ldc, bias ? bias + j : nullptr, relu);
    }
  }
}

// nn, one MR x (8 NV) block of C: per step of k, NV vectors of B's row times MR broadcast
// elements of A. MR = 4, NV = 3 uses all 16 registers (12 sums, 3 of B, 1 of A). MASKED: the
// last vector holds `last` < 8 columns.
template <int MR, int NV, bool MASKED>
SPRITETORCH_AVX2 void nn_block(int k, const float* a, int a_row, int a_col, const float* b, int ldb,
                               float* c, int ldc, int last) {
  const __m256i mask = lane_mask(last);
  __m256 acc[MR][NV];
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  for (int p = 0; p < k; ++p) {
    const float* bp = b + int64_t{p} * ldb;
    const float* ap = a + int64_t{p} * a_col;
    __m256 bv[NV];
    SPRITETORCH_UNROLL
    for (int v = 0; v < NV; ++v)
      bv[v] = MASKED && v == NV - 1 ? _mm256_maskload_ps(bp + 8 * v, mask)
                                    : _mm256_loadu_ps(bp + 8 * v);
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(ap + int64_t{i} * a_row);
      SPRITETORCH_UNROLL
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) {
    float* ci = c + int64_t{i} * ldc;
    SPRITETORCH_UNROLL
    for (int v = 0; v < NV; ++v) {
      if (MASKED && v == NV - 1)
        _mm256_maskstore_ps(ci + 8 * v, mask, acc[i][v]);
      else
        _mm256_storeu_ps(ci + 8 * v, acc[i][v]);
    }
  }
}

using NnBlock = void (*)(int, const float*, int, int, const float*, int, float*, int, int);
constexpr int kNnRows = 4, kNnVectors = 3;
constexpr NnBlock kNnBlocks[2][kNnRows][kNnVectors] = {
    {{nn_block<1, 1, false>, nn_block<1, 2, false>, nn_block<1, 3, false>},
     {nn_block<2, 1, false>, nn_block<2, 2, false>, nn_block<2, 3, false>},
     {nn_block<3, 1, false>, nn_block<3, 2, false>, nn_block<3, 3, false>},
     {nn_block<4, 1, false>, nn_block<4, 2, false>, nn_block<4, 3, false>}},
    {{nn_block<1, 1, true>, nn_block<1, 2, true>, nn_block<1, 3, true>},
     {nn_block<2, 1, true>, nn_block<2, 2, true>, nn_block<2, 3, true>},
     {nn_block<3, 1, true>, nn_block<3, 2, true>, nn_block<3, 3, true>},
     {nn_block<4, 1, true>, nn_block<4, 2, true>, nn_block<4, 3, true>}},
};

// Columns outside, rows inside: a k x 24 panel of B (6 KB for k = 64) stays in L1 while every
// row block of C is computed from it.
SPRITETORCH_AVX2 void nn_avx2(int m, int n, int k, const float* a, int a_row, int a_col,
                              const float* b, int ldb, float* c, int ldc) {
  constexpr int kPanel = 8 * kNnVectors;
  for (int j = 0; j < n; j += kPanel) {
    const int cols = std::min(kPanel, n - j);
    const int vectors = (cols + 7) / 8;
    const int last = cols - 8 * (vectors - 1);  // columns in the last vector, 1..8
    for (int i = 0; i < m; i += kNnRows) {
      const int mr = std::min(kNnRows, m - i);
      kNnBlocks[last < 8][mr - 1][vectors - 1](k, a + int64_t{i} * a_row, a_row, a_col, b + j, ldb,
                                               c + int64_t{i} * ldc + j, ldc, last);
    }
  }
}

// AVX-512 forms of the two kernels above: 16 lanes, 32 registers, and masked loads and stores
// for every tail (AVX-512's masks suppress faults, so a tail never reads past the operand).
#define SPRITETORCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() (a self-initialised variable) as the
// unused merge source, and -Wuninitialized reports that inside its own headers once inlined
// (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC's name only: clang rejects unknown warning groups under -Werror
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Lanes [0, count) set, count in 0..16.
inline __mmask16 mask16(int count) { return static_cast<__mmask16>((1u << count) - 1u); }

// Lanes 0-3 (and every other group of four) = {sum of v0's lanes, ..., sum of v3's lanes}. All in
// 512-bit registers: GCC 12's 512 -> 256-bit casts trip -Werror=uninitialized in its own headers.
SPRITETORCH_AVX512 inline __m512 lane_sums16(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  // Per 128-bit group: {v0, v1, v0, v1} pair sums, then {v0, v1, v2, v3} sums of its 4 lanes.
  const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
  const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
  const __m512d d01 = _mm512_castps_pd(t01), d23 = _mm512_castps_pd(t23);
  __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d01, d23)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(d01, d23)));
  // The four groups added together.
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0x4E));
  return _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xB1));
}

// nt, one MR x NR block of C (NR <= 4), as nt_block with 16-lane sums. MR = 4, NR = 4: 16 sums,
// 4 rows of A, 1 of B; per 16 steps of k, 8 loads feed 16 FMAs.
template <int MR, int NR>
SPRITETORCH_AVX512 void nt512_block(int k, const float* a, int lda, const float* b, int ldb,
                                    float* c, int ldc, const float* bias, bool relu) {
  __m512 acc[MR][4];
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  int p = 0;
  for (; p + 16 <= k; p += 16) {
    __m512 av[MR];
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) av[i] = _mm512_loadu_ps(a + int64_t{i} * lda + p);
    SPRITETORCH_UNROLL
    for (int j = 0; j < NR; ++j) {
      const __m512 bv = _mm512_loadu_ps(b + int64_t{j} * ldb + p);
      SPRITETORCH_UNROLL
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(av[i], bv, acc[i][j]);
    }
  }
  if (p < k) {  // the last k % 16 steps; masked-off lanes load 0
    const __mmask16 mask = mask16(k - p);
    __m512 av[MR];
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) av[i] = _mm512_maskz_loadu_ps(mask, a + int64_t{i} * lda + p);
    SPRITETORCH_UNROLL
    for (int j = 0; j < NR; ++j) {
      const __m512 bv = _mm512_maskz_loadu_ps(mask, b + int64_t{j} * ldb + p);
      SPRITETORCH_UNROLL
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(av[i], bv, acc[i][j]);
    }
  }
  const __mmask16 cols = mask16(NR);
  const __m512 bias4 = bias ? _mm512_maskz_loadu_ps(cols, bias) : _mm512_setzero_ps();
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) {
    __m512 sums = _mm512_add_ps(lane_sums16(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), bias4);
    if (relu) sums = _mm512_max_ps(_mm512_setzero_ps(), sums);  // max(0, NaN) is NaN this way
    _mm512_mask_storeu_ps(c + int64_t{i} * ldc, cols, sums);
  }
}

constexpr int kNt512Rows = 4, kNt512Cols = 4;

template <size_t... I>
constexpr std::array<NtBlock, sizeof...(I)> nt512_table(std::index_sequence<I...>) {
  return {nt512_block<I / kNt512Cols + 1, I % kNt512Cols + 1>...};
}
constexpr auto kNt512Blocks = nt512_table(std::make_index_sequence<kNt512Rows * kNt512Cols>());

SPRITETORCH_AVX512 void nt_avx512(int m, int n, int k, const float* a, int lda, const float* b,
                                  int ldb, float* c, int ldc, const float* bias, bool relu) {
  for (int j = 0; j < n; j += kNt512Cols) {
    const int nr = std::min(kNt512Cols, n - j);
    for (int i = 0; i < m; i += kNt512Rows) {
      const int mr = std::min(kNt512Rows, m - i);
      kNt512Blocks[(mr - 1) * kNt512Cols + nr - 1](
          k, a + int64_t{i} * lda, lda, b + int64_t{j} * ldb, ldb, c + int64_t{i} * ldc + j, ldc,
          bias ? bias + j : nullptr, relu);
    }
  }
}

// nn, one MR x (16 NV) block of C, as nn_block with 16-lane vectors; the last vector holds
// `last` (1..16) columns, through masks.
template <int MR, int NV>
SPRITETORCH_AVX512 void nn512_block(int k, const float* a, int a_row, int a_col, const float* b,
                                    int ldb, float* c, int ldc, int last) {
  const __mmask16 mask = mask16(last);
  __m512 acc[MR][NV];
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int p = 0; p < k; ++p) {
    const float* bp = b + int64_t{p} * ldb;
    const float* ap = a + int64_t{p} * a_col;
    __m512 bv[NV];
    SPRITETORCH_UNROLL
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm512_loadu_ps(bp + 16 * v);
    bv[NV - 1] = _mm512_maskz_loadu_ps(mask, bp + 16 * (NV - 1));
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(ap[int64_t{i} * a_row]);
      SPRITETORCH_UNROLL
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) {
    float* ci = c + int64_t{i} * ldc;
    SPRITETORCH_UNROLL
    for (int v = 0; v < NV - 1; ++v) _mm512_storeu_ps(ci + 16 * v, acc[i][v]);
    _mm512_mask_storeu_ps(ci + 16 * (NV - 1), mask, acc[i][NV - 1]);
  }
}

constexpr int kNn512Rows = 6, kNn512Vectors = 4;

template <size_t... I>
constexpr std::array<NnBlock, sizeof...(I)> nn512_table(std::index_sequence<I...>) {
  return {nn512_block<I / kNn512Vectors + 1, I % kNn512Vectors + 1>...};
}
constexpr auto kNn512Blocks = nn512_table(std::make_index_sequence<kNn512Rows * kNn512Vectors>());

SPRITETORCH_AVX512 void nn_avx512(int m, int n, int k, const float* a, int a_row, int a_col,
                                  const float* b, int ldb, float* c, int ldc) {
  constexpr int kPanel = 16 * kNn512Vectors;
  for (int j = 0; j < n; j += kPanel) {
    const int cols = std::min(kPanel, n - j);
    const int vectors = (cols + 15) / 16;
    const int last = cols - 16 * (vectors - 1);
    for (int i = 0; i < m; i += kNn512Rows) {
      const int mr = std::min(kNn512Rows, m - i);
      kNn512Blocks[(mr - 1) * kNn512Vectors + vectors - 1](
          k, a + int64_t{i} * a_row, a_row, a_col, b + j, ldb, c + int64_t{i} * ldc + j, ldc, last);
    }
  }
}
#pragma GCC diagnostic pop
#endif

bool cpu_has_avx2() {
#ifdef SPRITETORCH_GEMM_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
#else
  return false;
#endif
}

// The kernel's target features; __builtin_cpu_supports also checks that the OS saves the
// 512-bit state (XCR0), so a kernel or hypervisor that disabled it reads as no AVX-512.
bool cpu_has_avx512() {
#ifdef SPRITETORCH_GEMM_AVX2
  static const bool avx512 = cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  return avx512;
#else
  return false;
#endif
}

void check(Kernel kernel) {
  if (!available(kernel))
    throw Error(std::string("small_gemm: the ") + kernel_name(kernel) + " kernel cannot run here");
}

}  // namespace

bool available(Kernel kernel) {
  switch (kernel) {
    case Kernel::avx2:
      return cpu_has_avx2();
    case Kernel::avx512:
      return cpu_has_avx512();
    case Kernel::blas:
      return blas::has_sgemm();
    case Kernel::loops:
      return true;
  }
  return false;
}

Kernel best_kernel() {
  static const Kernel best = [] {
    if (const char* forced = std::getenv("SPRITETORCH_GEMM_KERNEL"); forced && *forced) {
      for (Kernel k : {Kernel::avx512, Kernel::avx2, Kernel::blas, Kernel::loops})
        if (std::strcmp(forced, kernel_name(k)) == 0) {
          if (!available(k))
            throw Error(std::string("SPRITETORCH_GEMM_KERNEL=") + forced +
                        ": this CPU or build cannot run that kernel");
          return k;
        }
      throw Error(std::string("SPRITETORCH_GEMM_KERNEL=") + forced +
                  ": expected avx512, avx2, blas or loops");
    }
    // AVX-512 first: 1.8-2.1x AVX2's rate on Zen 5 at the step's shapes (docs/benchmarks.md).
    return available(Kernel::avx512) ? Kernel::avx512
           : available(Kernel::avx2) ? Kernel::avx2
           : available(Kernel::blas) ? Kernel::blas
                                     : Kernel::loops;
  }();
  return best;
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::avx2:
      return "avx2";
    case Kernel::avx512:
      return "avx512";
    case Kernel::blas:
      return "blas";
    case Kernel::loops:
      return "loops";
  }
  return "?";
}

void nt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
        const float* bias, bool relu, Kernel kernel) {
  if (m <= 0 || n <= 0) return;
  check(kernel);  // so the avx2 case below is only reached where it was compiled and can run
  if (k <= 0) {   // empty products: A and B may be null, no pointer arithmetic on them
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[int64_t{i} * ldc + j] = finish(0.0f, bias, j, relu);
    return;
  }
  switch (kernel) {
#ifdef SPRITETORCH_GEMM_AVX2
    case Kernel::avx2:
      return nt_avx2(m, n, k, a, lda, b, ldb, c, ldc, bias, relu);
    case Kernel::avx512:
      return nt_avx512(m, n, k, a, lda, b, ldb, c, ldc, bias, relu);
#endif
    case Kernel::blas:
      return nt_blas(m, n, k, a, lda, b, ldb, c, ldc, bias, relu);
    default:
      return nt_loops(m, n, k, a, lda, b, ldb, c, ldc, bias, relu);
  }
}

void nn(int m, int n, int k, const float* a, int a_row, int a_col, const float* b, int ldb,
        float* c, int ldc, Kernel kernel) {
  if (m <= 0 || n <= 0) return;
  check(kernel);
  if (k <= 0) {  // empty products: A and B may be null
    for (int i = 0; i < m; ++i) std::fill_n(c + int64_t{i} * ldc, n, 0.0f);
    return;
  }
  switch (kernel) {
#ifdef SPRITETORCH_GEMM_AVX2
    case Kernel::avx2:
      return nn_avx2(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    case Kernel::avx512:
      return nn_avx512(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
#endif
    case Kernel::blas:
      return nn_blas(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    default:
      return nn_loops(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
  }
}

}  // namespace spritetorch::gemm
