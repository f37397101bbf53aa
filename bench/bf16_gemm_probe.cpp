// What a bf16 fused MLP step could gain on a CPU with AVX512_BF16 (vdpbf16ps), before writing one:
// the seed step's largest product (layer 1 forward, 64 x 64 x 784 per step thread) as an fp32
// AVX-512 kernel (common/small_gemm.h) against a bf16 dot-product kernel of the same blocking, and
// the fp32 -> bf16 conversions such a step would add each step (the batch and W1).
//
//   build/bench/bf16_gemm_probe        # skips every case on a CPU without AVX512_BF16
//
// One thread. Counters: GFLOP/s of the product (2 m n k per call) or elements/s of a conversion.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/small_gemm.h"

namespace {

constexpr int kM = 64, kN = 64, kK = 784;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PROBE_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
// GCC 12's AVX-512 headers trip -Wuninitialized once inlined (see common/small_gemm.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

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
#else
bool cpu_has_bf16() { return false; }
void to_bf16(const float*, uint16_t*, int) {}
void nt_bf16(int, int, int, const uint16_t*, const uint16_t*, float*) {}
#endif

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

BENCHMARK(layer1_forward_fp32_avx512);
BENCHMARK(layer1_forward_bf16);
BENCHMARK(convert_to_bf16)->Arg(kM* kK);

}  // namespace

BENCHMARK_MAIN();
