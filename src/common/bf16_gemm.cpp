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

// The layer's epilogue on one value, as small_gemm's: + bias, then ReLU (NaN stays NaN).
inline float finish(float v, const float* bias, int j, bool relu) {
  if (bias) v += bias[j];
  return relu && v < 0.0f ? 0.0f : v;
}

// An R x S block of C = A B^T: one 16-lane sum per output, 32 products of pairs along k a step,
// the k tail by masked loads (zeros beyond k), then each sum reduced across its lanes.
template <int R, int S>
SPRITETORCH_BF16 void nt_block(int k, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                               float* c, int ldc, const float* bias, bool relu) {
  __m512 acc[R][S];
  SPRITETORCH_UNROLL
  for (int r = 0; r < R; ++r) SPRITETORCH_UNROLL
  for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  for (int p = 0; p < k; p += 32) {
    const __mmask32 mask =
        k - p >= 32 ? static_cast<__mmask32>(~0u) : static_cast<__mmask32>((1u << (k - p)) - 1);
    __m512bh av[R];
    SPRITETORCH_UNROLL
    for (int r = 0; r < R; ++r)
      av[r] = as_bh(_mm512_maskz_loadu_epi16(mask, a + int64_t{r} * lda + p));
    SPRITETORCH_UNROLL
    for (int s = 0; s < S; ++s) {
      const __m512bh bv = as_bh(_mm512_maskz_loadu_epi16(mask, b + int64_t{s} * ldb + p));
      SPRITETORCH_UNROLL
      for (int r = 0; r < R; ++r) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], av[r], bv);
    }
  }
  SPRITETORCH_UNROLL
  for (int r = 0; r < R; ++r) SPRITETORCH_UNROLL
  for (int s = 0; s < S; ++s)
    c[int64_t{r} * ldc + s] = finish(_mm512_reduce_add_ps(acc[r][s]), bias, s, relu);
}

// An R x (16 V) block of C = A^T B over the pair layout: each step broadcasts one pair of A per
// row and multiplies it into V vectors of 16 pairs of B; `last` masks the last vector's columns.
template <int R, int V>
SPRITETORCH_BF16 void tn_block(int pairs, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                               float* c, int ldc, __mmask16 last) {
  __m512 acc[R][V];
  SPRITETORCH_UNROLL
  for (int r = 0; r < R; ++r) SPRITETORCH_UNROLL
  for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int q = 0; q < pairs; ++q) {
    const uint16_t* bq = b + int64_t{q} * ldb * 2;
    const uint16_t* aq = a + int64_t{q} * lda * 2;
    __m512bh bv[V];
    SPRITETORCH_UNROLL
    for (int v = 0; v < V; ++v)
      bv[v] = as_bh(
          _mm512_maskz_loadu_epi32(v + 1 < V ? static_cast<__mmask16>(0xffff) : last, bq + 32 * v));
    SPRITETORCH_UNROLL
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, aq + 2 * r, 4);
      const __m512bh av = as_bh(_mm512_set1_epi32(pair));
      SPRITETORCH_UNROLL
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  SPRITETORCH_UNROLL
  for (int r = 0; r < R; ++r) SPRITETORCH_UNROLL
  for (int v = 0; v < V; ++v)
    _mm512_mask_storeu_ps(c + int64_t{r} * ldc + 16 * v,
                          v + 1 < V ? static_cast<__mmask16>(0xffff) : last, acc[r][v]);
}

using NtBlock = void (*)(int, const uint16_t*, int, const uint16_t*, int, float*, int, const float*,
                         bool);
using TnBlock = void (*)(int, const uint16_t*, int, const uint16_t*, int, float*, int, __mmask16);

// [R - 1][S - 1] (nt) and [R - 1][V - 1] (tn): the block kernels for every edge size.
const NtBlock kNt[4][4] = {{nt_block<1, 1>, nt_block<1, 2>, nt_block<1, 3>, nt_block<1, 4>},
                           {nt_block<2, 1>, nt_block<2, 2>, nt_block<2, 3>, nt_block<2, 4>},
                           {nt_block<3, 1>, nt_block<3, 2>, nt_block<3, 3>, nt_block<3, 4>},
                           {nt_block<4, 1>, nt_block<4, 2>, nt_block<4, 3>, nt_block<4, 4>}};
const TnBlock kTn[4][4] = {{tn_block<1, 1>, tn_block<1, 2>, tn_block<1, 3>, tn_block<1, 4>},
                           {tn_block<2, 1>, tn_block<2, 2>, tn_block<2, 3>, tn_block<2, 4>},
                           {tn_block<3, 1>, tn_block<3, 2>, tn_block<3, 3>, tn_block<3, 4>},
                           {tn_block<4, 1>, tn_block<4, 2>, tn_block<4, 3>, tn_block<4, 4>}};

SPRITETORCH_BF16 void round_floats_avx512(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + i + 16), _mm512_loadu_ps(in + i));
    _mm512_storeu_si512(out + i, as_si(v));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    const __m512bh v = _mm512_cvtne2ps_pbh(
        _mm512_maskz_loadu_ps(lanes16(rest - 16 < 0 ? 0 : rest - 16), in + i + 16),
        _mm512_maskz_loadu_ps(lanes16(rest), in + i));
    _mm512_mask_storeu_epi16(out + i, static_cast<__mmask32>((1u << rest) - 1), as_si(v));
  }
}

// 16-bit lane 2j takes lane j (row 2q's column j), lane 2j + 1 takes lane 16 + j (row 2q + 1's).
alignas(64) constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                  21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                  11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

SPRITETORCH_BF16 void pack_row_pairs_avx512(const float* src, int rows, int cols, int ld,
                                            uint16_t* out, uint16_t* rows_out) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
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
        uint16_t* row0 = rows_out + int64_t{2 * q} * cols + j;
        _mm256_mask_storeu_epi16(row0, mask, _mm512_castsi512_si256(both));
        if (r1) _mm256_mask_storeu_epi16(row0 + cols, mask, _mm512_extracti64x4_epi64(both, 1));
      }
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

void round_floats(const float* in, uint16_t* out, int64_t n) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  round_floats_avx512(in, out, n);
#endif
}

void pack_row_pairs(const float* src, int rows, int cols, int ld, uint16_t* out,
                    uint16_t* rows_out) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  pack_row_pairs_avx512(src, rows, cols, ld, out, rows_out);
#endif
}

void nt(int m, int n, int k, const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c,
        int ldc, const float* bias, bool relu) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  for (int j = 0; j < n; j += 4) {
    const int s = n - j < 4 ? n - j : 4;
    for (int i = 0; i < m; i += 4) {
      const int r = m - i < 4 ? m - i : 4;
      kNt[r - 1][s - 1](k, a + int64_t{i} * lda, lda, b + int64_t{j} * ldb, ldb,
                        c + int64_t{i} * ldc + j, ldc, bias ? bias + j : nullptr, relu);
    }
  }
#endif
}

void tn(int m, int n, int pairs, const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c,
        int ldc) {
  check();
#ifdef SPRITETORCH_BF16_KERNELS
  for (int j = 0; j < n; j += 64) {
    const int cols = n - j < 64 ? n - j : 64;
    const int v = (cols + 15) / 16;
    const __mmask16 last = lanes16(cols - 16 * (v - 1));
    for (int i = 0; i < m; i += 4) {
      const int r = m - i < 4 ? m - i : 4;
      kTn[r - 1][v - 1](pairs, a + int64_t{i} * 2, lda, b + int64_t{j} * 2, ldb,
                        c + int64_t{i} * ldc + j, ldc, last);
    }
  }
#endif
}

}  // namespace spritetorch::bf16
