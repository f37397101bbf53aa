#include "models/bn_relu_pool.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPRITETORCH_BN_POOL_X86 1
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/compat.h"
#include "common/environment_switch.h"
#include "common/error.h"

namespace spritetorch::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- Elements: fp32, or bf16 kept as its 16 bits (the upper half of an fp32) -------------------

struct Fp32 {
  using Stored = float;
  static float load(const float* p, int64_t i) { return p[i]; }
  static void store(float* p, int64_t i, float v) { p[i] = v; }
};

struct Bf16 {
  using Stored = uint16_t;
  static float load(const uint16_t* p, int64_t i) {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  // Round to nearest even, as c10::BFloat16 does; NaN stays NaN.
  static void store(uint16_t* p, int64_t i, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    p[i] = v != v ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
  }
};

// Which of a pool window's four inputs won: row-major (0 top left .. 3 bottom right), or none
// when the window's maximum was cut by ReLU (its gradient is zero).
constexpr uint8_t kCut = 255;

struct Plane {
  int64_t height, width, out_height, out_width;
  int64_t pixels() const { return height * width; }
  int64_t outputs() const { return out_height * out_width; }
};

// The loops below are written for the compiler to vectorise (fixed-width partial sums instead of
// one float accumulator, no branches in the inner loops); each code path compiles them for its
// instruction set (the `always_inline` bodies take the caller's target).
#define SPRITETORCH_INLINE inline __attribute__((always_inline))
constexpr int kLanes = 16;

// Sum and sum of squares of (x - shift) over n values, into double.
template <class E>
SPRITETORCH_INLINE void sums(const typename E::Stored* x, int64_t n, float shift, double& sum,
                             double& squares) {
  float s[kLanes] = {}, q[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float v = E::load(x, i + l) - shift;
      s[l] += v;
      q[l] += v * v;
    }
  double total = 0, total_squares = 0;
  for (; i < n; ++i) {
    const float v = E::load(x, i) - shift;
    total += v;
    total_squares += static_cast<double>(v) * v;
  }
  for (int l = 0; l < kLanes; ++l) {
    total += s[l];
    total_squares += q[l];
  }
  sum += total;
  squares += total_squares;
}

// One plane's forward: z = a x + d, then the 2x2 maximum of z, then ReLU; `won` records the
// window's winner as LibTorch's max-pool picks it (the first maximum in row-major order).
template <class E>
SPRITETORCH_INLINE void loops_pool_plane(const typename E::Stored* x, typename E::Stored* y,
                                         uint8_t* won, const Plane& p, float a, float d) {
  for (int64_t r = 0; r < p.out_height; ++r) {
    const typename E::Stored* top = x + 2 * r * p.width;
    const typename E::Stored* bottom = top + p.width;
    typename E::Stored* out = y + r * p.out_width;
    uint8_t* w = won + r * p.out_width;
    for (int64_t k = 0; k < p.out_width; ++k) {
      const float tl = a * E::load(top, 2 * k) + d, tr = a * E::load(top, 2 * k + 1) + d;
      const float bl = a * E::load(bottom, 2 * k) + d, br = a * E::load(bottom, 2 * k + 1) + d;
      const bool top_right = tr > tl, bottom_right = br > bl;
      const float t = top_right ? tr : tl, b = bottom_right ? br : bl;
      const bool down = b > t;
      const float m = down ? b : t;
      const int which = down ? 2 + bottom_right : top_right;
      E::store(out, k, m > 0.0f ? m : 0.0f);
      w[k] = m > 0.0f ? static_cast<uint8_t>(which) : kCut;
    }
  }
}

// Sums over one plane's windows that passed ReLU: of the gradient g and of g (x - mean) at the
// winner.
template <class E>
SPRITETORCH_INLINE void loops_gradient_sums(const typename E::Stored* x,
                                            const typename E::Stored* g, const uint8_t* won,
                                            const Plane& p, float mean, double& sum_g,
                                            double& sum_gx) {
  float s[kLanes] = {}, q[kLanes] = {};
  double total = 0, total_x = 0;
  for (int64_t r = 0; r < p.out_height; ++r) {
    const typename E::Stored* top = x + 2 * r * p.width;
    const typename E::Stored* bottom = top + p.width;
    const typename E::Stored* gr = g + r * p.out_width;
    const uint8_t* w = won + r * p.out_width;
    auto one = [&](int64_t k) {
      const int which = w[k];
      const float tl = E::load(top, 2 * k), tr = E::load(top, 2 * k + 1);
      const float bl = E::load(bottom, 2 * k), br = E::load(bottom, 2 * k + 1);
      const float at = (which == 0 ? tl : which == 1 ? tr : which == 2 ? bl : br) - mean;
      const float gv = which == kCut ? 0.0f : E::load(gr, k);
      return std::pair<float, float>(gv, gv * at);
    };
    int64_t k = 0;
    for (; k + kLanes <= p.out_width; k += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const auto [gv, gx] = one(k + l);
        s[l] += gv;
        q[l] += gx;
      }
    for (; k < p.out_width; ++k) {
      const auto [gv, gx] = one(k);
      total += gv;
      total_x += gx;
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    total += s[l];
    total_x += q[l];
  }
  sum_g += total;
  sum_gx += total_x;
}

// f(pixel) for each pixel no pool window reaches (LibTorch's floor mode drops them): an odd
// width's last column, an odd height's last row.
template <class F>
SPRITETORCH_INLINE void each_pixel_outside_windows(const Plane& p, F f) {
  if (p.width > 2 * p.out_width)
    for (int64_t r = 0; r < 2 * p.out_height; ++r) f(r * p.width + p.width - 1);
  for (int64_t i = 2 * p.out_height * p.width; i < p.pixels(); ++i) f(i);
}

// dx = u x + v where no pool window reaches.
template <class E>
SPRITETORCH_INLINE void dx_outside_windows(const typename E::Stored* x, typename E::Stored* dx,
                                           const Plane& p, float u, float v) {
  each_pixel_outside_windows(p, [&](int64_t i) { E::store(dx, i, u * E::load(x, i) + v); });
}

// One plane's dx = u x + v everywhere, plus c g at each window's winner.
template <class E>
SPRITETORCH_INLINE void loops_dx_plane(const typename E::Stored* x, const typename E::Stored* g,
                                       const uint8_t* won, typename E::Stored* dx, const Plane& p,
                                       float u, float v, float c) {
  for (int64_t r = 0; r < p.out_height; ++r) {
    const int64_t row = 2 * r * p.width;
    const typename E::Stored *top = x + row, *bottom = top + p.width;
    typename E::Stored *dtop = dx + row, *dbottom = dtop + p.width;
    const typename E::Stored* gr = g + r * p.out_width;
    const uint8_t* w = won + r * p.out_width;
    for (int64_t k = 0; k < p.out_width; ++k) {
      const int which = w[k];
      const float add = which == kCut ? 0.0f : c * E::load(gr, k);
      E::store(dtop, 2 * k, u * E::load(top, 2 * k) + v + (which == 0 ? add : 0.0f));
      E::store(dtop, 2 * k + 1, u * E::load(top, 2 * k + 1) + v + (which == 1 ? add : 0.0f));
      E::store(dbottom, 2 * k, u * E::load(bottom, 2 * k) + v + (which == 2 ? add : 0.0f));
      E::store(dbottom, 2 * k + 1, u * E::load(bottom, 2 * k + 1) + v + (which == 3 ? add : 0.0f));
    }
  }
  dx_outside_windows<E>(x, dx, p, u, v);
}

// ---- One channel's passes, for each element type and instruction set ----------------------------

// Per channel: the batch's planes of x (B of them, `stride` elements apart).
struct Channel {
  int64_t planes, stride, out_stride;
  Plane plane;
};

// Mean and biased variance of one channel, shifted by its first value against cancellation.
template <class E>
SPRITETORCH_INLINE void channel_stats(const typename E::Stored* x, const Channel& ch, double& mean,
                                      double& variance) {
  const float shift = E::load(x, 0);
  double sum = 0, squares = 0;
  for (int64_t b = 0; b < ch.planes; ++b)
    sums<E>(x + b * ch.stride, ch.plane.pixels(), shift, sum, squares);
  const double n = static_cast<double>(ch.planes * ch.plane.pixels());
  const double m = sum / n;
  mean = shift + m;
  variance = std::max(0.0, squares / n - m * m);
}

// The four passes of one element type and instruction set, on untyped pointers.
struct Passes {
  void (*stats)(const void* x, const Channel& ch, double& mean, double& variance);
  void (*forward)(const void* x, void* y, uint8_t* won, const Channel& ch, float a, float d);
  void (*gradient_sums)(const void* x, const void* g, const uint8_t* won, const Channel& ch,
                        float mean, double& sum_g, double& sum_gx);
  void (*dx)(const void* x, const void* g, const uint8_t* won, void* dx, const Channel& ch, float u,
             float v, float c);
};

// The four passes of one code path, compiled for TARGET: the statistics from channel_stats (the
// compiler vectorises its loops), the other three one plane at a time by CODE##_pool_plane,
// CODE##_gradient_sums and CODE##_dx_plane.
#define SPRITETORCH_PASSES(NAME, TARGET, E, CODE)                                                  \
  TARGET void NAME##_stats(const void* x, const Channel& ch, double& mean, double& variance) {     \
    channel_stats<E>(static_cast<const E::Stored*>(x), ch, mean, variance);                        \
  }                                                                                                \
  TARGET void NAME##_forward(const void* x_, void* y_, uint8_t* won, const Channel& ch, float a,   \
                             float d) {                                                            \
    const auto* x = static_cast<const E::Stored*>(x_);                                             \
    auto* y = static_cast<E::Stored*>(y_);                                                         \
    for (int64_t b = 0; b < ch.planes; ++b)                                                        \
      CODE##_pool_plane<E>(x + b * ch.stride, y + b * ch.out_stride, won + b * ch.out_stride,      \
                           ch.plane, a, d);                                                        \
  }                                                                                                \
  TARGET void NAME##_gradient_sums(const void* x_, const void* g_, const uint8_t* won,             \
                                   const Channel& ch, float mean, double& sum_g, double& sum_gx) { \
    const auto* x = static_cast<const E::Stored*>(x_);                                             \
    const auto* g = static_cast<const E::Stored*>(g_);                                             \
    for (int64_t b = 0; b < ch.planes; ++b)                                                        \
      CODE##_gradient_sums<E>(x + b * ch.stride, g + b * ch.out_stride, won + b * ch.out_stride,   \
                              ch.plane, mean, sum_g, sum_gx);                                      \
  }                                                                                                \
  TARGET void NAME##_dx(const void* x_, const void* g_, const uint8_t* won, void* dx_,             \
                        const Channel& ch, float u, float v, float c) {                            \
    const auto* x = static_cast<const E::Stored*>(x_);                                             \
    const auto* g = static_cast<const E::Stored*>(g_);                                             \
    auto* dx = static_cast<E::Stored*>(dx_);                                                       \
    for (int64_t b = 0; b < ch.planes; ++b)                                                        \
      CODE##_dx_plane<E>(x + b * ch.stride, g + b * ch.out_stride, won + b * ch.out_stride,        \
                         dx + b * ch.stride, ch.plane, u, v, c);                                   \
  }                                                                                                \
  const Passes NAME = {NAME##_stats, NAME##_forward, NAME##_gradient_sums, NAME##_dx};

#define SPRITETORCH_ANY_CPU
SPRITETORCH_PASSES(loops_fp32, SPRITETORCH_ANY_CPU, Fp32, loops)
SPRITETORCH_PASSES(loops_bf16, SPRITETORCH_ANY_CPU, Bf16, loops)

// ---- AVX-512 (F, BW, VL): 16 windows at a time -------------------------------------------------
//
// A window's two columns are a pair of neighbouring elements: bf16 pairs are one 32-bit lane (low
// half the left, high half the right), so one load gives 16 windows' lefts and rights without a
// shuffle; fp32 pairs are split with one permute per 32 elements. Rows whose windows do not fill
// 16 lanes (fastcnn's 14, 7 and 3 windows a row) take masked loads and stores.

#ifdef SPRITETORCH_BN_POOL_X86
#define SPRITETORCH_BN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
// GCC 12's masked-load intrinsics pass an undefined vector as the merge source, which
// -Wmaybe-uninitialized reports at -O3 (the masks zero those lanes).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC's name only: clang rejects unknown warning groups under -Werror
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

template <class E>
struct Avx512;

template <>
struct Avx512<Fp32> {
  // The lefts and rights of `n` (<= 16) windows starting at p.
  SPRITETORCH_BN_AVX512 static void load_pairs(const float* p, int n, __m512& left, __m512& right) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (2 * n)) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p);
    const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), p + 16);
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    left = _mm512_permutex2var_ps(lo, even, hi);
    right = _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi);
  }
  SPRITETORCH_BN_AVX512 static void store_pairs(float* p, int n, __m512 left, __m512 right) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (2 * n)) - 1);
    const __m512i first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512 lo = _mm512_permutex2var_ps(left, first, right);
    const __m512 hi =
        _mm512_permutex2var_ps(left, _mm512_add_epi32(first, _mm512_set1_epi32(8)), right);
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>(m), lo);
    _mm512_mask_storeu_ps(p + 16, static_cast<__mmask16>(m >> 16), hi);
  }
  SPRITETORCH_BN_AVX512 static __m512 load(const float* p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
  SPRITETORCH_BN_AVX512 static void store(float* p, __mmask16 m, __m512 v) {
    _mm512_mask_storeu_ps(p, m, v);
  }
};

// fp32 -> bf16 bits in each lane's low half, rounded to nearest even; NaN stays NaN.
SPRITETORCH_BN_AVX512 inline __m512i bf16_bits(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                               _mm512_set1_epi32(0x7FC0));
}

template <>
struct Avx512<Bf16> {
  SPRITETORCH_BN_AVX512 static void load_pairs(const uint16_t* p, int n, __m512& left,
                                               __m512& right) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (2 * n)) - 1);
    const __m512i v = _mm512_maskz_loadu_epi16(m, p);
    left = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    right = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF0000u)));
  }
  SPRITETORCH_BN_AVX512 static void store_pairs(uint16_t* p, int n, __m512 left, __m512 right) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (2 * n)) - 1);
    const __m512i v = _mm512_or_si512(bf16_bits(left), _mm512_slli_epi32(bf16_bits(right), 16));
    _mm512_mask_storeu_epi16(p, m, v);
  }
  SPRITETORCH_BN_AVX512 static __m512 load(const uint16_t* p, __mmask16 m) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  SPRITETORCH_BN_AVX512 static void store(uint16_t* p, __mmask16 m, __m512 v) {
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(bf16_bits(v)));
  }
};

SPRITETORCH_BN_AVX512 inline __mmask16 lanes(int n) {
  return static_cast<__mmask16>((1u << n) - 1);
}

// 16 windows' ReLU'd maximum of their four normalised values, and in `which` each window's
// winner (0..3) or kCut. As loops_pool_plane: each row's first maximum, then the bottom row's only
// if greater. A window with a NaN gives NaN, as LibTorch's pool and ReLU do (in training the
// whole channel is NaN then anyway; in eval mode only these windows).
SPRITETORCH_BN_AVX512 inline __m512 pool_windows(__m512 tl, __m512 tr, __m512 bl, __m512 br,
                                                 __m512i& which) {
  const __mmask16 top_right = _mm512_cmp_ps_mask(tr, tl, _CMP_GT_OQ);
  const __mmask16 bottom_right = _mm512_cmp_ps_mask(br, bl, _CMP_GT_OQ);
  const __m512 t = _mm512_mask_blend_ps(top_right, tl, tr);
  const __m512 b = _mm512_mask_blend_ps(bottom_right, bl, br);
  const __mmask16 down = _mm512_cmp_ps_mask(b, t, _CMP_GT_OQ);
  const __m512 m = _mm512_mask_blend_ps(down, t, b);
  const __mmask16 passed = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ);
  which = _mm512_maskz_mov_epi32(top_right, _mm512_set1_epi32(1));
  which = _mm512_mask_mov_epi32(
      which, down, _mm512_mask_mov_epi32(_mm512_set1_epi32(2), bottom_right, _mm512_set1_epi32(3)));
  which = _mm512_mask_mov_epi32(_mm512_set1_epi32(kCut), passed, which);
  const __mmask16 nan =
      _mm512_cmp_ps_mask(tl, tr, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(bl, br, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(passed, m), nan,
                            _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
}

// dx of one of the windows' four elements (index 0..3): u x + v, plus `add` where it won.
SPRITETORCH_BN_AVX512 inline __m512 dx_element(__m512 u, __m512 v, __m512 xv, __m512 add,
                                               __m512i which, int index) {
  const __m512 base = _mm512_fmadd_ps(u, xv, v);
  return _mm512_mask_add_ps(base, _mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(index)), base,
                            add);
}

template <class E>
SPRITETORCH_BN_AVX512 void avx512_pool_plane(const typename E::Stored* x, typename E::Stored* y,
                                             uint8_t* won, const Plane& p, float a_, float d_) {
  using V = Avx512<E>;
  const __m512 a = _mm512_set1_ps(a_), d = _mm512_set1_ps(d_);
  for (int64_t r = 0; r < p.out_height; ++r) {
    const typename E::Stored* top = x + 2 * r * p.width;
    const typename E::Stored* bottom = top + p.width;
    for (int64_t k = 0; k < p.out_width; k += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, p.out_width - k));
      __m512 tl, tr, bl, br;
      V::load_pairs(top + 2 * k, n, tl, tr);
      V::load_pairs(bottom + 2 * k, n, bl, br);
      tl = _mm512_fmadd_ps(a, tl, d);
      tr = _mm512_fmadd_ps(a, tr, d);
      bl = _mm512_fmadd_ps(a, bl, d);
      br = _mm512_fmadd_ps(a, br, d);
      __m512i which;
      const __m512 out = pool_windows(tl, tr, bl, br, which);
      const __mmask16 store = lanes(n);
      V::store(y + r * p.out_width + k, store, out);
      _mm_mask_storeu_epi8(won + r * p.out_width + k, store, _mm512_cvtepi32_epi8(which));
    }
  }
}

// The winner's value of each window: `which` (0..3) picks among the four.
SPRITETORCH_BN_AVX512 inline __m512 winner(__m512i which, __m512 tl, __m512 tr, __m512 bl,
                                           __m512 br) {
  __m512 v = _mm512_mask_mov_ps(tl, _mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(1)), tr);
  v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(2)), bl);
  return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(3)), br);
}

template <class E>
SPRITETORCH_BN_AVX512 void avx512_gradient_sums(const typename E::Stored* x,
                                                const typename E::Stored* g, const uint8_t* won,
                                                const Plane& p, float mean_, double& sum_g,
                                                double& sum_gx) {
  using V = Avx512<E>;
  const __m512 mean = _mm512_set1_ps(mean_);
  __m512 s = _mm512_setzero_ps(), q = _mm512_setzero_ps();
  for (int64_t r = 0; r < p.out_height; ++r) {
    const typename E::Stored* top = x + 2 * r * p.width;
    const typename E::Stored* bottom = top + p.width;
    for (int64_t k = 0; k < p.out_width; k += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, p.out_width - k));
      const __mmask16 m = lanes(n);
      const __m512i which =
          _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, won + r * p.out_width + k));
      const __mmask16 passed = _mm512_cmpneq_epi32_mask(which, _mm512_set1_epi32(kCut)) & m;
      __m512 tl, tr, bl, br;
      V::load_pairs(top + 2 * k, n, tl, tr);
      V::load_pairs(bottom + 2 * k, n, bl, br);
      const __m512 gv = V::load(g + r * p.out_width + k, passed);
      s = _mm512_add_ps(s, gv);
      q = _mm512_fmadd_ps(gv, _mm512_sub_ps(winner(which, tl, tr, bl, br), mean), q);
    }
  }
  sum_g += _mm512_reduce_add_ps(s);
  sum_gx += _mm512_reduce_add_ps(q);
}

template <class E>
SPRITETORCH_BN_AVX512 void avx512_dx_plane(const typename E::Stored* x, const typename E::Stored* g,
                                           const uint8_t* won, typename E::Stored* dx,
                                           const Plane& p, float u_, float v_, float c_) {
  using V = Avx512<E>;
  const __m512 u = _mm512_set1_ps(u_), v = _mm512_set1_ps(v_), c = _mm512_set1_ps(c_);
  for (int64_t r = 0; r < p.out_height; ++r) {
    const int64_t row = 2 * r * p.width;
    for (int64_t k = 0; k < p.out_width; k += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, p.out_width - k));
      const __mmask16 m = lanes(n);
      const __m512i which =
          _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, won + r * p.out_width + k));
      const __mmask16 passed = _mm512_cmpneq_epi32_mask(which, _mm512_set1_epi32(kCut)) & m;
      const __m512 add = _mm512_mul_ps(c, V::load(g + r * p.out_width + k, passed));
      __m512 tl, tr, bl, br;
      V::load_pairs(x + row + 2 * k, n, tl, tr);
      V::load_pairs(x + row + p.width + 2 * k, n, bl, br);
      V::store_pairs(dx + row + 2 * k, n, dx_element(u, v, tl, add, which, 0),
                     dx_element(u, v, tr, add, which, 1));
      V::store_pairs(dx + row + p.width + 2 * k, n, dx_element(u, v, bl, add, which, 2),
                     dx_element(u, v, br, add, which, 3));
    }
  }
  dx_outside_windows<E>(x, dx, p, u_, v_);
}

SPRITETORCH_PASSES(avx512_fp32, SPRITETORCH_BN_AVX512, Fp32, avx512)
SPRITETORCH_PASSES(avx512_bf16, SPRITETORCH_BN_AVX512, Bf16, avx512)

// ---- channels_last (NHWC), AVX-512: 16 channels at a time ---------------------------------------
//
// A pixel's C channels are contiguous, so the vectors run along the channels (masked past a
// multiple of 16) with per-channel factors; images are split over the threads. Statistics are
// summed per image in float a row at a time, then in double, then over the images in order, so
// the result does not depend on the thread count. The AVX2 code has the same form in 8 lanes
// (below); without either, channels_last tensors take LibTorch's ops (vectorised along the
// channels too), and CNNs run channels_last on the CPU only where one of the two runs
// (device::channels_last_pays).

struct Image {
  Plane plane;
  int64_t channels;
  int64_t row() const { return plane.width * channels; }  // elements of one row of x
};

// a[l] += s's lane l and b[l] += q's, for the first n lanes.
SPRITETORCH_BN_AVX512 inline void add_lanes(__m512 s, __m512 q, int n, double* a, double* b) {
  alignas(64) float sv[16], qv[16];
  _mm512_store_ps(sv, s);
  _mm512_store_ps(qv, q);
  for (int l = 0; l < n; ++l) {
    a[l] += sv[l];
    b[l] += qv[l];
  }
}

// sum[c] += sum over the image of (x - shift[c]), squares[c] += of its square.
template <class E>
SPRITETORCH_BN_AVX512 void avx512_nhwc_sums(const typename E::Stored* x, const Image& im,
                                            const float* shift, double* sum, double* squares) {
  using V = Avx512<E>;
  for (int64_t c = 0; c < im.channels; c += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, im.channels - c));
    const __mmask16 m = lanes(n);
    const __m512 s0 = _mm512_maskz_loadu_ps(m, shift + c);
    for (int64_t r = 0; r < im.plane.height; ++r) {
      __m512 s = _mm512_setzero_ps(), q = _mm512_setzero_ps();
      const typename E::Stored* row = x + r * im.row() + c;
      for (int64_t p = 0; p < im.plane.width; ++p) {
        const __m512 v = _mm512_sub_ps(V::load(row + p * im.channels, m), s0);
        s = _mm512_add_ps(s, v);
        q = _mm512_fmadd_ps(v, v, q);
      }
      add_lanes(s, q, n, sum + c, squares + c);
    }
  }
}

// One image's forward: as avx512_pool_plane with per-channel a and d; `won` in NHWC order.
template <class E>
SPRITETORCH_BN_AVX512 void avx512_nhwc_pool_image(const typename E::Stored* x,
                                                  typename E::Stored* y, uint8_t* won,
                                                  const Image& im, const float* a_,
                                                  const float* d_) {
  using V = Avx512<E>;
  const int64_t channels = im.channels;
  for (int64_t c = 0; c < channels; c += 16) {
    const __mmask16 lane = lanes(static_cast<int>(std::min<int64_t>(16, channels - c)));
    const __m512 a = _mm512_maskz_loadu_ps(lane, a_ + c), d = _mm512_maskz_loadu_ps(lane, d_ + c);
    for (int64_t r = 0; r < im.plane.out_height; ++r)
      for (int64_t k = 0; k < im.plane.out_width; ++k) {
        const typename E::Stored* top = x + 2 * r * im.row() + 2 * k * channels + c;
        const typename E::Stored* bottom = top + im.row();
        const __m512 tl = _mm512_fmadd_ps(a, V::load(top, lane), d);
        const __m512 tr = _mm512_fmadd_ps(a, V::load(top + channels, lane), d);
        const __m512 bl = _mm512_fmadd_ps(a, V::load(bottom, lane), d);
        const __m512 br = _mm512_fmadd_ps(a, V::load(bottom + channels, lane), d);
        __m512i which;
        const __m512 out = pool_windows(tl, tr, bl, br, which);
        const int64_t at = (r * im.plane.out_width + k) * channels + c;
        V::store(y + at, lane, out);
        _mm_mask_storeu_epi8(won + at, lane, _mm512_cvtepi32_epi8(which));
      }
  }
}

// One image's sums over the windows that passed ReLU: sum_g[c] += g, sum_gx[c] += g (x - mean[c])
// at the winner.
template <class E>
SPRITETORCH_BN_AVX512 void avx512_nhwc_gradient_sums(const typename E::Stored* x,
                                                     const typename E::Stored* g,
                                                     const uint8_t* won, const Image& im,
                                                     const float* mean_, double* sum_g,
                                                     double* sum_gx) {
  using V = Avx512<E>;
  const int64_t channels = im.channels;
  for (int64_t c = 0; c < channels; c += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, channels - c));
    const __mmask16 lane = lanes(n);
    const __m512 mean = _mm512_maskz_loadu_ps(lane, mean_ + c);
    for (int64_t r = 0; r < im.plane.out_height; ++r) {
      __m512 s = _mm512_setzero_ps(), q = _mm512_setzero_ps();
      for (int64_t k = 0; k < im.plane.out_width; ++k) {
        const typename E::Stored* top = x + 2 * r * im.row() + 2 * k * channels + c;
        const typename E::Stored* bottom = top + im.row();
        const int64_t at = (r * im.plane.out_width + k) * channels + c;
        const __m512i which = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lane, won + at));
        const __mmask16 passed = _mm512_cmpneq_epi32_mask(which, _mm512_set1_epi32(kCut)) & lane;
        const __m512 gv = V::load(g + at, passed);
        const __m512 xv = winner(which, V::load(top, lane), V::load(top + channels, lane),
                                 V::load(bottom, lane), V::load(bottom + channels, lane));
        s = _mm512_add_ps(s, gv);
        q = _mm512_fmadd_ps(gv, _mm512_sub_ps(xv, mean), q);
      }
      add_lanes(s, q, n, sum_g + c, sum_gx + c);
    }
  }
}

// One image's dx = u x + v everywhere, plus k g at each window's winner (per-channel u, v, k).
template <class E>
SPRITETORCH_BN_AVX512 void avx512_nhwc_dx_image(const typename E::Stored* x,
                                                const typename E::Stored* g, const uint8_t* won,
                                                typename E::Stored* dx, const Image& im,
                                                const float* u_, const float* v_, const float* k_) {
  using V = Avx512<E>;
  const int64_t channels = im.channels;
  const Plane& p = im.plane;
  for (int64_t c = 0; c < channels; c += 16) {
    const __mmask16 lane = lanes(static_cast<int>(std::min<int64_t>(16, channels - c)));
    const __m512 u = _mm512_maskz_loadu_ps(lane, u_ + c), v = _mm512_maskz_loadu_ps(lane, v_ + c),
                 scale = _mm512_maskz_loadu_ps(lane, k_ + c);
    auto plain = [&](int64_t at) SPRITETORCH_BN_AVX512 {  // u x + v where no window reaches
      V::store(dx + at, lane, _mm512_fmadd_ps(u, V::load(x + at, lane), v));
    };
    for (int64_t r = 0; r < p.out_height; ++r)
      for (int64_t k = 0; k < p.out_width; ++k) {
        const int64_t top = 2 * r * im.row() + 2 * k * channels + c, bottom = top + im.row();
        const int64_t at = (r * p.out_width + k) * channels + c;
        const __m512i which = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lane, won + at));
        const __mmask16 passed = _mm512_cmpneq_epi32_mask(which, _mm512_set1_epi32(kCut)) & lane;
        const __m512 add = _mm512_mul_ps(scale, V::load(g + at, passed));
        auto one = [&](int64_t at_x, int index) SPRITETORCH_BN_AVX512 {
          V::store(dx + at_x, lane, dx_element(u, v, V::load(x + at_x, lane), add, which, index));
        };
        one(top, 0);
        one(top + channels, 1);
        one(bottom, 2);
        one(bottom + channels, 3);
      }
    each_pixel_outside_windows(
        p, [&](int64_t pixel) SPRITETORCH_BN_AVX512 { plain(pixel * channels + c); });
  }
}

// The four passes of one element type over one image, on untyped pointers.
struct ImagePasses {
  void (*sums)(const void* x, const Image& im, const float* shift, double* sum, double* squares);
  void (*forward)(const void* x, void* y, uint8_t* won, const Image& im, const float* a,
                  const float* d);
  void (*gradient_sums)(const void* x, const void* g, const uint8_t* won, const Image& im,
                        const float* mean, double* sum_g, double* sum_gx);
  void (*dx)(const void* x, const void* g, const uint8_t* won, void* dx, const Image& im,
             const float* u, const float* v, const float* scale);
};

#define SPRITETORCH_IMAGE_PASSES(NAME, E, CODE)                                                   \
  void NAME##_sums(const void* x, const Image& im, const float* shift, double* sum,               \
                   double* squares) {                                                             \
    CODE##_nhwc_sums<E>(static_cast<const E::Stored*>(x), im, shift, sum, squares);               \
  }                                                                                               \
  void NAME##_forward(const void* x, void* y, uint8_t* won, const Image& im, const float* a,      \
                      const float* d) {                                                           \
    CODE##_nhwc_pool_image<E>(static_cast<const E::Stored*>(x), static_cast<E::Stored*>(y), won,  \
                              im, a, d);                                                          \
  }                                                                                               \
  void NAME##_gradient_sums(const void* x, const void* g, const uint8_t* won, const Image& im,    \
                            const float* mean, double* sum_g, double* sum_gx) {                   \
    CODE##_nhwc_gradient_sums<E>(static_cast<const E::Stored*>(x),                                \
                                 static_cast<const E::Stored*>(g), won, im, mean, sum_g, sum_gx); \
  }                                                                                               \
  void NAME##_dx(const void* x, const void* g, const uint8_t* won, void* dx, const Image& im,     \
                 const float* u, const float* v, const float* scale) {                            \
    CODE##_nhwc_dx_image<E>(static_cast<const E::Stored*>(x), static_cast<const E::Stored*>(g),   \
                            won, static_cast<E::Stored*>(dx), im, u, v, scale);                   \
  }                                                                                               \
  const ImagePasses NAME = {NAME##_sums, NAME##_forward, NAME##_gradient_sums, NAME##_dx};

SPRITETORCH_IMAGE_PASSES(nhwc_avx512_fp32, Fp32, avx512)
SPRITETORCH_IMAGE_PASSES(nhwc_avx512_bf16, Bf16, avx512)

// n fp32 values rounded to bf16, 16 at a time.
SPRITETORCH_BN_AVX512 void avx512_to_bf16(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(static_cast<int>(std::min<int64_t>(16, n - i)));
    Avx512<Bf16>::store(out + i, m, _mm512_maskz_loadu_ps(m, in + i));
  }
}

// in (rows, cols) to out (cols, rows), 16 x 16 blocks in registers (masked at the edges): the
// NHWC <-> planes copies of the first stage's output, its gradient and its kept winners.
SPRITETORCH_BN_AVX512 void avx512_transpose(const float* in, int64_t rows, int64_t cols,
                                            float* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int nr = static_cast<int>(std::min<int64_t>(16, rows - r0));
      const int nc = static_cast<int>(std::min<int64_t>(16, cols - c0));
      __m512 r[16], t[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < nr ? _mm512_maskz_loadu_ps(lanes(nc), in + (r0 + i) * cols + c0)
                      : _mm512_setzero_ps();
      // Within each 128-bit lane: pairs of rows' 32-bit elements, then four rows' column m.
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 2]);
        const __m512d c = _mm512_castps_pd(t[i + 1]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));      // lane L: column 4 L of rows i..i+3
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));  // column 4 L + 1
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));  // column 4 L + 2
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));  // column 4 L + 3
      }
      // Column 4 L + m is lane L of r[m], r[4 + m], r[8 + m] and r[12 + m].
      for (int m = 0; m < 4; ++m) {
        const __m512 low_ab = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44);   // a0 a1 b0 b1
        const __m512 high_ab = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xEE);  // a2 a3 b2 b3
        const __m512 low_cd = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44);
        const __m512 high_cd = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xEE);
        t[m] = _mm512_shuffle_f32x4(low_ab, low_cd, 0x88);         // L = 0: a0 b0 c0 d0
        t[4 + m] = _mm512_shuffle_f32x4(low_ab, low_cd, 0xDD);     // L = 1
        t[8 + m] = _mm512_shuffle_f32x4(high_ab, high_cd, 0x88);   // L = 2
        t[12 + m] = _mm512_shuffle_f32x4(high_ab, high_cd, 0xDD);  // L = 3
      }
      for (int j = 0; j < nc; ++j)
        _mm512_mask_storeu_ps(out + (c0 + j) * rows + r0, lanes(nr), t[j]);
    }
}

// The first stage with its convolution frozen (`--first-conv whitened`): backward needs no
// neighbourhood products. Forward keeps each window winner's normalised value x_hat = (z - mean)
// / std, NaN where ReLU cut the window, and backward makes the norm's two gradients from it:
// dgamma = sum g x_hat and dbeta = sum g over the winners that passed. AVX-512 and AVX2
// (frozen_passes_for); elsewhere the frozen weight takes the learned one's backward, whose weight
// gradient is dropped.

// One channel: its (H, W) plane z to the pooled plane's x_hat at the winners `won` picked, 16
// windows at a time: each corner of the windows (their pairs, as the forward pass loads them),
// then the winner's picked by its two bits.
SPRITETORCH_BN_AVX512 void avx512_keep_winners(const float* z, const uint8_t* won, const Plane& p,
                                               float mean, float inv_std, float* kept) {
  const __m512 cut = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
  const __m512 m = _mm512_set1_ps(mean), s = _mm512_set1_ps(inv_std);
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
  for (int64_t r = 0; r < p.out_height; ++r) {
    const float* top = z + 2 * r * p.width;
    for (int64_t k = 0; k < p.out_width; k += 16) {
      const int count = static_cast<int>(std::min<int64_t>(16, p.out_width - k));
      const __mmask16 n = lanes(count);
      const __m512i which =
          _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(n, won + r * p.out_width + k));
      __m512 tl, tr, bl, br;
      Avx512<Fp32>::load_pairs(top + 2 * k, count, tl, tr);
      Avx512<Fp32>::load_pairs(top + p.width + 2 * k, count, bl, br);
      const __mmask16 right = _mm512_test_epi32_mask(which, one);
      const __mmask16 bottom = _mm512_test_epi32_mask(which, two);
      const __m512 v = _mm512_mask_blend_ps(bottom, _mm512_mask_blend_ps(right, tl, tr),
                                            _mm512_mask_blend_ps(right, bl, br));
      const __mmask16 passed = _mm512_mask_cmpneq_epi32_mask(n, which, _mm512_set1_epi32(kCut));
      _mm512_mask_storeu_ps(kept + r * p.out_width + k, n,
                            _mm512_mask_mul_ps(cut, passed, _mm512_sub_ps(v, m), s));
    }
  }
}

// One image's sums over the winners that passed, per channel, added to sum_g and sum_gx (Cout
// each): g (fp32 or bf16) and kept as (Cout, P) planes, or (P, Cout) rows with channels_last.
template <class E>
SPRITETORCH_BN_AVX512 void avx512_kept_sums(const typename E::Stored* g, const float* kept,
                                            int64_t cout, int64_t pixels, bool channels_last,
                                            float* sum_g, float* sum_gx) {
  auto add = [](__m512 gv, __m512 kv, __m512& s, __m512& q) SPRITETORCH_BN_AVX512 {
    const __mmask16 passed = _mm512_cmp_ps_mask(kv, kv, _CMP_ORD_Q);  // NaN where ReLU cut
    s = _mm512_mask_add_ps(s, passed, s, gv);
    q = _mm512_mask3_fmadd_ps(gv, kv, q, passed);
  };
  if (channels_last) {  // the channels in the lanes
    for (int64_t c = 0; c < cout; c += 16) {
      const __mmask16 n = lanes(static_cast<int>(std::min<int64_t>(16, cout - c)));
      __m512 s = _mm512_setzero_ps(), q = _mm512_setzero_ps();
      for (int64_t i = 0; i < pixels; ++i)
        add(Avx512<E>::load(g + i * cout + c, n), _mm512_maskz_loadu_ps(n, kept + i * cout + c), s,
            q);
      _mm512_mask_storeu_ps(sum_g + c, n, _mm512_add_ps(_mm512_maskz_loadu_ps(n, sum_g + c), s));
      _mm512_mask_storeu_ps(sum_gx + c, n, _mm512_add_ps(_mm512_maskz_loadu_ps(n, sum_gx + c), q));
    }
    return;
  }
  for (int64_t c = 0; c < cout; ++c) {
    __m512 s = _mm512_setzero_ps(), q = _mm512_setzero_ps();
    for (int64_t i = 0; i < pixels; i += 16) {
      const __mmask16 n = lanes(static_cast<int>(std::min<int64_t>(16, pixels - i)));
      // Lanes past the plane load as 0, not NaN: mark them cut.
      const __m512 kv = _mm512_mask_loadu_ps(
          _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()), n, kept + c * pixels + i);
      add(Avx512<E>::load(g + c * pixels + i, n), kv, s, q);
    }
    sum_g[c] += _mm512_reduce_add_ps(s);
    sum_gx[c] += _mm512_reduce_add_ps(q);
  }
}
#pragma GCC diagnostic pop
#endif

// ---- AVX2 + FMA: 8 windows at a time ------------------------------------------------------------
//
// The same pairs as the AVX-512 code, in 8 lanes; a row's last windows short of 8 (all of
// fastcnn's 7- and 3-window rows) take AVX2's masked loads and stores of 32-bit lanes.

#ifdef SPRITETORCH_BN_POOL_X86
#define SPRITETORCH_BN_AVX2 __attribute__((target("avx2,fma")))

// fp32 -> bf16 bits in each lane's low half, rounded to nearest even; NaN stays NaN.
SPRITETORCH_BN_AVX2 inline __m256i bf16_bits_avx2(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}

// The first `count` of 8 32-bit lanes (count may be negative or above 8), as maskload takes it.
SPRITETORCH_BN_AVX2 inline __m256i first_lanes(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Up to 8 windows of a row: their 2n inputs and outputs, plain loads and stores for 8, masked
// loads and stores of 32-bit lanes for fewer (a bf16 pair is one lane, an fp32 pair two); the n
// gradients and outputs, element by element when n < 8 for bf16. Nothing is read or written past
// the row.
template <class E>
struct Avx2;

template <>
struct Avx2<Fp32> {
  SPRITETORCH_BN_AVX2 static void load_pairs(const float* p, int n, __m256& left, __m256& right) {
    const __m256 lo = n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(2 * n));
    const __m256 hi =
        n == 8 ? _mm256_loadu_ps(p + 8) : _mm256_maskload_ps(p + 8, first_lanes(2 * n - 8));
    // Per 128-bit half: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); the 64-bit quarters reordered 0 2 1 3.
    left = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))),
                              _MM_SHUFFLE(3, 1, 2, 0)));
    right = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))),
                              _MM_SHUFFLE(3, 1, 2, 0)));
  }
  SPRITETORCH_BN_AVX2 static void store_pairs(float* p, int n, __m256 left, __m256 right) {
    const __m256 a = _mm256_unpacklo_ps(left, right), b = _mm256_unpackhi_ps(left, right);
    const __m256 lo = _mm256_permute2f128_ps(a, b, 0x20), hi = _mm256_permute2f128_ps(a, b, 0x31);
    if (n == 8) {
      _mm256_storeu_ps(p, lo);
      _mm256_storeu_ps(p + 8, hi);
    } else {
      _mm256_maskstore_ps(p, first_lanes(2 * n), lo);
      _mm256_maskstore_ps(p + 8, first_lanes(2 * n - 8), hi);
    }
  }
  SPRITETORCH_BN_AVX2 static __m256 load(const float* p, int n) {
    return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(n));
  }
  SPRITETORCH_BN_AVX2 static void store(float* p, int n, __m256 v) {
    if (n == 8) return _mm256_storeu_ps(p, v);
    _mm256_maskstore_ps(p, first_lanes(n), v);
  }
};

template <>
struct Avx2<Bf16> {
  SPRITETORCH_BN_AVX2 static void load_pairs(const uint16_t* p, int n, __m256& left,
                                             __m256& right) {
    const __m256i v = n == 8
                          ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                          : _mm256_maskload_epi32(reinterpret_cast<const int*>(p), first_lanes(n));
    left = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    right = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF0000u)));
  }
  SPRITETORCH_BN_AVX2 static void store_pairs(uint16_t* p, int n, __m256 left, __m256 right) {
    const __m256i v =
        _mm256_or_si256(bf16_bits_avx2(left), _mm256_slli_epi32(bf16_bits_avx2(right), 16));
    if (n == 8) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    _mm256_maskstore_epi32(reinterpret_cast<int*>(p), first_lanes(n), v);
  }
  SPRITETORCH_BN_AVX2 static __m256 load(const uint16_t* p, int n) {
    alignas(16) uint16_t buffer[8] = {};
    if (n < 8) {
      for (int l = 0; l < n; ++l) buffer[l] = p[l];
      p = buffer;
    }
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  SPRITETORCH_BN_AVX2 static void store(uint16_t* p, int n, __m256 v) {
    // (a0..a3 a0..a3 | a4..a7 a4..a7) as 16-bit values; quarters 0 and 2 hold a0..a7.
    const __m256i bits = bf16_bits_avx2(v);
    const __m128i packed = _mm256_castsi256_si128(
        _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), _MM_SHUFFLE(3, 1, 2, 0)));
    if (n == 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
    alignas(16) uint16_t buffer[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buffer), packed);
    for (int l = 0; l < n; ++l) p[l] = buffer[l];
  }
};

SPRITETORCH_BN_AVX2 inline __m256i load_winners(const uint8_t* p, int n) {
  int64_t bits = 0;
  if (n == 8) {
    std::memcpy(&bits, p, sizeof bits);
  } else {
    for (int l = 0; l < n; ++l) bits |= static_cast<int64_t>(p[l]) << (8 * l);
  }
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bits));
}

SPRITETORCH_BN_AVX2 inline void store_winners(uint8_t* p, int n, __m256i which) {
  if (n == 8) {  // 32 -> 16 -> 8 bits (0..3 and kCut fit), per 128-bit half: lanes 0..3, 4..7
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(which, which), which);
    const uint64_t lo = static_cast<uint32_t>(_mm256_cvtsi256_si32(bytes));
    const uint64_t hi =
        static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1)));
    const uint64_t bits = lo | hi << 32;
    std::memcpy(p, &bits, sizeof bits);
    return;
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), which);
  for (int l = 0; l < n; ++l) p[l] = static_cast<uint8_t>(lanes[l]);
}

SPRITETORCH_BN_AVX2 inline __m256 select(__m256 mask, __m256 if_false, __m256 if_true) {
  return _mm256_blendv_ps(if_false, if_true, mask);
}

SPRITETORCH_BN_AVX2 inline __m256 lanes_equal(__m256i a, int b) {
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, _mm256_set1_epi32(b)));
}

SPRITETORCH_BN_AVX2 inline double sum_lanes(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  double s = 0;
  for (float f : lanes) s += f;
  return s;
}

// 8 windows' ReLU'd maximum of their four normalised values, and in `which` each window's winner
// (0..3) or kCut. As loops_pool_plane: each row's first maximum, then the bottom row's only if
// greater. A window with a NaN gives NaN, as the AVX-512 code's pool_windows.
SPRITETORCH_BN_AVX2 inline __m256 pool_windows_avx2(__m256 tl, __m256 tr, __m256 bl, __m256 br,
                                                    __m256i& which) {
  const __m256 top_right = _mm256_cmp_ps(tr, tl, _CMP_GT_OQ);
  const __m256 bottom_right = _mm256_cmp_ps(br, bl, _CMP_GT_OQ);
  const __m256 t = select(top_right, tl, tr), b = select(bottom_right, bl, br);
  const __m256 down = _mm256_cmp_ps(b, t, _CMP_GT_OQ);
  const __m256 m = select(down, t, b);
  const __m256 passed = _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i top_which = _mm256_and_si256(_mm256_castps_si256(top_right), one);
  const __m256i bottom_which = _mm256_add_epi32(
      _mm256_set1_epi32(2), _mm256_and_si256(_mm256_castps_si256(bottom_right), one));
  which = _mm256_blendv_epi8(top_which, bottom_which, _mm256_castps_si256(down));
  which = _mm256_blendv_epi8(_mm256_set1_epi32(kCut), which, _mm256_castps_si256(passed));
  const __m256 nan =
      _mm256_or_ps(_mm256_cmp_ps(tl, tr, _CMP_UNORD_Q), _mm256_cmp_ps(bl, br, _CMP_UNORD_Q));
  return _mm256_blendv_ps(_mm256_and_ps(m, passed),
                          _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan);
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_pool_plane(const typename E::Stored* x, typename E::Stored* y,
                                         uint8_t* won, const Plane& p, float a_, float d_) {
  using R = Avx2<E>;
  const __m256 a = _mm256_set1_ps(a_), d = _mm256_set1_ps(d_);
  for (int64_t r = 0; r < p.out_height; ++r) {
    const typename E::Stored* top = x + 2 * r * p.width;
    const typename E::Stored* bottom = top + p.width;
    for (int64_t k = 0; k < p.out_width; k += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, p.out_width - k));
      __m256 tl, tr, bl, br;
      R::load_pairs(top + 2 * k, n, tl, tr);
      R::load_pairs(bottom + 2 * k, n, bl, br);
      __m256i which;
      const __m256 out =
          pool_windows_avx2(_mm256_fmadd_ps(a, tl, d), _mm256_fmadd_ps(a, tr, d),
                            _mm256_fmadd_ps(a, bl, d), _mm256_fmadd_ps(a, br, d), which);
      R::store(y + r * p.out_width + k, n, out);
      store_winners(won + r * p.out_width + k, n, which);
    }
  }
}

// The winner's value of each window: `which` (0..3) picks among the four.
SPRITETORCH_BN_AVX2 inline __m256 winner_avx2(__m256i which, __m256 tl, __m256 tr, __m256 bl,
                                              __m256 br) {
  __m256 v = select(lanes_equal(which, 1), tl, tr);
  v = select(lanes_equal(which, 2), v, bl);
  return select(lanes_equal(which, 3), v, br);
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_gradient_sums(const typename E::Stored* x,
                                            const typename E::Stored* g, const uint8_t* won,
                                            const Plane& p, float mean_, double& sum_g,
                                            double& sum_gx) {
  using R = Avx2<E>;
  const __m256 mean = _mm256_set1_ps(mean_);
  __m256 s = _mm256_setzero_ps(), q = _mm256_setzero_ps();
  for (int64_t r = 0; r < p.out_height; ++r) {
    const typename E::Stored* top = x + 2 * r * p.width;
    const typename E::Stored* bottom = top + p.width;
    for (int64_t k = 0; k < p.out_width; k += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, p.out_width - k));
      const __m256i which = load_winners(won + r * p.out_width + k, n);
      __m256 tl, tr, bl, br;
      R::load_pairs(top + 2 * k, n, tl, tr);
      R::load_pairs(bottom + 2 * k, n, bl, br);
      // Lanes past n: g loads as zero.
      const __m256 gv =
          _mm256_andnot_ps(lanes_equal(which, kCut), R::load(g + r * p.out_width + k, n));
      s = _mm256_add_ps(s, gv);
      q = _mm256_fmadd_ps(gv, _mm256_sub_ps(winner_avx2(which, tl, tr, bl, br), mean), q);
    }
  }
  sum_g += sum_lanes(s);
  sum_gx += sum_lanes(q);
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_dx_plane(const typename E::Stored* x, const typename E::Stored* g,
                                       const uint8_t* won, typename E::Stored* dx, const Plane& p,
                                       float u_, float v_, float c_) {
  using R = Avx2<E>;
  const __m256 u = _mm256_set1_ps(u_), v = _mm256_set1_ps(v_), c = _mm256_set1_ps(c_);
  for (int64_t r = 0; r < p.out_height; ++r) {
    const int64_t row = 2 * r * p.width;
    for (int64_t k = 0; k < p.out_width; k += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, p.out_width - k));
      const __m256i which = load_winners(won + r * p.out_width + k, n);
      const __m256 add = _mm256_andnot_ps(lanes_equal(which, kCut),
                                          _mm256_mul_ps(c, R::load(g + r * p.out_width + k, n)));
      __m256 tl, tr, bl, br;
      R::load_pairs(x + row + 2 * k, n, tl, tr);
      R::load_pairs(x + row + p.width + 2 * k, n, bl, br);
      auto dx_of = [&](__m256 xv, int at) SPRITETORCH_BN_AVX2 {
        return _mm256_add_ps(_mm256_fmadd_ps(u, xv, v), _mm256_and_ps(lanes_equal(which, at), add));
      };
      R::store_pairs(dx + row + 2 * k, n, dx_of(tl, 0), dx_of(tr, 1));
      R::store_pairs(dx + row + p.width + 2 * k, n, dx_of(bl, 2), dx_of(br, 3));
    }
  }
  dx_outside_windows<E>(x, dx, p, u_, v_);
}

SPRITETORCH_PASSES(avx2_fp32, SPRITETORCH_BN_AVX2, Fp32, avx2)
SPRITETORCH_PASSES(avx2_bf16, SPRITETORCH_BN_AVX2, Bf16, avx2)

// ---- channels_last (NHWC), AVX2 + FMA: 8 channels at a time -------------------------------------
//
// The AVX-512 form's loops (above) in 8 lanes: channels past a multiple of 8 take the masked
// loads and stores of Avx2<E>; the same order of sums, so the same results for any thread count.

SPRITETORCH_BN_AVX2 inline void add_lanes_avx2(__m256 s, __m256 q, int n, double* a, double* b) {
  alignas(32) float sv[8], qv[8];
  _mm256_store_ps(sv, s);
  _mm256_store_ps(qv, q);
  for (int l = 0; l < n; ++l) {
    a[l] += sv[l];
    b[l] += qv[l];
  }
}

// Per-channel factors of lanes c .. c + n (zero past n).
SPRITETORCH_BN_AVX2 inline __m256 factors(const float* p, int n) { return Avx2<Fp32>::load(p, n); }

template <class E>
SPRITETORCH_BN_AVX2 void avx2_nhwc_sums(const typename E::Stored* x, const Image& im,
                                        const float* shift, double* sum, double* squares) {
  using R = Avx2<E>;
  for (int64_t c = 0; c < im.channels; c += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, im.channels - c));
    const __m256 s0 = factors(shift + c, n);
    for (int64_t r = 0; r < im.plane.height; ++r) {
      __m256 s = _mm256_setzero_ps(), q = _mm256_setzero_ps();
      const typename E::Stored* row = x + r * im.row() + c;
      for (int64_t p = 0; p < im.plane.width; ++p) {
        const __m256 v = _mm256_sub_ps(R::load(row + p * im.channels, n), s0);
        s = _mm256_add_ps(s, v);
        q = _mm256_fmadd_ps(v, v, q);
      }
      add_lanes_avx2(s, q, n, sum + c, squares + c);
    }
  }
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_nhwc_pool_image(const typename E::Stored* x, typename E::Stored* y,
                                              uint8_t* won, const Image& im, const float* a_,
                                              const float* d_) {
  using R = Avx2<E>;
  const int64_t channels = im.channels;
  for (int64_t c = 0; c < channels; c += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, channels - c));
    const __m256 a = factors(a_ + c, n), d = factors(d_ + c, n);
    for (int64_t r = 0; r < im.plane.out_height; ++r)
      for (int64_t k = 0; k < im.plane.out_width; ++k) {
        const typename E::Stored* top = x + 2 * r * im.row() + 2 * k * channels + c;
        const typename E::Stored* bottom = top + im.row();
        __m256i which;
        const __m256 out =
            pool_windows_avx2(_mm256_fmadd_ps(a, R::load(top, n), d),
                              _mm256_fmadd_ps(a, R::load(top + channels, n), d),
                              _mm256_fmadd_ps(a, R::load(bottom, n), d),
                              _mm256_fmadd_ps(a, R::load(bottom + channels, n), d), which);
        const int64_t at = (r * im.plane.out_width + k) * channels + c;
        R::store(y + at, n, out);
        store_winners(won + at, n, which);
      }
  }
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_nhwc_gradient_sums(const typename E::Stored* x,
                                                 const typename E::Stored* g, const uint8_t* won,
                                                 const Image& im, const float* mean_, double* sum_g,
                                                 double* sum_gx) {
  using R = Avx2<E>;
  const int64_t channels = im.channels;
  for (int64_t c = 0; c < channels; c += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, channels - c));
    const __m256 mean = factors(mean_ + c, n);
    for (int64_t r = 0; r < im.plane.out_height; ++r) {
      __m256 s = _mm256_setzero_ps(), q = _mm256_setzero_ps();
      for (int64_t k = 0; k < im.plane.out_width; ++k) {
        const typename E::Stored* top = x + 2 * r * im.row() + 2 * k * channels + c;
        const typename E::Stored* bottom = top + im.row();
        const int64_t at = (r * im.plane.out_width + k) * channels + c;
        const __m256i which = load_winners(won + at, n);  // lanes past n: 0, with g loaded as 0
        const __m256 gv = _mm256_andnot_ps(lanes_equal(which, kCut), R::load(g + at, n));
        const __m256 xv = winner_avx2(which, R::load(top, n), R::load(top + channels, n),
                                      R::load(bottom, n), R::load(bottom + channels, n));
        s = _mm256_add_ps(s, gv);
        q = _mm256_fmadd_ps(gv, _mm256_sub_ps(xv, mean), q);
      }
      add_lanes_avx2(s, q, n, sum_g + c, sum_gx + c);
    }
  }
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_nhwc_dx_image(const typename E::Stored* x,
                                            const typename E::Stored* g, const uint8_t* won,
                                            typename E::Stored* dx, const Image& im,
                                            const float* u_, const float* v_, const float* k_) {
  using R = Avx2<E>;
  const int64_t channels = im.channels;
  const Plane& p = im.plane;
  for (int64_t c = 0; c < channels; c += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, channels - c));
    const __m256 u = factors(u_ + c, n), v = factors(v_ + c, n), scale = factors(k_ + c, n);
    auto plain = [&](int64_t at) SPRITETORCH_BN_AVX2 {  // u x + v where no window reaches
      R::store(dx + at, n, _mm256_fmadd_ps(u, R::load(x + at, n), v));
    };
    for (int64_t r = 0; r < p.out_height; ++r)
      for (int64_t k = 0; k < p.out_width; ++k) {
        const int64_t top = 2 * r * im.row() + 2 * k * channels + c, bottom = top + im.row();
        const int64_t at = (r * p.out_width + k) * channels + c;
        const __m256i which = load_winners(won + at, n);
        const __m256 add =
            _mm256_andnot_ps(lanes_equal(which, kCut), _mm256_mul_ps(scale, R::load(g + at, n)));
        auto one = [&](int64_t at_x, int index) SPRITETORCH_BN_AVX2 {
          const __m256 plain_dx = _mm256_fmadd_ps(u, R::load(x + at_x, n), v);
          R::store(dx + at_x, n,
                   _mm256_add_ps(plain_dx, _mm256_and_ps(lanes_equal(which, index), add)));
        };
        one(top, 0);
        one(top + channels, 1);
        one(bottom, 2);
        one(bottom + channels, 3);
      }
    each_pixel_outside_windows(
        p, [&](int64_t pixel) SPRITETORCH_BN_AVX2 { plain(pixel * channels + c); });
  }
}

SPRITETORCH_IMAGE_PASSES(nhwc_avx2_fp32, Fp32, avx2)
SPRITETORCH_IMAGE_PASSES(nhwc_avx2_bf16, Bf16, avx2)

// avx512_transpose in 8 x 8 blocks.
SPRITETORCH_BN_AVX2 void avx2_transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8)
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      const int nr = static_cast<int>(std::min<int64_t>(8, rows - r0));
      const int nc = static_cast<int>(std::min<int64_t>(8, cols - c0));
      __m256 r[8], t[8];
      for (int i = 0; i < 8; ++i)
        r[i] = i < nr ? Avx2<Fp32>::load(in + (r0 + i) * cols + c0, nc) : _mm256_setzero_ps();
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      // Per 128-bit half h: r[m] and r[4 + m] hold column 4 h + m of rows 0..3 and 4..7.
      for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int m = 0; m < 4; ++m) {
        t[m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x20);
        t[4 + m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x31);
      }
      for (int j = 0; j < nc; ++j) Avx2<Fp32>::store(out + (c0 + j) * rows + r0, nr, t[j]);
    }
}

// The frozen first stage's two passes (avx512_keep_winners, avx512_kept_sums) in 8 lanes.
SPRITETORCH_BN_AVX2 void avx2_keep_winners(const float* z, const uint8_t* won, const Plane& p,
                                           float mean_, float inv_std_, float* kept) {
  const __m256 cut = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
  const __m256 mean = _mm256_set1_ps(mean_), inv_std = _mm256_set1_ps(inv_std_);
  for (int64_t r = 0; r < p.out_height; ++r) {
    const float* top = z + 2 * r * p.width;
    for (int64_t k = 0; k < p.out_width; k += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, p.out_width - k));
      const __m256i which = load_winners(won + r * p.out_width + k, n);
      __m256 tl, tr, bl, br;
      Avx2<Fp32>::load_pairs(top + 2 * k, n, tl, tr);
      Avx2<Fp32>::load_pairs(top + p.width + 2 * k, n, bl, br);
      const __m256 v =
          _mm256_mul_ps(_mm256_sub_ps(winner_avx2(which, tl, tr, bl, br), mean), inv_std);
      Avx2<Fp32>::store(kept + r * p.out_width + k, n, select(lanes_equal(which, kCut), v, cut));
    }
  }
}

template <class E>
SPRITETORCH_BN_AVX2 void avx2_kept_sums(const typename E::Stored* g, const float* kept,
                                        int64_t cout, int64_t pixels, bool channels_last,
                                        float* sum_g, float* sum_gx) {
  // Lanes past n load as 0 for both: they add nothing.
  auto add = [](__m256 gv, __m256 kv, __m256& s, __m256& q) SPRITETORCH_BN_AVX2 {
    const __m256 passed = _mm256_cmp_ps(kv, kv, _CMP_ORD_Q);  // NaN where ReLU cut
    s = _mm256_add_ps(s, _mm256_and_ps(passed, gv));
    q = _mm256_add_ps(q, _mm256_and_ps(passed, _mm256_mul_ps(gv, kv)));
  };
  if (channels_last) {
    for (int64_t c = 0; c < cout; c += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, cout - c));
      __m256 s = _mm256_setzero_ps(), q = _mm256_setzero_ps();
      for (int64_t i = 0; i < pixels; ++i)
        add(Avx2<E>::load(g + i * cout + c, n), Avx2<Fp32>::load(kept + i * cout + c, n), s, q);
      alignas(32) float s_lanes[8], q_lanes[8];
      _mm256_store_ps(s_lanes, s);
      _mm256_store_ps(q_lanes, q);
      for (int l = 0; l < n; ++l) {
        sum_g[c + l] += s_lanes[l];
        sum_gx[c + l] += q_lanes[l];
      }
    }
    return;
  }
  for (int64_t c = 0; c < cout; ++c) {
    __m256 s = _mm256_setzero_ps(), q = _mm256_setzero_ps();
    for (int64_t i = 0; i < pixels; i += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, pixels - i));
      add(Avx2<E>::load(g + c * pixels + i, n), Avx2<Fp32>::load(kept + c * pixels + i, n), s, q);
    }
    sum_g[c] += static_cast<float>(sum_lanes(s));
    sum_gx[c] += static_cast<float>(sum_lanes(q));
  }
}
#endif

const Passes& passes_for(gemm::Kernel kernel, bool bf16) {
#ifdef SPRITETORCH_BN_POOL_X86
  if (kernel == gemm::Kernel::avx512 && gemm::available(kernel))
    return bf16 ? avx512_bf16 : avx512_fp32;
  if (kernel == gemm::Kernel::avx2 && gemm::available(kernel)) return bf16 ? avx2_bf16 : avx2_fp32;
#else
  (void)kernel;  // no vector code off x86
#endif
  return bf16 ? loops_bf16 : loops_fp32;
}

#ifdef SPRITETORCH_BN_POOL_X86
// Whether `kernel` is one of the vector code paths (avx512, avx2) and this CPU runs it: the ones
// with an NHWC form and an eval-mode forward.
bool vector_code(gemm::Kernel kernel) {
  return (kernel == gemm::Kernel::avx512 || kernel == gemm::Kernel::avx2) &&
         gemm::available(kernel);
}

// The NHWC form of a code path: avx512 or avx2 (bn_relu_pool_fused sends no other here).
const ImagePasses& image_passes_for(gemm::Kernel kernel, bool bf16) {
  if (kernel == gemm::Kernel::avx512) return bf16 ? nhwc_avx512_bf16 : nhwc_avx512_fp32;
  return bf16 ? nhwc_avx2_bf16 : nhwc_avx2_fp32;
}
#endif

// The frozen first stage's passes of one code path: keep the winners' x_hat (forward), and sum
// g and g x_hat over them, g fp32 or bf16 (backward).
struct FrozenPasses {
  void (*keep)(const float* z, const uint8_t* won, const Plane& p, float mean, float inv_std,
               float* kept);
  void (*sums_fp32)(const float* g, const float* kept, int64_t cout, int64_t pixels,
                    bool channels_last, float* sum_g, float* sum_gx);
  void (*sums_bf16)(const uint16_t* g, const float* kept, int64_t cout, int64_t pixels,
                    bool channels_last, float* sum_g, float* sum_gx);
};

// The frozen passes `kernel` has here, or nullptr (no vector code: the learned weight's backward).
const FrozenPasses* frozen_passes_for(gemm::Kernel kernel) {
#ifdef SPRITETORCH_BN_POOL_X86
  static const FrozenPasses avx512 = {avx512_keep_winners, avx512_kept_sums<Fp32>,
                                      avx512_kept_sums<Bf16>};
  static const FrozenPasses avx2 = {avx2_keep_winners, avx2_kept_sums<Fp32>, avx2_kept_sums<Bf16>};
  if (!vector_code(kernel)) return nullptr;
  return kernel == gemm::Kernel::avx512 ? &avx512 : &avx2;
#else
  (void)kernel;
  return nullptr;
#endif
}

// ---- The operation ------------------------------------------------------------------------------

// As BatchNormImplBase::forward before the norm: counts the batch and returns the running
// statistics' update weight (the momentum, or 1 / batches counted without one).
double count_batch(torch::nn::BatchNorm2dImpl& bn) {
  {
    torch::NoGradGuard no_grad;
    bn.num_batches_tracked += 1;
  }
  const auto momentum = bn.options.momentum();
  return momentum ? *momentum : 1.0 / bn.num_batches_tracked.item<double>();
}

// One channel's running mean and variance moved towards the batch's by `factor`; as LibTorch,
// the running variance is the unbiased one (n values).
void update_running_stats(float& running_mean, float& running_var, double mean, double variance,
                          double n, double factor) {
  const double unbiased = n > 1 ? variance * n / (n - 1) : variance;
  running_mean = static_cast<float>((1 - factor) * running_mean + factor * mean);
  running_var = static_cast<float>((1 - factor) * running_var + factor * unbiased);
}

// One channel's norm from its batch statistics: what forward keeps for backward (mean, 1/std)
// and the pooled output's affine a x + d.
struct ChannelNorm {
  double inv_std;
  float a, d;
  bool finite() const { return std::isfinite(a) && std::isfinite(d); }
};

ChannelNorm channel_norm(double mean, double variance, double eps, float gamma, float beta) {
  const double inv_std = 1.0 / std::sqrt(variance + eps);
  const float a = static_cast<float>(gamma * inv_std);
  return {inv_std, a, static_cast<float>(beta - mean * a)};
}

// One channel's backward from the gradient's sums at the winners (sum g, sum g (x - mean)). With
// x_hat = (x - mean) / std and dz the gradient reaching the norm's output (g at each window's
// winner, zero elsewhere): dbias = sum dz, dweight = sum dz x_hat, and
// dx = weight / std (dz - dbias / n - x_hat dweight / n) = k dz + u x + v.
struct ChannelGradient {
  float dweight, dbias, u, v, k;
};

ChannelGradient channel_gradient(double sum_g, double sum_gx, double mean, double inv_std,
                                 double gamma, double n) {
  const double dbeta = sum_g, dgamma = sum_gx * inv_std;
  const double k = gamma * inv_std;
  const double u = -k * inv_std * dgamma / n;
  const double v = -k * dbeta / n - u * mean;
  return {static_cast<float>(dgamma), static_cast<float>(dbeta), static_cast<float>(u),
          static_cast<float>(v), static_cast<float>(k)};
}

// backward's result: dx, the norm's weight and bias gradients, none for the other five inputs.
variable_list input_gradients(torch::Tensor dx, torch::Tensor dweight, torch::Tensor dbias) {
  return {std::move(dx),   std::move(dweight), std::move(dbias), torch::Tensor(),
          torch::Tensor(), torch::Tensor(),    torch::Tensor(),  torch::Tensor()};
}

Channel channel_of(const torch::Tensor& x) {
  const int64_t h = x.size(2), w = x.size(3);
  return {x.size(0), x.size(1) * h * w, x.size(1) * (h / 2) * (w / 2), {h, w, h / 2, w / 2}};
}

// Channel c's two sums over the images, in image order, from per-image partials (B, 2, C).
std::pair<double, double> over_images(const std::vector<double>& partial, int64_t batch,
                                      int64_t channels, int64_t c) {
  double first = 0, second = 0;
  for (int64_t b = 0; b < batch; ++b) {
    first += partial[b * 2 * channels + c];
    second += partial[b * 2 * channels + channels + c];
  }
  return {first, second};
}

#ifdef SPRITETORCH_BN_POOL_X86
Image image_of(const torch::Tensor& x) { return {channel_of(x).plane, x.size(1)}; }
#endif

struct BnReluPoolFunction : torch::autograd::Function<BnReluPoolFunction> {
  // x: (B, C, H, W) contiguous fp32 or bf16; weight, bias, running_mean, running_var: (C) fp32.
  // factor: the running statistics' update weight (the norm's momentum).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               torch::Tensor running_mean, torch::Tensor running_var, double factor,
                               double eps, int64_t kernel_index) {
#ifdef SPRITETORCH_BN_POOL_X86
    if (!x.is_contiguous())
      return forward_nhwc(ctx, x, weight, bias, running_mean, running_var, factor, eps,
                          kernel_index);
#endif
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    const Passes& passes = passes_for(static_cast<gemm::Kernel>(kernel_index), bf16);
    const Channel ch = channel_of(x);
    const int64_t channels = x.size(1), plane = ch.plane.pixels(), out_plane = ch.plane.outputs();
    const int64_t elem = x.element_size();
    auto y =
        torch::empty({x.size(0), channels, ch.plane.out_height, ch.plane.out_width}, x.options());
    auto won = torch::empty(y.sizes(), x.options().dtype(torch::kUInt8));
    auto stats = torch::empty({channels, 2}, x.options().dtype(torch::kFloat32));  // mean, 1/std
    const auto* xp = static_cast<const char*>(x.data_ptr());
    auto* yp = static_cast<char*>(y.data_ptr());
    uint8_t* wp = won.data_ptr<uint8_t>();
    float* st = stats.data_ptr<float>();
    const float *gamma = weight.data_ptr<float>(), *beta = bias.data_ptr<float>();
    float *rm = running_mean.data_ptr<float>(), *rv = running_var.data_ptr<float>();
    const double n = static_cast<double>(ch.planes * plane);
    at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double mean = 0, variance = 0;
        passes.stats(xp + c * plane * elem, ch, mean, variance);
        const ChannelNorm norm = channel_norm(mean, variance, eps, gamma[c], beta[c]);
        st[2 * c] = static_cast<float>(mean);
        st[2 * c + 1] = static_cast<float>(norm.inv_std);
        if (norm.finite()) {
          passes.forward(xp + c * plane * elem, yp + c * out_plane * elem, wp + c * out_plane, ch,
                         norm.a, norm.d);
        } else {
          // A NaN or infinity in x (or the weights) leaves the whole channel NaN, as LibTorch's
          // ops would: a diverged run must show in its loss, not train on zeros.
          for (int64_t b = 0; b < ch.planes; ++b) {
            y.select(0, b).select(0, c).fill_(std::numeric_limits<float>::quiet_NaN());
            won.select(0, b).select(0, c).fill_(kCut);
          }
        }
        update_running_stats(rm[c], rv[c], mean, variance, n, factor);
      }
    });
    ctx->save_for_backward({x, weight, stats, won});
    ctx->saved_data["kernel"] = kernel_index;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &stats = saved[2], &won = saved[3];
    const auto kernel = static_cast<gemm::Kernel>(ctx->saved_data["kernel"].toInt());
#ifdef SPRITETORCH_BN_POOL_X86
    if (!x.is_contiguous()) return backward_nhwc(x, weight, stats, won, grad_out[0], kernel);
#endif
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    const Passes& passes = passes_for(kernel, bf16);
    const auto g = grad_out[0].to(x.scalar_type()).contiguous();
    const Channel ch = channel_of(x);
    const int64_t channels = x.size(1), plane = ch.plane.pixels(), out_plane = ch.plane.outputs();
    const int64_t elem = x.element_size();
    auto dx = torch::empty_like(x);
    auto dweight = torch::empty_like(weight), dbias = torch::empty_like(weight);
    const auto* xp = static_cast<const char*>(x.data_ptr());
    const auto* gp = static_cast<const char*>(g.data_ptr());
    auto* dxp = static_cast<char*>(dx.data_ptr());
    const uint8_t* wp = won.data_ptr<uint8_t>();
    const float *st = stats.data_ptr<float>(), *gamma = weight.data_ptr<float>();
    float *dw = dweight.data_ptr<float>(), *db = dbias.data_ptr<float>();
    const double n = static_cast<double>(ch.planes * plane);
    at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double sum_g = 0, sum_gx = 0;
        passes.gradient_sums(xp + c * plane * elem, gp + c * out_plane * elem, wp + c * out_plane,
                             ch, st[2 * c], sum_g, sum_gx);
        const ChannelGradient cg =
            channel_gradient(sum_g, sum_gx, st[2 * c], st[2 * c + 1], gamma[c], n);
        dw[c] = cg.dweight;
        db[c] = cg.dbias;
        passes.dx(xp + c * plane * elem, gp + c * out_plane * elem, wp + c * out_plane,
                  dxp + c * plane * elem, ch, cg.u, cg.v, cg.k);
      }
    });
    return input_gradients(dx, dweight, dbias);
  }

#ifdef SPRITETORCH_BN_POOL_X86
  // x channels_last (B, C, H, W): images over the threads (ImagePasses); y channels_last, `won`
  // (B, H / 2, W / 2, C).
  static torch::Tensor forward_nhwc(AutogradContext* ctx, const torch::Tensor& x,
                                    const torch::Tensor& weight, const torch::Tensor& bias,
                                    torch::Tensor running_mean, torch::Tensor running_var,
                                    double factor, double eps, int64_t kernel_index) {
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    const ImagePasses& passes = image_passes_for(static_cast<gemm::Kernel>(kernel_index), bf16);
    const Image im = image_of(x);
    const int64_t batch = x.size(0), channels = im.channels, elem = x.element_size();
    const int64_t in_image = im.plane.pixels() * channels,
                  out_image = im.plane.outputs() * channels;
    auto y = torch::empty({batch, channels, im.plane.out_height, im.plane.out_width},
                          x.options().memory_format(torch::MemoryFormat::ChannelsLast));
    auto won = torch::empty({batch, im.plane.out_height, im.plane.out_width, channels},
                            x.options().dtype(torch::kUInt8));
    auto stats = torch::empty({channels, 2}, x.options().dtype(torch::kFloat32));  // mean, 1/std
    const auto* xp = static_cast<const char*>(x.data_ptr());
    auto* yp = static_cast<char*>(y.data_ptr());
    uint8_t* wp = won.data_ptr<uint8_t>();

    // Shifted by each channel's first value against cancellation, as channel_stats.
    std::vector<float> shift(channels);
    {
      const auto first = x.select(0, 0).select(1, 0).select(1, 0).to(torch::kFloat32);
      std::copy(first.data_ptr<float>(), first.data_ptr<float>() + channels, shift.begin());
    }
    std::vector<double> partial(static_cast<size_t>(batch * 2 * channels), 0.0);
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        double* out = partial.data() + b * 2 * channels;
        passes.sums(xp + b * in_image * elem, im, shift.data(), out, out + channels);
      }
    });
    const double n = static_cast<double>(batch * im.plane.pixels());
    std::vector<float> a(channels), d(channels);
    std::vector<int64_t> not_finite;
    float* st = stats.data_ptr<float>();
    const float *gamma = weight.data_ptr<float>(), *beta = bias.data_ptr<float>();
    float *rm = running_mean.data_ptr<float>(), *rv = running_var.data_ptr<float>();
    for (int64_t c = 0; c < channels; ++c) {
      const auto [sum, squares] = over_images(partial, batch, channels, c);
      const double m = sum / n;
      const double mean = shift[c] + m, variance = std::max(0.0, squares / n - m * m);
      const ChannelNorm norm = channel_norm(mean, variance, eps, gamma[c], beta[c]);
      st[2 * c] = static_cast<float>(mean);
      st[2 * c + 1] = static_cast<float>(norm.inv_std);
      a[c] = norm.a;
      d[c] = norm.d;
      if (!norm.finite()) not_finite.push_back(c);
      update_running_stats(rm[c], rv[c], mean, variance, n, factor);
    }
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        passes.forward(xp + b * in_image * elem, yp + b * out_image * elem, wp + b * out_image, im,
                       a.data(), d.data());
    });
    for (int64_t c : not_finite) {  // as the NCHW form: the whole channel NaN
      y.select(1, c).fill_(std::numeric_limits<float>::quiet_NaN());
      won.select(3, c).fill_(kCut);
    }
    ctx->save_for_backward({x, weight, stats, won});
    ctx->saved_data["kernel"] = kernel_index;
    return y;
  }

  static variable_list backward_nhwc(const torch::Tensor& x, const torch::Tensor& weight,
                                     const torch::Tensor& stats, const torch::Tensor& won,
                                     const torch::Tensor& grad, gemm::Kernel kernel) {
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    const ImagePasses& passes = image_passes_for(kernel, bf16);
    const auto g = grad.to(x.scalar_type()).contiguous(torch::MemoryFormat::ChannelsLast);
    const Image im = image_of(x);
    const int64_t batch = x.size(0), channels = im.channels, elem = x.element_size();
    const int64_t in_image = im.plane.pixels() * channels,
                  out_image = im.plane.outputs() * channels;
    auto dx = torch::empty_like(x, torch::MemoryFormat::ChannelsLast);
    auto dweight = torch::empty_like(weight), dbias = torch::empty_like(weight);
    const auto* xp = static_cast<const char*>(x.data_ptr());
    const auto* gp = static_cast<const char*>(g.data_ptr());
    auto* dxp = static_cast<char*>(dx.data_ptr());
    const uint8_t* wp = won.data_ptr<uint8_t>();
    const float *st = stats.data_ptr<float>(), *gamma = weight.data_ptr<float>();
    std::vector<float> mean(channels);
    for (int64_t c = 0; c < channels; ++c) mean[c] = st[2 * c];
    std::vector<double> partial(static_cast<size_t>(batch * 2 * channels), 0.0);
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        double* out = partial.data() + b * 2 * channels;
        passes.gradient_sums(xp + b * in_image * elem, gp + b * out_image * elem,
                             wp + b * out_image, im, mean.data(), out, out + channels);
      }
    });
    const double n = static_cast<double>(batch * im.plane.pixels());
    std::vector<float> u(channels), v(channels), scale(channels);
    float *dw = dweight.data_ptr<float>(), *db = dbias.data_ptr<float>();
    for (int64_t c = 0; c < channels; ++c) {
      const auto [sum_g, sum_gx] = over_images(partial, batch, channels, c);
      const ChannelGradient cg =
          channel_gradient(sum_g, sum_gx, st[2 * c], st[2 * c + 1], gamma[c], n);
      dw[c] = cg.dweight;
      db[c] = cg.dbias;
      u[c] = cg.u;
      v[c] = cg.v;
      scale[c] = cg.k;
    }
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        passes.dx(xp + b * in_image * elem, gp + b * out_image * elem, wp + b * out_image,
                  dxp + b * in_image * elem, im, u.data(), v.data(), scale.data());
    });
    return input_gradients(dx, dweight, dbias);
  }
#endif
};

#ifdef SPRITETORCH_BN_POOL_X86
// Eval mode (the AVX-512 or AVX2 code, either layout): the norm is a x + d from the running
// statistics, the pool the training forward's, the winners thrown away (nothing to backpropagate).
torch::Tensor bn_relu_pool_inference(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                                     gemm::Kernel kernel) {
  const int64_t channels = x.size(1), elem = x.element_size();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  std::vector<float> a(channels), d(channels);
  std::vector<int64_t> not_finite;
  const float *gamma = bn.weight.data_ptr<float>(), *beta = bn.bias.data_ptr<float>();
  const float *rm = bn.running_mean.data_ptr<float>(), *rv = bn.running_var.data_ptr<float>();
  for (int64_t c = 0; c < channels; ++c) {
    const ChannelNorm norm = channel_norm(rm[c], rv[c], bn.options.eps(), gamma[c], beta[c]);
    a[c] = norm.a;
    d[c] = norm.d;
    if (!norm.finite()) not_finite.push_back(c);
  }
  const Image im = image_of(x);
  const Plane& plane = im.plane;
  const auto layout =
      x.is_contiguous() ? torch::MemoryFormat::Contiguous : torch::MemoryFormat::ChannelsLast;
  auto y = torch::empty({x.size(0), channels, plane.out_height, plane.out_width},
                        x.options().memory_format(layout));
  auto won = torch::empty(y.sizes(), x.options().dtype(torch::kUInt8));  // not read again
  const auto* xp = static_cast<const char*>(x.data_ptr());
  auto* yp = static_cast<char*>(y.data_ptr());
  uint8_t* wp = won.data_ptr<uint8_t>();
  if (layout == torch::MemoryFormat::Contiguous) {
    const Passes& passes = passes_for(kernel, bf16);
    const Channel ch = channel_of(x);
    at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        passes.forward(xp + c * ch.plane.pixels() * elem, yp + c * ch.plane.outputs() * elem,
                       wp + c * ch.plane.outputs(), ch, a[c], d[c]);
    });
  } else {
    const ImagePasses& passes = image_passes_for(kernel, bf16);
    const int64_t in_image = plane.pixels() * channels, out_image = plane.outputs() * channels;
    at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        passes.forward(xp + b * in_image * elem, yp + b * out_image * elem, wp + b * out_image, im,
                       a.data(), d.data());
    });
  }
  for (int64_t c : not_finite) y.select(1, c).fill_(std::numeric_limits<float>::quiet_NaN());
  return y;
}

#endif

// ---- The first stage: convolution, norm, ReLU and pool from the images
// ---------------------------
//
// For a 3x3 convolution (padding 1, no bias) of images that need no gradient, every statistic the
// norm needs is a product of the weights with two sums over the batch's pixel neighbourhoods v_p
// (the Cin x 9 input values under the kernel at pixel p, zero outside the image):
//   S = sum_p v_p and M = sum_p v_p v_p^T  (K = 9 Cin; K x K)
//   mean_c = w_c . S / N,  E[z_c^2] = w_c^T M w_c / N,  sum_p (z_c(p) - mean_c) v_p = M w_c -
//   mean_c S
// so neither pass needs the convolution's output stored: forward makes each image's (Cout, H, W)
// output in a buffer that stays in L1/L2 (a K-deep product of the weights with the image's v_p),
// normalises and pools it. Backward needs no output either: with G_c = sum over winners of g v_p
// (a K-deep product of the routed gradient), the norm's sum_w g (z_w - mean_c) is w_c . G_c -
// mean_c sum_w g, and the weight gradient is k_c (G_c - dbias_c S / N - dweight_c inv_std_c
// (M w_c - mean_c S) / N).

struct FirstStage {
  int64_t batch, in_channels, out_channels, taps;  // taps = K = 9 in_channels
  Plane plane;
  int64_t pixels() const { return plane.pixels(); }
};

FirstStage first_stage_of(const torch::Tensor& x, int64_t out_channels) {
  const int64_t h = x.size(2), w = x.size(3);
  return {x.size(0), x.size(1), out_channels, 9 * x.size(1), {h, w, h / 2, w / 2}};
}

// v (K, H W): row t = i * 9 + 3 (dy + 1) + (dx + 1) holds input channel i shifted by (dy, dx),
// zero where that falls outside. image: (Cin, H, W). Row by row: a copy and a zeroed edge.
void neighbourhoods(const float* image, const FirstStage& s, float* v) {
  const int64_t h = s.plane.height, w = s.plane.width;
  for (int64_t i = 0; i < s.in_channels; ++i)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        float* row = v + (i * 9 + 3 * (dy + 1) + (dx + 1)) * s.pixels();
        const float* in = image + i * s.pixels();
        for (int64_t y = 0; y < h; ++y) {
          float* out = row + y * w;
          const int64_t sy = y + dy;
          if (sy < 0 || sy >= h) {
            std::fill(out, out + w, 0.0f);
          } else if (dx < 0) {  // out[x] = in[x - 1]
            out[0] = 0.0f;
            std::copy(in + sy * w, in + sy * w + w - 1, out + 1);
          } else if (dx > 0) {  // out[x] = in[x + 1]
            std::copy(in + sy * w + 1, in + sy * w + w, out);
            out[w - 1] = 0.0f;
          } else {
            std::copy(in + sy * w, in + sy * w + w, out);
          }
        }
      }
}

// The sum of n floats, in 16 partial sums the compiler can keep in vectors.
double float_sum(const float* x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
  double total = 0;
  for (; i < n; ++i) total += x[i];
  for (float lane : lanes) total += lane;
  return total;
}

// out (cols, rows) = in (rows, cols) transposed: an image's planes to its channels_last pixels
// and back, with `kernel`'s code path.
void transpose(const float* in, int64_t rows, int64_t cols, float* out, gemm::Kernel kernel) {
#ifdef SPRITETORCH_BN_POOL_X86
  if (kernel == gemm::Kernel::avx512 && gemm::available(kernel))
    return avx512_transpose(in, rows, cols, out);
  if (kernel == gemm::Kernel::avx2 && gemm::available(kernel))
    return avx2_transpose(in, rows, cols, out);
#else
  (void)kernel;
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// n fp32 values to bf16 (rounded to nearest even) and back.
void to_bf16(const float* in, int64_t n, uint16_t* out) {
#ifdef SPRITETORCH_BN_POOL_X86
  if (gemm::available(gemm::Kernel::avx512)) return avx512_to_bf16(in, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) Bf16::store(out, i, in[i]);
}

void from_bf16(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16::load(in, i);
}

// How the first stage's output is stored: its layout (the next convolution's) and dtype (bf16
// under bf16 autocast, which would cast it for the next convolution anyway, to the same values).
struct OutputForm {
  bool channels_last, bf16;
  bool planes() const { return !channels_last && !bf16; }  // y is the fp32 planes themselves
};

// One image's pooled planes (Cout, P) fp32 into y's image `out` in `form`; scratch: Cout P floats.
void store_image(const float* planes, int64_t cout, int64_t pixels, OutputForm form, void* out,
                 float* scratch, gemm::Kernel kernel) {
  const float* from = planes;
  if (form.channels_last) {
    float* to = form.bf16 ? scratch : static_cast<float*>(out);
    transpose(planes, cout, pixels, to, kernel);
    from = to;
  }
  if (form.bf16) to_bf16(from, cout * pixels, static_cast<uint16_t*>(out));
}

// The reverse, for the gradient: one image of g in `form` to (Cout, P) fp32 planes.
void load_image(const void* in, int64_t cout, int64_t pixels, OutputForm form, float* planes,
                float* scratch, gemm::Kernel kernel) {
  const float* from = static_cast<const float*>(in);
  if (form.bf16) {
    float* to = form.channels_last ? scratch : planes;
    from_bf16(static_cast<const uint16_t*>(in), cout * pixels, to);
    from = to;
  }
  if (form.channels_last) transpose(from, pixels, cout, planes, kernel);
}

gemm::Kernel reentrant(gemm::Kernel kernel) {
  // The BLAS path would call OpenBLAS from several threads at once; the loops serve instead.
  return kernel == gemm::Kernel::blas ? gemm::Kernel::loops : kernel;
}

struct FirstStageFunction : torch::autograd::Function<FirstStageFunction> {
  // x: (B, Cin, H, W) contiguous fp32, no gradient; weight: (Cout, Cin, 3, 3) fp32; gamma, beta,
  // running_mean, running_var: (Cout) fp32. Returns (B, Cout, H / 2, W / 2), channels_last and
  // bf16 if asked (each image's pooled planes transposed and rounded in cache: OutputForm).
  // frozen: the weight takes no gradient, so forward keeps the winners' x_hat for backward.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& gamma_t,
                               const torch::Tensor& beta_t, torch::Tensor running_mean,
                               torch::Tensor running_var, double factor, double eps,
                               int64_t kernel_index, bool channels_last, bool bf16, bool frozen) {
    const gemm::Kernel kernel = reentrant(static_cast<gemm::Kernel>(kernel_index));
    const Passes& passes = passes_for(kernel, /*bf16=*/false);
    const FirstStage s = first_stage_of(x, weight.size(0));
    const int64_t k = s.taps, hw = s.pixels(), cout = s.out_channels;
    const int64_t out_plane = s.plane.outputs();
    const auto w = weight.reshape({cout, k}).contiguous();
    const float* wp = w.data_ptr<float>();
    const float* xp = x.data_ptr<float>();

    // S and M per image, then summed in double.
    std::vector<double> sums(static_cast<size_t>(s.batch * (k + k * k)));
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> v(static_cast<size_t>(k * hw)), m(static_cast<size_t>(k * k));
      for (int64_t b = begin; b < end; ++b) {
        neighbourhoods(xp + b * s.in_channels * hw, s, v.data());
        gemm::nt(static_cast<int>(k), static_cast<int>(k), static_cast<int>(hw), v.data(),
                 static_cast<int>(hw), v.data(), static_cast<int>(hw), m.data(),
                 static_cast<int>(k), nullptr, false, kernel);
        double* out = sums.data() + b * (k + k * k);
        for (int64_t t = 0; t < k; ++t) out[t] = float_sum(v.data() + t * hw, hw);
        for (int64_t t = 0; t < k * k; ++t) out[k + t] = m[t];
      }
    });
    auto sm = torch::zeros({k + k * k}, x.options().dtype(torch::kFloat64));  // S, then M
    double* smp = sm.data_ptr<double>();
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = 0; t < k + k * k; ++t) smp[t] += sums[b * (k + k * k) + t];

    // Per channel: mean, 1/std, and the pooled output's affine a z + d.
    const double n = static_cast<double>(s.batch * hw);
    auto stats = torch::empty({cout, 2}, x.options());  // mean, 1/std
    float* st = stats.data_ptr<float>();
    std::vector<ChannelNorm> norms(cout);
    const float *gamma = gamma_t.data_ptr<float>(), *beta = beta_t.data_ptr<float>();
    float *rm = running_mean.data_ptr<float>(), *rv = running_var.data_ptr<float>();
    for (int64_t c = 0; c < cout; ++c) {
      const float* wc = wp + c * k;
      double mean = 0, square = 0;
      for (int64_t t = 0; t < k; ++t) {
        mean += wc[t] * smp[t];
        double mw = 0;
        for (int64_t u = 0; u < k; ++u) mw += smp[k + t * k + u] * wc[u];
        square += wc[t] * mw;
      }
      mean /= n;
      const double variance = std::max(0.0, square / n - mean * mean);
      norms[c] = channel_norm(mean, variance, eps, gamma[c], beta[c]);
      st[2 * c] = static_cast<float>(mean);
      st[2 * c + 1] = static_cast<float>(norms[c].inv_std);
      update_running_stats(rm[c], rv[c], mean, variance, n, factor);
    }

    const OutputForm form{channels_last, bf16};
    auto y = torch::empty({s.batch, cout, s.plane.out_height, s.plane.out_width},
                          x.options()
                              .dtype(bf16 ? torch::kBFloat16 : torch::kFloat32)
                              .memory_format(channels_last ? torch::MemoryFormat::ChannelsLast
                                                           : torch::MemoryFormat::Contiguous));
    auto won = torch::empty(y.sizes(), x.options().dtype(torch::kUInt8));  // NCHW either way
    // The winners' x_hat (NaN where ReLU cut), fp32 in y's layout; only for a frozen weight.
    const auto kept =
        frozen ? torch::empty(y.sizes(), x.options().memory_format(
                                             channels_last ? torch::MemoryFormat::ChannelsLast
                                                           : torch::MemoryFormat::Contiguous))
               : torch::Tensor();
    float* keptp = frozen ? kept.data_ptr<float>() : nullptr;
    const FrozenPasses* frozen_passes = frozen ? frozen_passes_for(kernel) : nullptr;
    auto* yp = static_cast<char*>(y.data_ptr());
    const int64_t y_image = cout * out_plane * y.element_size();
    uint8_t* wonp = won.data_ptr<uint8_t>();
    const Channel one_plane = {1, hw, out_plane, s.plane};
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> v(static_cast<size_t>(k * hw)), z(static_cast<size_t>(cout * hw));
      std::vector<float> pooled(form.planes() ? 0 : static_cast<size_t>(2 * cout * out_plane));
      std::vector<float> kept_planes(keptp && channels_last ? cout * out_plane : 0);
      for (int64_t b = begin; b < end; ++b) {
        float* kept_image = !keptp          ? nullptr
                            : channels_last ? kept_planes.data()
                                            : keptp + b * cout * out_plane;
        neighbourhoods(xp + b * s.in_channels * hw, s, v.data());
        gemm::nn(static_cast<int>(cout), static_cast<int>(hw), static_cast<int>(k), wp,
                 static_cast<int>(k), 1, v.data(), static_cast<int>(hw), z.data(),
                 static_cast<int>(hw), kernel);
        float* planes = form.planes() ? reinterpret_cast<float*>(yp + b * y_image) : pooled.data();
        for (int64_t c = 0; c < cout; ++c) {
          const int64_t at = (b * cout + c) * out_plane;
          float* out = planes + c * out_plane;
          if (norms[c].finite()) {
            passes.forward(z.data() + c * hw, out, wonp + at, one_plane, norms[c].a, norms[c].d);
            if (kept_image)
              frozen_passes->keep(z.data() + c * hw, wonp + at, s.plane, st[2 * c], st[2 * c + 1],
                                  kept_image + c * out_plane);
          } else {  // as bn_relu_pool: a non-finite statistic or weight shows as NaN
            std::fill(out, out + out_plane, std::numeric_limits<float>::quiet_NaN());
            std::fill(wonp + at, wonp + at + out_plane, kCut);
            if (kept_image)
              std::fill(kept_image + c * out_plane, kept_image + (c + 1) * out_plane,
                        std::numeric_limits<float>::quiet_NaN());
          }
        }
        if (!form.planes())
          store_image(pooled.data(), cout, out_plane, form, yp + b * y_image,
                      pooled.data() + cout * out_plane, kernel);
        if (kept_image && channels_last)
          transpose(kept_image, cout, out_plane, keptp + b * cout * out_plane, kernel);
      }
    });
    ctx->save_for_backward({x, w, gamma_t, stats, sm, won, kept});
    ctx->saved_data["channels_last"] = channels_last;
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["kernel"] = kernel_index;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &gamma_t = saved[2], &stats = saved[3], &sm = saved[4],
               &won = saved[5], &kept = saved[6];
    const gemm::Kernel kernel =
        reentrant(static_cast<gemm::Kernel>(ctx->saved_data["kernel"].toInt()));
    const Passes& passes = passes_for(kernel, /*bf16=*/false);
    const OutputForm form{ctx->saved_data["channels_last"].toBool(),
                          ctx->saved_data["bf16"].toBool()};
    const auto g = grad_out[0]
                       .to(form.bf16 ? torch::kBFloat16 : torch::kFloat32)
                       .contiguous(form.channels_last ? torch::MemoryFormat::ChannelsLast
                                                      : torch::MemoryFormat::Contiguous);
    const FirstStage s = first_stage_of(x, w.size(0));  // w: (Cout, K)
    const int64_t k = s.taps, hw = s.pixels(), cout = s.out_channels;
    const int64_t out_plane = s.plane.outputs();
    const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *st = stats.data_ptr<float>(),
                *gamma = gamma_t.data_ptr<float>();
    const auto* gp = static_cast<const char*>(g.data_ptr());
    const int64_t g_image = cout * out_plane * g.element_size();
    const uint8_t* wonp = won.data_ptr<uint8_t>();
    const double* smp = sm.data_ptr<double>();
    const Channel one_plane = {1, hw, out_plane, s.plane};
    if (kept.defined()) return frozen_backward(s, form, g, kept, *frozen_passes_for(kernel));

    // Per image and channel: sum of g and G_c (K values) at the winners. The norm's other sum,
    // sum_w g (z - mean) = w_c . G_c - mean sum_g (z at a winner is w_c . v_p), is made from them
    // below, so backward never makes the convolution's output.
    const int64_t per = cout * (1 + k);
    std::vector<double> partial(static_cast<size_t>(s.batch * per));
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      // zeros: the x of the dx pass that routes g to the winners (u = v = 0, c = 1).
      std::vector<float> v(static_cast<size_t>(k * hw)), zeros(static_cast<size_t>(hw)),
          routed(static_cast<size_t>(cout * hw)), gv(static_cast<size_t>(cout * k));
      std::vector<float> planes(form.planes() ? 0 : static_cast<size_t>(2 * cout * out_plane));
      for (int64_t b = begin; b < end; ++b) {
        // This image's gradient as (Cout, H / 2, W / 2) fp32 planes.
        const float* gb = reinterpret_cast<const float*>(gp + b * g_image);
        if (!form.planes()) {
          load_image(gp + b * g_image, cout, out_plane, form, planes.data(),
                     planes.data() + cout * out_plane, kernel);
          gb = planes.data();
        }
        neighbourhoods(xp + b * s.in_channels * hw, s, v.data());
        double* out = partial.data() + b * per;
        for (int64_t c = 0; c < cout; ++c) {
          const int64_t at = (b * cout + c) * out_plane;
          // g at each window's winner, zero elsewhere (and at the windows ReLU cut).
          passes.dx(zeros.data(), gb + c * out_plane, wonp + at, routed.data() + c * hw, one_plane,
                    0.0f, 0.0f, 1.0f);
          out[c * (1 + k)] = float_sum(routed.data() + c * hw, hw);
        }
        gemm::nt(static_cast<int>(cout), static_cast<int>(k), static_cast<int>(hw), routed.data(),
                 static_cast<int>(hw), v.data(), static_cast<int>(hw), gv.data(),
                 static_cast<int>(k), nullptr, false, kernel);
        for (int64_t c = 0; c < cout; ++c)
          for (int64_t t = 0; t < k; ++t) out[c * (1 + k) + 1 + t] = gv[c * k + t];
      }
    });

    auto dweight = torch::empty({cout, s.in_channels, 3, 3}, x.options());
    auto dgamma = torch::empty({cout}, x.options()), dbeta = torch::empty({cout}, x.options());
    float *dw = dweight.data_ptr<float>(), *dg = dgamma.data_ptr<float>(),
          *db = dbeta.data_ptr<float>();
    const double n = static_cast<double>(s.batch * hw);
    std::vector<double> total(static_cast<size_t>(1 + k));  // sum_g, then G_c
    for (int64_t c = 0; c < cout; ++c) {
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t t = 0; t < 1 + k; ++t) total[t] += partial[b * per + c * (1 + k) + t];
      const double mean = st[2 * c], inv_std = st[2 * c + 1];
      const float* wc = wp + c * k;
      double sum_gz = -mean * total[0];  // sum over winners of g (z - mean)
      for (int64_t t = 0; t < k; ++t) sum_gz += wc[t] * total[1 + t];
      const double dbias = total[0], dnorm = sum_gz * inv_std;  // dbeta, dgamma
      dg[c] = static_cast<float>(dnorm);
      db[c] = static_cast<float>(dbias);
      const double scale = gamma[c] * inv_std;
      for (int64_t t = 0; t < k; ++t) {
        double mw = 0;
        for (int64_t u = 0; u < k; ++u) mw += smp[k + t * k + u] * wc[u];
        const double centred = mw - mean * smp[t];  // sum_p (z(p) - mean) v_p[t]
        dw[c * k + t] = static_cast<float>(
            scale * (total[1 + t] - dbias * smp[t] / n - dnorm * inv_std * centred / n));
      }
    }
    return {torch::Tensor(), dweight,         dgamma,          dbeta,
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

  // The norm's gradients from the winners' kept x_hat, g read in its own layout; the weight and
  // the images get none.
  static variable_list frozen_backward(const FirstStage& s, OutputForm form, const torch::Tensor& g,
                                       const torch::Tensor& kept, const FrozenPasses& passes) {
    const int64_t cout = s.out_channels, out_plane = s.plane.outputs();
    const auto* gp = static_cast<const char*>(g.data_ptr());
    const int64_t g_image = cout * out_plane * g.element_size();
    const float* keptp = kept.data_ptr<float>();
    // (B, 2, Cout): sum g, then sum g x_hat, per image.
    std::vector<double> partial(static_cast<size_t>(s.batch * cout * 2));
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> image_sums(static_cast<size_t>(2 * cout));
      for (int64_t b = begin; b < end; ++b) {
        std::fill(image_sums.begin(), image_sums.end(), 0.0f);
        const void* gb = gp + b * g_image;
        const float* kb = keptp + b * cout * out_plane;
        float *sum_g = image_sums.data(), *sum_gx = sum_g + cout;
        if (form.bf16)
          passes.sums_bf16(static_cast<const uint16_t*>(gb), kb, cout, out_plane,
                           form.channels_last, sum_g, sum_gx);
        else
          passes.sums_fp32(static_cast<const float*>(gb), kb, cout, out_plane, form.channels_last,
                           sum_g, sum_gx);
        std::copy(image_sums.begin(), image_sums.end(), partial.begin() + b * cout * 2);
      }
    });
    auto dgamma = torch::empty({cout}, kept.options()),
         dbeta = torch::empty({cout}, kept.options());
    float *dg = dgamma.data_ptr<float>(), *db = dbeta.data_ptr<float>();
    for (int64_t c = 0; c < cout; ++c) {
      const auto [sum_g, sum_gx] = over_images(partial, s.batch, cout, c);
      dg[c] = static_cast<float>(sum_gx);
      db[c] = static_cast<float>(sum_g);
    }
    return {torch::Tensor(), torch::Tensor(), dgamma,          dbeta,
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// SPRITETORCH_FUSED_BN_POOL: 1 (or unset) the fused op, 0 LibTorch's ops.
bool fusion_from_environment() {
  return environment_switch("SPRITETORCH_FUSED_BN_POOL", "LibTorch's BatchNorm, ReLU and max-pool",
                            "the fused op");
}

// -1 until the environment is read (on first use, so that a bad value is an Error to report, not
// a throw during static initialisation); then 0 or 1.
std::atomic<int> fusion_on{-1};

}  // namespace

void set_bn_relu_pool_fusion(bool on) { fusion_on = on ? 1 : 0; }

bool bn_relu_pool_fusion() {
  if (fusion_on < 0) fusion_on = fusion_from_environment() ? 1 : 0;
  return fusion_on == 1;
}

std::string bn_relu_pool_code() {
  if (!bn_relu_pool_fusion()) return "off";
  const gemm::Kernel kernel = gemm::best_kernel();
#ifdef SPRITETORCH_BN_POOL_X86
  if (vector_code(kernel)) return gemm::kernel_name(kernel);
#endif
  return "loops";
}

bool bn_relu_pool_channels_last() {
  const std::string code = bn_relu_pool_code();
  return code == "avx512" || code == "avx2";
}

bool fused_ops_use_these_threads() { return bn_relu_pool_threaded() || at::get_num_threads() == 1; }

bool bn_relu_pool_threaded() {
#if defined(SPRITETORCH_OPENMP) && defined(_OPENMP)
  return true;
#else
  return false;
#endif
}

// The norm's side of the conditions: fusion on, its threads, affine weights and running
// statistics, all fp32 and contiguous.
static bool fusable_norm(const torch::nn::BatchNorm2dImpl& bn) {
  const auto& o = bn.options;
  return bn_relu_pool_fusion() && fused_ops_use_these_threads() && o.affine() &&
         o.track_running_stats() && bn.running_mean.defined() && bn.num_batches_tracked.defined() &&
         bn.weight.scalar_type() == torch::kFloat32 && bn.weight.is_contiguous() &&
         bn.bias.is_contiguous() && bn.running_mean.scalar_type() == torch::kFloat32 &&
         bn.running_mean.is_contiguous() && bn.running_var.scalar_type() == torch::kFloat32 &&
         bn.running_var.is_contiguous();
}

// channels_last has the AVX-512 and AVX2 forms only (nhwc_avx512_*, nhwc_avx2_*).
static bool fusable_layout(const torch::Tensor& x, gemm::Kernel kernel) {
  if (x.is_contiguous()) return true;
#ifdef SPRITETORCH_BN_POOL_X86
  return x.is_contiguous(torch::MemoryFormat::ChannelsLast) && vector_code(kernel);
#else
  (void)kernel;
  return false;
#endif
}

// x's side: on the CPU, 4-D, at least 2 x 2, fp32 or bf16, a layout the kernel has.
static bool fusable_input(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                          gemm::Kernel kernel) {
  return x.device().is_cpu() && x.dim() == 4 && fusable_layout(x, kernel) && x.size(2) >= 2 &&
         x.size(3) >= 2 &&
         (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
         bn.weight.numel() == x.size(1);
}

bool bn_relu_pool_fused(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                        gemm::Kernel kernel) {
  return bn.is_training() && fusable_norm(bn) && fusable_input(bn, x, kernel);
}

bool bn_relu_pool_inference_fused(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                                  gemm::Kernel kernel) {
#ifdef SPRITETORCH_BN_POOL_X86
  if (bn.is_training()) return false;  // the training path's every call passes here first
  const bool needs_grad =
      torch::GradMode::is_enabled() &&
      (x.requires_grad() || bn.weight.requires_grad() || bn.bias.requires_grad());
  return !needs_grad && vector_code(kernel) && fusable_norm(bn) && fusable_input(bn, x, kernel);
#else
  (void)bn, (void)x, (void)kernel;
  return false;
#endif
}

torch::Tensor bn_relu_pool_reference(torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x) {
  return torch::max_pool2d(torch::relu(bn.forward(x)), 2);
}

torch::Tensor bn_relu_pool(torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x,
                           gemm::Kernel kernel) {
#ifdef SPRITETORCH_BN_POOL_X86
  if (bn_relu_pool_inference_fused(bn, x, kernel)) return bn_relu_pool_inference(bn, x, kernel);
#endif
  if (!bn_relu_pool_fused(bn, x, kernel)) return bn_relu_pool_reference(bn, x);
  const double factor = count_batch(bn);
  return BnReluPoolFunction::apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, factor,
                                   bn.options.eps(), static_cast<int64_t>(kernel));
}

bool first_conv_bn_relu_pool_fused(const torch::nn::Conv2dImpl& conv,
                                   const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x) {
  const auto& o = conv.options;
  const auto* padding = compat::variant_get_if<torch::ExpandingArray<2>>(o.padding());
  return x.defined() && !x.requires_grad() && x.scalar_type() == torch::kFloat32 && x.dim() == 4 &&
         x.is_contiguous() && x.size(1) <= 8 && !o.bias() && o.kernel_size()->at(0) == 3 &&
         o.kernel_size()->at(1) == 3 && o.stride()->at(0) == 1 && o.stride()->at(1) == 1 &&
         o.dilation()->at(0) == 1 && o.dilation()->at(1) == 1 && o.groups() == 1 && padding &&
         (*padding)->at(0) == 1 && (*padding)->at(1) == 1 && !o.transposed() &&
         compat::variant_holds<torch::enumtype::kZeros>(o.padding_mode()) &&
         conv.weight.scalar_type() == torch::kFloat32 && conv.weight.size(1) == x.size(1) &&
         bn.weight.numel() == conv.weight.size(0) && x.size(2) >= 2 && x.size(3) >= 2 &&
         x.device().is_cpu() && bn.is_training() && fusable_norm(bn);
}

torch::Tensor first_conv_bn_relu_pool(torch::nn::Conv2dImpl& conv, torch::nn::BatchNorm2dImpl& bn,
                                      const torch::Tensor& x, gemm::Kernel kernel,
                                      torch::MemoryFormat layout) {
  if (!first_conv_bn_relu_pool_fused(conv, bn, x)) return bn_relu_pool(bn, conv.forward(x), kernel);
  const double factor = count_batch(bn);
  return FirstStageFunction::apply(
      x, conv.weight, bn.weight, bn.bias, bn.running_mean, bn.running_var, factor, bn.options.eps(),
      static_cast<int64_t>(kernel), layout == torch::MemoryFormat::ChannelsLast,
      compat::autocast_enabled(c10::DeviceType::CPU) &&
          compat::autocast_dtype(c10::DeviceType::CPU) == torch::kBFloat16,
      !conv.weight.requires_grad() && frozen_passes_for(kernel));
}

}  // namespace spritetorch::models
