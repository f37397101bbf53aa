#include "common/bf16_gemm.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/error.h"

namespace spritetorch::bf16 {

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  // vcvtne2ps2bf16 reads subnormal floats as zero; so does this, so both forms give one value.
  if ((bits & 0x7f800000u) == 0) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float to_float(uint16_t value) {
  const uint32_t bits = uint32_t{value} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPRITETORCH_BF16_KERNELS 1
#define SPRITETORCH_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// Loops over a block's registers, unrolled before GCC decides what lives in memory: without it
// the accumulators went to the stack on every step (as in common/small_gemm.cpp).
#define SPRITETORCH_UNROLL _Pragma("GCC unroll 16")
// GCC 12's AVX-512 headers trip -Wuninitialized once inlined (see common/small_gemm.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

// 16 lanes: all, or the first `count` (count < 16).
inline __mmask16 lanes16(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1);
}

SPRITETORCH_BF16 inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }
SPRITETORCH_BF16 inline __m512i as_si(__m512bh v) { return reinterpret_cast<__m512i>(v); }

// An R x (16 V) block of a product summed over pairs: each step broadcasts one pair of A per row
// (row i's pair q at a + 2 (q a_q + i a_i)) and multiplies it into V vectors of 16 pairs of B
// (b + 2 (q ldb + j)); `last` masks the last vector's columns; then + bias, ReLU.
template <int R, int V>
SPRITETORCH_BF16 void pair_block(int pairs, const uint16_t* a, int64_t a_q, int64_t a_i,
                                 const uint16_t* b, int ldb, float* c, int ldc, __mmask16 last,
                                 const float* bias, bool relu) {
  __m512 acc[R][V];
  SPRITETORCH_UNROLL
  for (int r = 0; r < R; ++r) SPRITETORCH_UNROLL
  for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int q = 0; q < pairs; ++q) {
    const uint16_t* bq = b + int64_t{q} * ldb * 2;
    const uint16_t* aq = a + q * a_q * 2;
    __m512bh bv[V];
    SPRITETORCH_UNROLL
    for (int v = 0; v < V; ++v)
      bv[v] = as_bh(
          _mm512_maskz_loadu_epi32(v + 1 < V ? static_cast<__mmask16>(0xffff) : last, bq + 32 * v));
    SPRITETORCH_UNROLL
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, aq + r * a_i * 2, 4);
      const __m512bh av = as_bh(_mm512_set1_epi32(pair));
      SPRITETORCH_UNROLL
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  SPRITETORCH_UNROLL
  for (int v = 0; v < V; ++v) {
    const __mmask16 mask = v + 1 < V ? static_cast<__mmask16>(0xffff) : last;
    const __m512 bias_v = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * v) : zero;
    SPRITETORCH_UNROLL
    for (int r = 0; r < R; ++r) {
      __m512 out = _mm512_add_ps(acc[r][v], bias_v);
      // ReLU as torch's clamp_min(0): lanes below 0 become 0, NaN stays.
      if (relu) out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(out, zero, _CMP_LT_OQ), zero);
      _mm512_mask_storeu_ps(c + int64_t{r} * ldc + 16 * v, mask, out);
    }
  }
}

using PairBlock = void (*)(int, const uint16_t*, int64_t, int64_t, const uint16_t*, int, float*,
                           int, __mmask16, const float*, bool);

// [R - 1][V - 1]: the block kernels for every edge size.
const PairBlock kPair[4][4] = {
    {pair_block<1, 1>, pair_block<1, 2>, pair_block<1, 3>, pair_block<1, 4>},
    {pair_block<2, 1>, pair_block<2, 2>, pair_block<2, 3>, pair_block<2, 4>},
    {pair_block<3, 1>, pair_block<3, 2>, pair_block<3, 3>, pair_block<3, 4>},
    {pair_block<4, 1>, pair_block<4, 2>, pair_block<4, 3>, pair_block<4, 4>}};

// C (m x n) over `pairs` pairs: A's pair (q, i) at a + 2 (q a_q + i a_i), B's (q, j) at
// b + 2 (q ldb + j); blocks of 4 rows x 64 columns.
SPRITETORCH_BF16 void pair_product(int m, int n, int pairs, const uint16_t* a, int64_t a_q,
                                   int64_t a_i, const uint16_t* b, int ldb, float* c, int ldc,
                                   const float* bias, bool relu) {
  for (int j = 0; j < n; j += 64) {
    const int cols = n - j < 64 ? n - j : 64;
    const int v = (cols + 15) / 16;
    const __mmask16 last = lanes16(cols - 16 * (v - 1));
    for (int i = 0; i < m; i += 4) {
      const int r = m - i < 4 ? m - i : 4;
      kPair[r - 1][v - 1](pairs, a + i * a_i * 2, a_q, a_i, b + int64_t{j} * 2, ldb,
                          c + int64_t{i} * ldc + j, ldc, last, bias ? bias + j : nullptr, relu);
    }
  }
}

// 16-bit lane 2j takes lane j (row 2q's column j), lane 2j + 1 takes lane 16 + j (row 2q + 1's).
alignas(64) constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                  21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                  11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

SPRITETORCH_BF16 void pack_row_pairs_avx512(const float* src, int rows, int cols, int ld,
                                            uint16_t* out, uint16_t* rows_out) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const int row_ld = cols + (cols & 1);  // rows_out's rows: even, for nt_pairs's pairs
  for (int q = 0; q < (rows + 1) / 2; ++q) {
    const float* r0 = src + int64_t{2 * q} * ld;
    const float* r1 = 2 * q + 1 < rows ? r0 + ld : nullptr;
    uint16_t* o = out + int64_t{q} * cols * 2;
    for (int j = 0; j < cols; j += 16) {
      const int count = cols - j < 16 ? cols - j : 16;
      const __mmask16 mask = lanes16(count);
      const __m512 v0 = _mm512_maskz_loadu_ps(mask, r0 + j);
      const __m512 v1 = r1 ? _mm512_maskz_loadu_ps(mask, r1 + j) : _mm512_setzero_ps();
      const __m512i both = as_si(_mm512_cvtne2ps_pbh(v1, v0));  // lanes 0-15 row 2q, 16-31 2q + 1
      const __m512i pairs = _mm512_permutexvar_epi16(interleave, both);
      const __mmask32 out_mask =
          count == 16 ? static_cast<__mmask32>(~0u) : static_cast<__mmask32>((1u << 2 * count) - 1);
      _mm512_mask_storeu_epi16(o + int64_t{j} * 2, out_mask, pairs);
      if (rows_out) {
        uint16_t* row0 = rows_out + int64_t{2 * q} * row_ld + j;
        _mm256_mask_storeu_epi16(row0, mask, _mm512_castsi512_si256(both));
        if (r1) _mm256_mask_storeu_epi16(row0 + row_ld, mask, _mm512_extracti64x4_epi64(both, 1));
      }
    }
    if (rows_out && row_ld != cols) {
      rows_out[int64_t{2 * q} * row_ld + cols] = 0;
      if (r1) rows_out[int64_t{2 * q + 1} * row_ld + cols] = 0;
    }
  }
}

// 16 x 16 32-bit transpose in registers: rows[i] lane l -> rows[l] lane i.
SPRITETORCH_BF16 void transpose16(__m512i rows[16]) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(rows[2 * k], rows[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(rows[2 * k], rows[2 * k + 1]);
  }
  for (int k = 0; k < 16; k += 4) {
    u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
    u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
    u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 16; k += 8)
    for (int c = 0; c < 4; ++c) {
      t[k + c] = _mm512_shuffle_i32x4(u[k + c], u[k + 4 + c], 0x88);
      t[k + 4 + c] = _mm512_shuffle_i32x4(u[k + c], u[k + 4 + c], 0xdd);
    }
  for (int c = 0; c < 8; ++c) {
    rows[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    rows[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
  }
}

// Pairs of neighbouring columns: each row's 32 columns become 16 pairs (one 32-bit lane each),
// and a 16 x 16 transpose of those lanes puts 16 rows of one pair side by side.
SPRITETORCH_BF16 void pack_col_pairs_avx512(const float* src, int rows, int cols, int ld,
                                            uint16_t* out) {
  const int pairs = (cols + 1) / 2;
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int row_count = rows - r0 < 16 ? rows - r0 : 16;
    for (int q0 = 0; q0 < pairs; q0 += 16) {
      const int col0 = 2 * q0;
      const int col_count = cols - col0 < 32 ? cols - col0 : 32;
      const __mmask16 lo = lanes16(col_count), hi = lanes16(col_count > 16 ? col_count - 16 : 0);
      __m512i block[16];
      for (int r = 0; r < 16; ++r) {
        if (r >= row_count) {
          block[r] = _mm512_setzero_si512();
          continue;
        }
        const float* row = src + int64_t{r0 + r} * ld + col0;
        block[r] = as_si(_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, row + 16),
                                             _mm512_maskz_loadu_ps(lo, row)));
      }
      transpose16(block);
      const int pair_count = pairs - q0 < 16 ? pairs - q0 : 16;
      for (int l = 0; l < pair_count; ++l)
        _mm512_mask_storeu_epi32(out + (int64_t{q0 + l} * rows + r0) * 2, lanes16(row_count),
                                 block[l]);
    }
  }
}

}  // namespace

bool available() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return yes;
}
#else
bool available() { return false; }
#endif

namespace {
void check() {
  if (!available()) throw Error("bf16 kernels: this CPU has no AVX512_BF16");
}
}  // namespace

void pack_row_pairs(const float* src, int rows, int cols, int ld, uint16_t* out,
                    uint16_t* rows_out) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  pack_row_pairs_avx512(src, rows, cols, ld, out, rows_out);
#endif
}

void tn(int m, int n, int pairs, const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c,
        int ldc) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  pair_product(m, n, pairs, a, lda, 1, b, ldb, c, ldc, nullptr, false);
#endif
}

void nt_pairs(int m, int n, int k, const uint16_t* a, int lda, const uint16_t* b_pairs, int ldb,
              float* c, int ldc, const float* bias, bool relu) {
  check();
  if (lda % 2 != 0 || lda < k) throw Error("bf16::nt_pairs: A's row stride must be even and >= k");
#ifdef SPRITETORCH_BF16_KERNELS
  pair_product(m, n, (k + 1) / 2, a, 1, lda / 2, b_pairs, ldb, c, ldc, bias, relu);
#endif
}

void pack_col_pairs(const float* src, int rows, int cols, int ld, uint16_t* out) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  pack_col_pairs_avx512(src, rows, cols, ld, out);
#endif
}

}  // namespace spritetorch::bf16
