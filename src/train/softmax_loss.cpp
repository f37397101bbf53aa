#include "train/softmax_loss.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/avx512_diagnostics.h"

namespace spritetorch::train {

namespace {

// Every row: the first maximum, log of the sum of the exponentials shifted by it, and each
// probability as exp(logit - that log): the arithmetic of torch's log_softmax and its backward.
SoftmaxLossSums softmax_cross_entropy_loop(const float* logits, const int64_t* labels, int rows,
                                           int classes, float grad_scale, float* dz) {
  SoftmaxLossSums sums;
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + int64_t{r} * classes;
    float* d = dz + int64_t{r} * classes;
    int best = 0;
    for (int k = 1; k < classes; ++k)
      if (row[k] > row[best]) best = k;  // the first maximum, as torch's argmax
    const float max = row[best];
    float sum = 0.0f;
    for (int k = 0; k < classes; ++k) sum += std::exp(row[k] - max);
    const float log_sum = max + std::log(sum);
    const int64_t label = labels[r];
    sums.loss += static_cast<double>(log_sum - row[label]);
    sums.correct += best == label;
    for (int k = 0; k < classes; ++k) d[k] = std::exp(row[k] - log_sum) * grad_scale;
    d[label] -= grad_scale;
  }
  return sums;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPRITETORCH_SOFTMAX_AVX512 1
SPRITETORCH_AVX512_DIAGNOSTICS_BEGIN

// exp(x) for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r keeps its bits),
// e^r from its Taylor series to r^7 (the first term left out is < 6e-9 of e^r there), and 2^n
// applied exactly by scalef. Below -104 the result is below the smallest subnormal: 0, as
// std::exp's. NaN stays NaN (max returns its second operand when either is NaN).
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2's leading bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860676533018672e-6f), r);    // and the rest
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The loop's arithmetic, one row of up to 16 classes per vector; the lanes past `classes` are -inf
// for the maximum and left out of the sum.
__attribute__((target("avx512f"))) SoftmaxLossSums softmax_cross_entropy_avx512(
    const float* logits, const int64_t* labels, int rows, int classes, float grad_scale,
    float* dz) {
  SoftmaxLossSums sums;
  const __mmask16 lanes = static_cast<__mmask16>((1u << classes) - 1u);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + int64_t{r} * classes;
    float* d = dz + int64_t{r} * classes;
    const __m512 l = _mm512_mask_loadu_ps(minus_inf, lanes, row);
    const float max = _mm512_mask_reduce_max_ps(lanes, l);
    const __m512 max_v = _mm512_set1_ps(max);
    // The first lane equal to the maximum (none where a NaN made the maximum NaN: lane 0).
    const unsigned at_max = _mm512_mask_cmp_ps_mask(lanes, l, max_v, _CMP_EQ_OQ);
    const int best = at_max != 0 ? __builtin_ctz(at_max) : 0;
    const float sum = _mm512_mask_reduce_add_ps(lanes, exp16(_mm512_sub_ps(l, max_v)));
    const float log_sum = max + std::log(sum);
    const int64_t label = labels[r];
    sums.loss += static_cast<double>(log_sum - row[label]);
    sums.correct += best == label;
    const __m512 p = exp16(_mm512_sub_ps(l, _mm512_set1_ps(log_sum)));
    _mm512_mask_storeu_ps(d, lanes, _mm512_mul_ps(p, _mm512_set1_ps(grad_scale)));
    d[label] -= grad_scale;
  }
  return sums;
}
SPRITETORCH_AVX512_DIAGNOSTICS_END
#endif

}  // namespace

SoftmaxLossSums softmax_cross_entropy(const float* logits, const int64_t* labels, int rows,
                                      int classes, float grad_scale, float* dz,
                                      gemm::Kernel kernel) {
#ifdef SPRITETORCH_SOFTMAX_AVX512
  if (kernel == gemm::Kernel::avx512 && classes >= 1 && classes <= 16 &&
      gemm::available(gemm::Kernel::avx512))
    return softmax_cross_entropy_avx512(logits, labels, rows, classes, grad_scale, dz);
#else
  (void)kernel;
#endif
  return softmax_cross_entropy_loop(logits, labels, rows, classes, grad_scale, dz);
}

}  // namespace spritetorch::train
