#include "train/adam_kernels.h"

#include <cfloat>
#include <cmath>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "common/avx512_diagnostics.h"
#include "common/flush_subnormals.h"

namespace spritetorch::train {

namespace {

void adam_update_loop(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                      const AdamScalars& k) {
  for (int64_t i = begin; i < end; ++i) {
    const float gi = k.l2 != 0.0f ? g[i] + k.l2 * p[i] : g[i];  // no 0 * inf = NaN without decay
    p[i] *= k.decay;
    const float mi = m[i] * k.b1 + k.one_minus_b1 * gi;
    const float vi = v[i] * k.b2 + k.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] += k.neg_step * mi / (std::sqrt(vi) * k.inv_bias2_sqrt + k.eps);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPRITETORCH_ADAM_SIMD 1
// How far ahead the kernels claim the parameters' lines for writing (prefetchw): the fused step's
// later layers are read by every thread, and a store to a line the other core holds waits for its
// copy to be invalidated, one line at a time unless claimed ahead. `small_gemm_bench
// --benchmark_filter=adam_shared` times it (a step thread's half of the seed's W_2, 256 lines, on
// the Zen 5 VM: AVX-512 9.7 us without the claim, 2.9-3.5 us with it).
constexpr int64_t kClaimAhead = 256;  // floats: 16 cache lines

// Whether the CPU has PREFETCHW (CPUID 0x80000001, ECX bit 8): every AVX-512 CPU does; of the
// AVX2 ones, AMD's and Intel's from Broadwell on, not Haswell's.
bool cpu_has_prefetchw() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 8)) != 0;
}

struct Lanes8 {
  __m256 p, m, v;  // the updated parameter and moments
};

// The update's scalars in 8 lanes, made once per call: read through the AdamScalars reference
// inside the loop they were loaded again every iteration (a store to p, m or v may alias them).
struct AdamLanes8 {
  __m256 b1, b2, c1, c2, scale, eps, neg_step, tiny, half, three_halves, two, l2, decay;
  bool with_l2;
  __attribute__((target("avx2"))) explicit AdamLanes8(const AdamScalars& k)
      : b1(_mm256_set1_ps(k.b1)),
        b2(_mm256_set1_ps(k.b2)),
        c1(_mm256_set1_ps(k.one_minus_b1)),
        c2(_mm256_set1_ps(k.one_minus_b2)),
        scale(_mm256_set1_ps(k.inv_bias2_sqrt)),
        eps(_mm256_set1_ps(k.eps)),
        neg_step(_mm256_set1_ps(k.neg_step)),
        tiny(_mm256_set1_ps(FLT_MIN)),
        half(_mm256_set1_ps(0.5f)),
        three_halves(_mm256_set1_ps(1.5f)),
        two(_mm256_set1_ps(2.0f)),
        l2(_mm256_set1_ps(k.l2)),
        decay(_mm256_set1_ps(k.decay)),
        with_l2(k.l2 != 0.0f) {}
};

// One Adam update of 8 lanes: the whole vectors and the tail's masked ones take this same
// arithmetic, so a lane's result does not depend on where a thread's range starts or ends.
__attribute__((target("avx2,fma"), always_inline)) inline Lanes8 adam_lanes_avx2(
    __m256 pi, __m256 graw, __m256 m_old, __m256 v_old, const AdamLanes8& k) {
  const __m256 gi = k.with_l2 ? _mm256_fmadd_ps(k.l2, pi, graw) : graw;
  const __m256 mi = _mm256_add_ps(_mm256_mul_ps(m_old, k.b1), _mm256_mul_ps(k.c1, gi));
  const __m256 vi =
      _mm256_add_ps(_mm256_mul_ps(v_old, k.b2), _mm256_mul_ps(_mm256_mul_ps(k.c2, gi), gi));
  // sqrt(v) = v / sqrt(v) = v * rsqrt(v); v = 0 gives 0 (rsqrt of FLT_MIN is finite).
  const __m256 vc = _mm256_max_ps(vi, k.tiny);
  __m256 r = _mm256_rsqrt_ps(vc);
  r = _mm256_mul_ps(
      r, _mm256_fnmadd_ps(_mm256_mul_ps(k.half, vc), _mm256_mul_ps(r, r), k.three_halves));
  const __m256 denom = _mm256_fmadd_ps(_mm256_mul_ps(vi, r), k.scale, k.eps);
  __m256 q = _mm256_rcp_ps(denom);
  q = _mm256_mul_ps(q, _mm256_fnmadd_ps(denom, q, k.two));
  const __m256 p_new =
      _mm256_fmadd_ps(_mm256_mul_ps(k.neg_step, mi), q, _mm256_mul_ps(pi, k.decay));
  return {p_new, mi, vi};
}

// The same update, 8 lanes at a time. The square root and the division were the loop's whole
// cost (on Zen 2 each takes ~14 cycles per 8 lanes); the hardware estimates of 1/sqrt and 1/x,
// refined by one Newton step each, are within a few float ulps of them (tests compare every kernel
// with the loop, and the optimizer with torch.optim.Adam's arithmetic). kClaim: with prefetchw,
// only for a CPU that has it. The tail runs under a mask, not through the loop: the loop's exact
// square root and division round differently from the estimates, so a loop tail made an update's
// result depend on how the threads split the parameters (FlatOptimizer's shares, --step-threads).
template <bool kClaim>
__attribute__((target("avx2,fma,prfchw"))) void adam_update_avx2(float* p, const float* g, float* m,
                                                                 float* v, int64_t begin,
                                                                 int64_t end,
                                                                 const AdamScalars& scalars) {
  const AdamLanes8 k(scalars);
  const __m256i lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = begin; i < end; i += 8) {
    // One claim per line: every other 8 floats (a 64-byte line holds 16).
    if (kClaim && ((i - begin) & 8) == 0 && end - i > kClaimAhead)
      __builtin_prefetch(p + i + kClaimAhead, /*rw=*/1, 3);
    const int64_t left = end - i;
    if (left < 8) {  // the tail: the same arithmetic under a mask (masked-off lanes read as 0)
      const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(left)), lane_index);
      const Lanes8 out =
          adam_lanes_avx2(_mm256_maskload_ps(p + i, lanes), _mm256_maskload_ps(g + i, lanes),
                          _mm256_maskload_ps(m + i, lanes), _mm256_maskload_ps(v + i, lanes), k);
      _mm256_maskstore_ps(m + i, lanes, out.m);
      _mm256_maskstore_ps(v + i, lanes, out.v);
      _mm256_maskstore_ps(p + i, lanes, out.p);
      break;
    }
    const Lanes8 out = adam_lanes_avx2(_mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i),
                                       _mm256_loadu_ps(m + i), _mm256_loadu_ps(v + i), k);
    _mm256_storeu_ps(m + i, out.m);
    _mm256_storeu_ps(v + i, out.v);
    _mm256_storeu_ps(p + i, out.p);
  }
}

// 16 lanes, the tail under a mask. AVX-512's estimates are good to 14 bits (AVX's to 12), so one
// Newton step brings them to float precision as well. The lines are always claimed ahead: every
// AVX-512 CPU has prefetchw. The moments and the gradient are asked for as far ahead: in the fused
// step they come from L3 each time (a step thread's ~1.2 MB outgrows a Zen 5 core's 1 MB L2),
// and the hardware's prefetch did not keep four streams ahead (docs/benchmarks.md: a step
// thread's update 16.5-17 us without, 13-14 us with, on the Zen 5 VM).
SPRITETORCH_AVX512_DIAGNOSTICS_BEGIN
__attribute__((target("avx512f,prfchw"))) void adam_update_avx512(float* p, const float* g,
                                                                  float* m, float* v, int64_t begin,
                                                                  int64_t end,
                                                                  const AdamScalars& k) {
  const __m512 b1 = _mm512_set1_ps(k.b1), b2 = _mm512_set1_ps(k.b2);
  const __m512 c1 = _mm512_set1_ps(k.one_minus_b1), c2 = _mm512_set1_ps(k.one_minus_b2);
  const __m512 scale = _mm512_set1_ps(k.inv_bias2_sqrt), eps = _mm512_set1_ps(k.eps);
  const __m512 neg_step = _mm512_set1_ps(k.neg_step), tiny = _mm512_set1_ps(FLT_MIN);
  const __m512 half = _mm512_set1_ps(0.5f), three_halves = _mm512_set1_ps(1.5f);
  const __m512 two = _mm512_set1_ps(2.0f);
  const __m512 l2 = _mm512_set1_ps(k.l2), decay = _mm512_set1_ps(k.decay);
  const bool with_l2 = k.l2 != 0.0f;
  for (int64_t i = begin; i < end; i += 16) {
    const int64_t left = end - i;
    const __mmask16 lanes = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    if (left > kClaimAhead) {  // one line of each per iteration
      __builtin_prefetch(p + i + kClaimAhead, /*rw=*/1, 3);
      __builtin_prefetch(m + i + kClaimAhead, /*rw=*/1, 3);
      __builtin_prefetch(v + i + kClaimAhead, /*rw=*/1, 3);
      __builtin_prefetch(g + i + kClaimAhead, /*rw=*/0, 3);
    }
    const __m512 pi = _mm512_maskz_loadu_ps(lanes, p + i);
    const __m512 graw = _mm512_maskz_loadu_ps(lanes, g + i);
    const __m512 gi = with_l2 ? _mm512_fmadd_ps(l2, pi, graw) : graw;
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, m + i), b1),
                                    _mm512_mul_ps(c1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, v + i), b2),
                                    _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    _mm512_mask_storeu_ps(m + i, lanes, mi);
    _mm512_mask_storeu_ps(v + i, lanes, vi);
    const __m512 vc = _mm512_max_ps(vi, tiny);
    __m512 r = _mm512_rsqrt14_ps(vc);
    r = _mm512_mul_ps(r,
                      _mm512_fnmadd_ps(_mm512_mul_ps(half, vc), _mm512_mul_ps(r, r), three_halves));
    const __m512 denom = _mm512_fmadd_ps(_mm512_mul_ps(vi, r), scale, eps);
    __m512 q = _mm512_rcp14_ps(denom);
    q = _mm512_mul_ps(q, _mm512_fnmadd_ps(denom, q, two));
    _mm512_mask_storeu_ps(
        p + i, lanes, _mm512_fmadd_ps(_mm512_mul_ps(neg_step, mi), q, _mm512_mul_ps(pi, decay)));
  }
}
SPRITETORCH_AVX512_DIAGNOSTICS_END
#endif

enum class AdamKernel { avx512, avx2, loops };

AdamKernel adam_kernel_for(gemm::Kernel kernel) {
#ifdef SPRITETORCH_ADAM_SIMD
  if (kernel == gemm::Kernel::avx512 && gemm::available(gemm::Kernel::avx512))
    return AdamKernel::avx512;
  if (kernel != gemm::Kernel::loops && gemm::available(gemm::Kernel::avx2)) return AdamKernel::avx2;
#else
  (void)kernel;
#endif
  return AdamKernel::loops;
}

}  // namespace

void adam_update(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                 const AdamScalars& k, gemm::Kernel kernel) {
  // Subnormal moments cost Intel cores ~5x (common/flush_subnormals.h). Every kernel, the loop
  // included, so they agree on subnormals too.
  const FlushSubnormals flush;
  switch (adam_kernel_for(kernel)) {
#ifdef SPRITETORCH_ADAM_SIMD
    case AdamKernel::avx512:
      return adam_update_avx512(p, g, m, v, begin, end, k);
    case AdamKernel::avx2: {
      static const bool claim = cpu_has_prefetchw();
      return claim ? adam_update_avx2<true>(p, g, m, v, begin, end, k)
                   : adam_update_avx2<false>(p, g, m, v, begin, end, k);
    }
#endif
    default:
      return adam_update_loop(p, g, m, v, begin, end, k);
  }
}

const char* adam_kernel_name(gemm::Kernel kernel) {
  switch (adam_kernel_for(kernel)) {
    case AdamKernel::avx512:
      return "avx512";
    case AdamKernel::avx2:
      return "avx2";
    default:
      return "loops";
  }
}

}  // namespace spritetorch::train
