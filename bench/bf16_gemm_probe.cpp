// What a bf16 fused MLP step could gain on a CPU with AVX512_BF16 (vdpbf16ps) or AMX-BF16 tiles,
// before writing one: the seed step's largest product (layer 1 forward, 64 x 64 x 784 per step
// thread) as an fp32 AVX-512 kernel (common/small_gemm.h) against a bf16 dot-product kernel of the
// same blocking and an AMX tile kernel, and the fp32 -> bf16 conversions and the packing of W1 into
// AMX's pair layout that such a step would add each step (W1 changes every step); and
// `library_bf16`, the kernels the fused bf16 step now runs (common/bf16_gemm.h), at the same
// shapes beside the fp32 dW1.
//
//   build/bench/bf16_gemm_probe        # skips the cases this CPU cannot run, saying why
//
// One thread. Counters: GFLOP/s of the product (2 m n k per call) or elements/s of a conversion.
// The AMX case checks its product against a plain loop over the same bf16 values before timing
// and stops with the largest difference if they disagree.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "common/bf16_gemm.h"
#include "common/small_gemm.h"

namespace {

constexpr int kM = 64, kN = 64, kK = 784;
constexpr int kKPadded = (kK + 31) / 32 * 32;  // 800: an AMX tile row holds 32 bf16

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PROBE_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
// GCC 12's AVX-512 headers trip -Wuninitialized once inlined (see common/small_gemm.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

bool cpu_has_bf16() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

// Round-to-nearest-even fp32 -> bf16, 32 values per step (vcvtne2ps2bf16).
PROBE_BF16 void to_bf16(const float* in, uint16_t* out, int n) {
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + i + 16), _mm512_loadu_ps(in + i));
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(v));
  }
  for (; i < n; ++i) {  // the tail by the same rounding, in scalar
    uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    out[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

// C (m x n) = A (m x k) B^T with A, B bf16, k a multiple of 32: 4 x 4 blocks of 16-lane fp32 sums,
// each vdpbf16ps adding 32 products (pairs along k). The fp32 kernel's blocking, twice the depth.
PROBE_BF16 void nt_bf16(int m, int n, int k, const uint16_t* a, const uint16_t* b, float* c) {
  for (int j = 0; j < n; j += 4)
    for (int i = 0; i < m; i += 4) {
      __m512 acc[4][4];
      for (auto& row : acc)
        for (auto& v : row) v = _mm512_setzero_ps();
      for (int p = 0; p < k; p += 32) {
        __m512bh av[4], bv;
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
          av[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(a + int64_t{i + r} * k + p));
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          bv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + int64_t{j + s} * k + p));
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], av[r], bv);
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int s = 0; s < 4; ++s) c[int64_t{i + r} * n + j + s] = _mm512_reduce_add_ps(acc[r][s]);
    }
}

#define PROBE_AMX __attribute__((target("amx-tile,amx-bf16")))

// CPUID leaf 7 says the tiles exist; Linux (5.16+) hands a process their 8 KB of state only when
// it asks (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA): a tile instruction before that is SIGILL.
std::string amx_unusable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22)))
    return "no AMX-BF16";
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0)
    return "the kernel refused the AMX tile state (arch_prctl)";
  return "";
#else
  return "AMX needs Linux's arch_prctl here";
#endif
}

// Eight tiles of 16 rows x 64 bytes: 0-3 a 2 x 2 block of fp32 C (32 x 32), 4-5 two row panels of
// A (16 x 32 bf16), 6-7 two column panels of B in pairs (16 pairs of k x 16 columns).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// B (n x k, row-major bf16) -> the pair layout a tile multiply reads: for each panel of 16
// columns, kp / 2 rows of 16 (B[col][2q], B[col][2q + 1]) pairs; k zero-padded to kp (32s).
void pack_pairs(int n, int k, int kp, const uint16_t* b, uint16_t* out) {
  for (int panel = 0; panel < n / 16; ++panel)
    for (int q = 0; q < kp / 2; ++q)
      for (int col = 0; col < 16; ++col)
        for (int e = 0; e < 2; ++e) {
          const int p = 2 * q + e;
          out[((int64_t{panel} * (kp / 2) + q) * 16 + col) * 2 + e] =
              p < k ? b[int64_t{panel * 16 + col} * k + p] : 0;
        }
}

// C (m x n fp32) = A (m x kp bf16, zero-padded columns) B^T, B packed by pack_pairs; m and n
// multiples of 32. Each pass over k: 2 A panels and 2 B panels loaded, 4 tile multiplies.
PROBE_AMX void nt_amx(int m, int n, int kp, const uint16_t* a, const uint16_t* b_pairs, float* c) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
  const int64_t a_stride = int64_t{kp} * 2, c_stride = int64_t{n} * 4;
  for (int i = 0; i < m; i += 32)
    for (int j = 0; j < n; j += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const uint16_t* b0 = b_pairs + int64_t{j / 16} * (kp / 2) * 32;
      const uint16_t* b1 = b0 + int64_t{kp / 2} * 32;
      for (int p = 0; p < kp; p += 32) {
        _tile_loadd(4, a + int64_t{i} * kp + p, a_stride);
        _tile_loadd(5, a + int64_t{i + 16} * kp + p, a_stride);
        _tile_loadd(6, b0 + int64_t{p / 2} * 32, 64);
        _tile_loadd(7, b1 + int64_t{p / 2} * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c + int64_t{i} * n + j, c_stride);
      _tile_stored(1, c + int64_t{i} * n + j + 16, c_stride);
      _tile_stored(2, c + int64_t{i + 16} * n + j, c_stride);
      _tile_stored(3, c + int64_t{i + 16} * n + j + 16, c_stride);
    }
  _tile_release();
}
#else
bool cpu_has_bf16() { return false; }
void to_bf16(const float*, uint16_t*, int) {}
void nt_bf16(int, int, int, const uint16_t*, const uint16_t*, float*) {}
std::string amx_unusable() { return "not an x86-64 build"; }
void pack_pairs(int, int, int, const uint16_t*, uint16_t*) {}
void nt_amx(int, int, int, const uint16_t*, const uint16_t*, float*) {}
#endif

float from_bf16(uint16_t v) {
  const uint32_t bits = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// bf16 values in [-1, 1) that differ from element to element, so a transposed or shifted
// layout gives another product.
std::vector<uint16_t> varied_bf16(int64_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    const float f = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

void set_rate(benchmark::State& state, double per_iteration) {
  state.counters["rate"] = benchmark::Counter(
      per_iteration, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void layer1_forward_fp32_avx512(benchmark::State& state) {
  using spritetorch::gemm::Kernel;
  if (!spritetorch::gemm::available(Kernel::avx512)) return state.SkipWithError("no AVX-512");
  std::vector<float> a(kM * kK, 0.5f), b(kN * kK, 0.25f), c(kM * kN), bias(kN, 0.1f);
  for (auto _ : state) {
    spritetorch::gemm::nt(kM, kN, kK, a.data(), kK, b.data(), kK, c.data(), kN, bias.data(), true,
                          Kernel::avx512);
    benchmark::DoNotOptimize(c.data());
  }
  set_rate(state, 2.0 * kM * kN * kK);
}

void layer1_forward_bf16(benchmark::State& state) {
  if (!cpu_has_bf16()) return state.SkipWithError("no AVX512_BF16");
  std::vector<uint16_t> a(kM * kK, 0x3f00), b(kN * kK, 0x3e80);
  std::vector<float> c(kM * kN);
  for (auto _ : state) {
    nt_bf16(kM, kN, kK, a.data(), b.data(), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  set_rate(state, 2.0 * kM * kN * kK);
}

void layer1_forward_amx(benchmark::State& state) {
  if (const std::string why = amx_unusable(); !why.empty()) return state.SkipWithError(why.c_str());
  const std::vector<uint16_t> a = varied_bf16(int64_t{kM} * kK, 1),
                              b = varied_bf16(int64_t{kN} * kK, 2);
  std::vector<uint16_t> a_padded(int64_t{kM} * kKPadded, 0), b_pairs(int64_t{kN} * kKPadded);
  for (int i = 0; i < kM; ++i)
    std::memcpy(&a_padded[int64_t{i} * kKPadded], &a[int64_t{i} * kK], kK * 2);
  pack_pairs(kN, kK, kKPadded, b.data(), b_pairs.data());
  std::vector<float> c(kM * kN);
  nt_amx(kM, kN, kKPadded, a_padded.data(), b_pairs.data(), c.data());
  double worst = 0;  // against the same bf16 values multiplied in double
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double want = 0, scale = 0;
      for (int p = 0; p < kK; ++p) {
        const double term =
            double{from_bf16(a[int64_t{i} * kK + p])} * from_bf16(b[int64_t{j} * kK + p]);
        want += term;
        scale += std::fabs(term);
      }
      worst = std::fmax(worst, std::fabs(c[i * kN + j] - want) / (scale + 1e-30));
    }
  if (worst > 1e-4)  // fp32 sums of 784 terms: ~1e-6 typical; a wrong layout: ~1
    return state.SkipWithError(
        ("AMX product differs from the plain loop: relative error " + std::to_string(worst))
            .c_str());
  for (auto _ : state) {
    nt_amx(kM, kN, kKPadded, a_padded.data(), b_pairs.data(), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  set_rate(state, 2.0 * kM * kN * kK);
}

// What an AMX step adds each step: W1's half (64 x 784 bf16) into the pair layout, here in
// scalar code (an upper bound: a shuffle kernel would do it faster).
void pack_w1_pairs(benchmark::State& state) {
  const std::vector<uint16_t> b = varied_bf16(int64_t{kN} * kK, 2);
  std::vector<uint16_t> out(int64_t{kN} * kKPadded);
  for (auto _ : state) {
    pack_pairs(kN, kK, kKPadded, b.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_rate(state, double{kN} * kK);
}

// Per step and thread, a bf16 step converts its half of W1 (64 x 784) and the batch (64 x 784).
void convert_to_bf16(benchmark::State& state) {
  if (!cpu_has_bf16()) return state.SkipWithError("no AVX512_BF16");
  const int n = static_cast<int>(state.range(0));
  std::vector<float> in(n, 0.3f);
  std::vector<uint16_t> out(n);
  for (auto _ : state) {
    to_bf16(in.data(), out.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  set_rate(state, n);
}

// The library's kernels as the fused bf16 step calls them (common/bf16_gemm.h), per step thread:
// the forward from x's rows and W1's pairs of columns, dW1 from the pairs of rows, and the packing.
void library_bf16(benchmark::State& state) {
  namespace bf = spritetorch::bf16;
  if (!bf::available()) return state.SkipWithError("no AVX512_BF16");
  const int what = static_cast<int>(state.range(0));
  std::vector<float> x(kM * kK, 0.5f), w(kN * kK, 0.25f), dz(kM * kN, 0.01f), c(kN * kK),
      bias(kN, 0.1f);
  std::vector<uint16_t> x_rows(kM * kK), x_pairs(kM * kK), w_pairs(kN * kK), dz_pairs(kM * kN);
  bf::pack_row_pairs(x.data(), kM, kK, kK, x_pairs.data(), x_rows.data());
  bf::pack_col_pairs(w.data(), kN, kK, kK, w_pairs.data());
  bf::pack_row_pairs(dz.data(), kM, kN, kN, dz_pairs.data());
  for (auto _ : state) {
    switch (what) {
      case 0:
        bf::nt_pairs(kM, kN, kK, x_rows.data(), kK, w_pairs.data(), kN, c.data(), kN, bias.data(),
                     true);
        break;
      case 1:
        bf::tn(kN, kK, kM / 2, dz_pairs.data(), kN, x_pairs.data(), kK, c.data(), kK);
        break;
      case 2:
        spritetorch::gemm::nn(kN, kK, kM, dz.data(), 1, kN, x.data(), kK, c.data(), kK);
        break;
      case 3:
        bf::pack_col_pairs(w.data(), kN, kK, kK, w_pairs.data());
        break;
      case 4:
        bf::pack_row_pairs(x.data(), kM, kK, kK, x_pairs.data(), x_rows.data());
        break;
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::DoNotOptimize(w_pairs.data());
    benchmark::DoNotOptimize(x_pairs.data());
  }
  if (what <= 2) set_rate(state, 2.0 * kM * kN * kK);
}

BENCHMARK(layer1_forward_fp32_avx512);
BENCHMARK(layer1_forward_bf16);
BENCHMARK(layer1_forward_amx);
BENCHMARK(pack_w1_pairs);
BENCHMARK(convert_to_bf16)->Arg(kM* kK);
// 0 nt_pairs (the forward), 1 tn (dW1), 2 the fp32 dW1 (gemm::nn), 3 pack_col_pairs (W1's half),
// 4 pack_row_pairs with rows (x).
BENCHMARK(library_bf16)->DenseRange(0, 4);

}  // namespace

BENCHMARK_MAIN();
