#include "diffusion/group_norm_silu.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPRITETORCH_NORM_AVX2 1
#endif

#include <atomic>
#include <cmath>
#include <vector>

#include "common/environment_switch.h"
#include "common/error.h"

// 1 where CMake built the CUDA kernels (cmake/SpritetorchCudaKernels.cmake defines it for this
// file).
#ifndef SPRITETORCH_WITH_CUDA_KERNELS
#define SPRITETORCH_WITH_CUDA_KERNELS 0
#endif
#if SPRITETORCH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>

#include "common/notes.h"
#include "diffusion/group_norm_silu_cuda.h"
#endif

namespace spritetorch::diffusion {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef SPRITETORCH_NORM_AVX2
// The AVX2 code serves the avx512 choice too: these passes are bound by memory and exp, not width.
bool vector_path(gemm::Kernel kernel) {
  return (kernel == gemm::Kernel::avx2 || kernel == gemm::Kernel::avx512) &&
         gemm::available(gemm::Kernel::avx2);
}
#endif

// ---- Plain loops (any x86 or other CPU) -------------------------------------------------------

void stats_loops(const float* x, int64_t n, double eps, float& mean, float& rstd) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double m = sum / static_cast<double>(n);
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += (x[i] - m) * (x[i] - m);
  mean = static_cast<float>(m);
  rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
}

// y = silu(a x + d)
void forward_loops(const float* x, float* y, int64_t n, float a, float d) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = a * x[i] + d;
    y[i] = z / (1.0f + std::exp(-z));
  }
}

// dz = dy silu'(a x + d), written to dz; the sums of dz and of dz (x - mean) come back.
void dz_loops(const float* dy, const float* x, float* dz, int64_t n, float a, float d, float mean,
              double& sum_dz, double& sum_dz_centred) {
  double s0 = 0, s1 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float z = a * x[i] + d;
    const float sig = 1.0f / (1.0f + std::exp(-z));
    const float g = dy[i] * sig * (1.0f + z * (1.0f - sig));
    dz[i] = g;
    s0 += g;
    s1 += g * (x[i] - mean);
  }
  sum_dz = s0;
  sum_dz_centred = s1;
}

// dx = alpha dz + gamma x + beta, dz read from and dx written to `dz_dx`.
void dx_loops(const float* x, float* dz_dx, int64_t n, float alpha, float gamma, float beta) {
  for (int64_t i = 0; i < n; ++i) dz_dx[i] = alpha * dz_dx[i] + gamma * x[i] + beta;
}

// ---- AVX2 + FMA, 8 lanes ------------------------------------------------------------------------

#ifdef SPRITETORCH_NORM_AVX2
#define SPRITETORCH_AVX2 __attribute__((target("avx2,fma")))

// e^x, Cephes' single-precision polynomial after reducing x to [-ln2/2, ln2/2] (within 2 ulp);
// x is clamped to [-87.3, 88] so that 2^n stays a normal float.
SPRITETORCH_AVX2 inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

SPRITETORCH_AVX2 inline __m256 sigmoid_avx2(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), z))));
}

SPRITETORCH_AVX2 double hsum_avx2(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  double s = 0;
  for (float f : lanes) s += f;
  return s;
}

SPRITETORCH_AVX2 void stats_avx2(const float* x, int64_t n, double eps, float& mean, float& rstd) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
  }
  double sum = hsum_avx2(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) sum += x[i];
  const double m = sum / static_cast<double>(n);
  const __m256 vm = _mm256_set1_ps(static_cast<float>(m));
  s0 = _mm256_setzero_ps();
  s1 = _mm256_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm);
    s0 = _mm256_fmadd_ps(d0, d0, s0);
    s1 = _mm256_fmadd_ps(d1, d1, s1);
  }
  double squares = hsum_avx2(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) squares += (x[i] - m) * (x[i] - m);
  mean = static_cast<float>(m);
  rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
}

SPRITETORCH_AVX2 void forward_avx2(const float* x, float* y, int64_t n, float a, float d) {
  const __m256 va = _mm256_set1_ps(a), vd = _mm256_set1_ps(d);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 z = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), vd);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(z, sigmoid_avx2(z)));
  }
  if (i < n) forward_loops(x + i, y + i, n - i, a, d);
}

SPRITETORCH_AVX2 void dz_avx2(const float* dy, const float* x, float* dz, int64_t n, float a,
                              float d, float mean, double& sum_dz, double& sum_dz_centred) {
  const __m256 va = _mm256_set1_ps(a), vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(mean);
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 z = _mm256_fmadd_ps(va, xv, vd);
    const __m256 sig = sigmoid_avx2(z);
    // silu'(z) = sig (1 + z (1 - sig))
    const __m256 slope = _mm256_mul_ps(sig, _mm256_fmadd_ps(z, _mm256_sub_ps(one, sig), one));
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(dy + i), slope);
    _mm256_storeu_ps(dz + i, g);
    s0 = _mm256_add_ps(s0, g);
    s1 = _mm256_fmadd_ps(g, _mm256_sub_ps(xv, vm), s1);
  }
  double tail0 = 0, tail1 = 0;
  if (i < n) dz_loops(dy + i, x + i, dz + i, n - i, a, d, mean, tail0, tail1);
  sum_dz = hsum_avx2(s0) + tail0;
  sum_dz_centred = hsum_avx2(s1) + tail1;
}

SPRITETORCH_AVX2 void dx_avx2(const float* x, float* dz_dx, int64_t n, float alpha, float gamma,
                              float beta) {
  const __m256 va = _mm256_set1_ps(alpha), vg = _mm256_set1_ps(gamma), vb = _mm256_set1_ps(beta);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 out = _mm256_fmadd_ps(va, _mm256_loadu_ps(dz_dx + i),
                                       _mm256_fmadd_ps(vg, _mm256_loadu_ps(x + i), vb));
    _mm256_storeu_ps(dz_dx + i, out);
  }
  if (i < n) dx_loops(x + i, dz_dx + i, n - i, alpha, gamma, beta);
}
#endif

// The four passes of one code path, chosen once per call of the op.
struct Passes {
  decltype(&stats_loops) stats;
  decltype(&forward_loops) forward;
  decltype(&dz_loops) dz;
  decltype(&dx_loops) dx;
};

const Passes& passes_for(gemm::Kernel kernel) {
  static const Passes loops = {stats_loops, forward_loops, dz_loops, dx_loops};
#ifdef SPRITETORCH_NORM_AVX2
  static const Passes avx2 = {stats_avx2, forward_avx2, dz_avx2, dx_avx2};
  if (vector_path(kernel)) return avx2;
#else
  (void)kernel;  // no vector code off x86
#endif
  return loops;
}

// ---- The operation ------------------------------------------------------------------------------

struct Shape {
  int64_t batch, channels, groups, pixels;  // pixels = H W
  int64_t per_group() const { return channels / groups; }
};

Shape shape_of(const torch::Tensor& x, int64_t groups) {
  return {x.size(0), x.size(1), groups, x.size(2) * x.size(3)};
}

// z = a x + d per (sample, channel): a = w (1 + s) rstd, d = b (1 + s) + shift - mean a.
// stats: (B, G, 2) mean and rstd. Returns (B C) a's followed by (B C) d's.
std::vector<float> affine(const Shape& s, const float* stats, const float* weight,
                          const float* bias, const float* scale, const float* shift) {
  const int64_t bc = s.batch * s.channels;
  std::vector<float> out(2 * static_cast<size_t>(bc));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t i = b * s.channels + c, g = b * s.groups + c / s.per_group();
      const float gain = 1.0f + (scale ? scale[i] : 0.0f);
      const float a = weight[c] * gain * stats[2 * g + 1];
      out[i] = a;
      out[bc + i] = bias[c] * gain + (shift ? shift[i] : 0.0f) - stats[2 * g] * a;
    }
  return out;
}

const float* data_or_null(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

struct GroupNormSiluFunction : torch::autograd::Function<GroupNormSiluFunction> {
  // x: (B, C, H, W) contiguous fp32; weight, bias: (C); scale, shift: (B, C) contiguous, or none
  // (optional: LibTorch 1.13's Function::apply refuses an undefined tensor). All fp32 on the CPU.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const c10::optional<torch::Tensor>& scale_or_none,
                               const c10::optional<torch::Tensor>& shift_or_none, int64_t groups,
                               double eps, int64_t kernel_index) {
    const auto scale = scale_or_none.value_or(torch::Tensor());
    const auto shift = shift_or_none.value_or(torch::Tensor());
    const Passes& passes = passes_for(static_cast<gemm::Kernel>(kernel_index));
    const Shape s = shape_of(x, groups);
    const int64_t n = s.per_group() * s.pixels;
    auto stats = torch::empty({s.batch, s.groups, 2}, x.options());  // mean, rstd
    const float* xp = x.data_ptr<float>();
    float* st = stats.data_ptr<float>();
    at::parallel_for(0, s.batch * s.groups, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g)
        passes.stats(xp + g * n, n, eps, st[2 * g], st[2 * g + 1]);
    });
    const auto coef = affine(s, st, weight.data_ptr<float>(), bias.data_ptr<float>(),
                             data_or_null(scale), data_or_null(shift));
    auto y = torch::empty_like(x);
    float* yp = y.data_ptr<float>();
    const int64_t bc = s.batch * s.channels;
    at::parallel_for(0, bc, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        passes.forward(xp + i * s.pixels, yp + i * s.pixels, s.pixels, coef[i], coef[bc + i]);
    });
    ctx->save_for_backward({x, weight, bias, scale, shift, stats});
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["kernel"] = kernel_index;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &bias = saved[2], &scale = saved[3],
               &shift = saved[4], &stats = saved[5];
    const Passes& passes = passes_for(static_cast<gemm::Kernel>(ctx->saved_data["kernel"].toInt()));
    const Shape s = shape_of(x, ctx->saved_data["groups"].toInt());
    const auto dy = grad_out[0].to(torch::kFloat32).contiguous();
    const float *xp = x.data_ptr<float>(), *dyp = dy.data_ptr<float>(),
                *st = stats.data_ptr<float>(), *w = weight.data_ptr<float>(),
                *bi = bias.data_ptr<float>(), *sc = data_or_null(scale);
    const auto coef = affine(s, st, w, bi, sc, data_or_null(shift));
    const int64_t bc = s.batch * s.channels, cg = s.per_group();

    // Pass 1, per (sample, channel): dz into dx's storage, D = sum dz, E = sum dz (x - mean).
    auto dx = torch::empty_like(x);
    float* dxp = dx.data_ptr<float>();
    std::vector<double> sum_dz(bc), sum_dz_centred(bc);
    at::parallel_for(0, bc, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t g = (i / s.channels) * s.groups + (i % s.channels) / cg;
        const int64_t at = i * s.pixels;
        passes.dz(dyp + at, xp + at, dxp + at, s.pixels, coef[i], coef[bc + i], st[2 * g],
                  sum_dz[i], sum_dz_centred[i]);
      }
    });

    // The (B, C)-sized algebra. With k = w (1 + s) and x_hat = (x - mean) rstd:
    //   dx = rstd (k dz - m1 - x_hat m2), m1 = mean over the group of k dz, m2 of k dz x_hat;
    //   dw = sum_b (1 + s) rstd E, db = sum_b (1 + s) D, dscale = w rstd E + b D, dshift = D.
    auto dweight = torch::zeros_like(weight), dbias = torch::zeros_like(bias);
    torch::Tensor dscale = scale.defined() ? torch::empty_like(scale) : torch::Tensor();
    torch::Tensor dshift = shift.defined() ? torch::empty_like(shift) : torch::Tensor();
    std::vector<double> dw(s.channels, 0.0), db(s.channels, 0.0);
    std::vector<float> gamma(bc), beta(bc);  // dx = a dz + gamma x + beta, a = coef[i]
    const double count = static_cast<double>(cg * s.pixels);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t g = 0; g < s.groups; ++g) {
        const double mean = st[2 * (b * s.groups + g)], rstd = st[2 * (b * s.groups + g) + 1];
        double m1 = 0, m2 = 0;
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c) {
          const int64_t i = b * s.channels + c;
          const double gain = 1.0 + (sc ? sc[i] : 0.0), k = w[c] * gain;
          m1 += k * sum_dz[i];
          m2 += k * rstd * sum_dz_centred[i];
          dw[c] += gain * rstd * sum_dz_centred[i];
          db[c] += gain * sum_dz[i];
          if (dscale.defined())
            dscale.data_ptr<float>()[i] =
                static_cast<float>(w[c] * rstd * sum_dz_centred[i] + bi[c] * sum_dz[i]);
          if (dshift.defined()) dshift.data_ptr<float>()[i] = static_cast<float>(sum_dz[i]);
        }
        m1 /= count;
        m2 /= count;
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c) {
          const int64_t i = b * s.channels + c;
          gamma[i] = static_cast<float>(-rstd * rstd * m2);
          beta[i] = static_cast<float>(rstd * rstd * m2 * mean - rstd * m1);
        }
      }
    for (int64_t c = 0; c < s.channels; ++c) {
      dweight.data_ptr<float>()[c] = static_cast<float>(dw[c]);
      dbias.data_ptr<float>()[c] = static_cast<float>(db[c]);
    }

    // Pass 2: dx = a dz + gamma x + beta, in place.
    at::parallel_for(0, bc, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        passes.dx(xp + i * s.pixels, dxp + i * s.pixels, s.pixels, coef[i], gamma[i], beta[i]);
    });
    return {dx, dweight, dbias, dscale, dshift, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// -1 until SPRITETORCH_GROUP_NORM_SILU is read (on first use, so that a bad value is an Error the
// CLI reports, not a throw during static initialisation); then 0 or 1.
std::atomic<int> fusion_on{-1};
// Set when a launch of the CUDA kernel failed (e.g. no code for this GPU): LibTorch's ops from
// then.
std::atomic<bool> cuda_kernel_failed{false};

}  // namespace

void set_group_norm_silu_fusion(bool on) { fusion_on = on ? 1 : 0; }
bool group_norm_silu_fusion() {
  if (fusion_on < 0)
    fusion_on = environment_switch("SPRITETORCH_GROUP_NORM_SILU", "LibTorch's ops",
                                   "spritetorch's fused kernels")
                    ? 1
                    : 0;
  return fusion_on == 1;
}

bool group_norm_silu_cuda_kernel_built() { return SPRITETORCH_WITH_CUDA_KERNELS != 0; }

bool group_norm_silu_cuda_kernel(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!group_norm_silu_cuda_kernel_built() || cuda_kernel_failed || !x.is_cuda() ||
      torch::GradMode::is_enabled() || !group_norm_silu_fusion())
    return false;
  const auto dtype = x.scalar_type();
  return (dtype == torch::kFloat32 || dtype == torch::kBFloat16) && x.dim() == 4 &&
         (x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast)) &&
         weight.scalar_type() == dtype && weight.device() == x.device();
}

// Without OpenMP at::parallel_for runs on one thread, where LibTorch's ops use all of them.
static bool can_use_every_thread() {
#if defined(SPRITETORCH_OPENMP) && defined(_OPENMP)
  return true;
#else
  return at::get_num_threads() == 1;
#endif
}

bool group_norm_silu_fused(const torch::Tensor& x, const torch::Tensor& weight) {
  return group_norm_silu_fusion() && can_use_every_thread() && x.device().is_cpu() &&
         x.scalar_type() == torch::kFloat32 && x.dim() == 4 && x.is_contiguous() &&
         weight.scalar_type() == torch::kFloat32;
}

torch::Tensor group_norm_silu_reference(const torch::Tensor& x, int64_t groups,
                                        const torch::Tensor& weight, const torch::Tensor& bias,
                                        double eps, const torch::Tensor& scale,
                                        const torch::Tensor& shift) {
  auto h = torch::group_norm(x, groups, weight, bias, eps);
  const auto per_channel = [&](const torch::Tensor& t) {
    return t.reshape({x.size(0), x.size(1), 1, 1});
  };
  if (scale.defined()) h = h * (1 + per_channel(scale));
  if (shift.defined()) h = h + per_channel(shift);
  return torch::silu(h);
}

#if SPRITETORCH_WITH_CUDA_KERNELS
namespace {

// The forward kernel on x's device and current stream (so a CUDA graph's capture takes it in), or
// an undefined tensor when the inputs fall outside it or its launch failed (then LibTorch's ops).
torch::Tensor group_norm_silu_on_cuda(const torch::Tensor& x, int64_t groups,
                                      const torch::Tensor& weight, const torch::Tensor& bias,
                                      double eps, const torch::Tensor& scale,
                                      const torch::Tensor& shift) {
  const int64_t batch = x.size(0), channels = x.size(1), hw = x.size(2) * x.size(3);
  // NCHW where x is both (one channel, or one pixel: the same memory either way).
  const auto layout = x.is_contiguous() ? cuda_kernels::Layout::nchw : cuda_kernels::Layout::nhwc;
  if (!cuda_kernels::group_norm_silu_fits(layout, batch, channels, hw, groups, x.data_ptr()) ||
      weight.numel() != channels || !bias.defined() || bias.numel() != channels)
    return {};
  // (C) and (B, C) operands in x's dtype on x's device; a (B, C) row may be a view into a wider
  // one.
  const auto vector_of = [&](const torch::Tensor& t) { return t.to(x.options()).contiguous(); };
  const auto rows_of = [&](const torch::Tensor& t) -> torch::Tensor {
    if (!t.defined()) return {};
    auto rows = t.reshape({batch, channels}).to(x.options());
    return rows.stride(1) == 1 ? rows : rows.contiguous();
  };
  const auto w = vector_of(weight), b = vector_of(bias);
  const auto s = rows_of(scale), h = rows_of(shift);
  auto y = torch::empty_like(x);  // in x's layout
  const c10::cuda::CUDAGuard device(x.device());
  const char* failure = cuda_kernels::group_norm_silu_forward(
      x.scalar_type() == torch::kBFloat16 ? cuda_kernels::Dtype::bf16 : cuda_kernels::Dtype::f32,
      layout, x.data_ptr(), w.data_ptr(), b.data_ptr(), s.defined() ? s.data_ptr() : nullptr,
      s.defined() ? s.stride(0) : 0, h.defined() ? h.data_ptr() : nullptr,
      h.defined() ? h.stride(0) : 0, y.data_ptr(), batch, channels, hw, groups,
      static_cast<float>(eps), c10::cuda::getCurrentCUDAStream().stream());
  if (!failure) return y;
  if (!cuda_kernel_failed.exchange(true))
    note(std::string("the fused CUDA GroupNorm + SiLU kernel did not launch (") + failure +
         "); LibTorch's ops from here on");
  return {};
}

}  // namespace
#endif

torch::Tensor group_norm_silu(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight,
                              const torch::Tensor& bias, double eps, const torch::Tensor& scale,
                              const torch::Tensor& shift, gemm::Kernel kernel) {
#if SPRITETORCH_WITH_CUDA_KERNELS
  if (group_norm_silu_cuda_kernel(x, weight)) {
    auto y = group_norm_silu_on_cuda(x, groups, weight, bias, eps, scale, shift);
    if (y.defined()) return y;
  }
#endif
  if (!group_norm_silu_fused(x, weight))
    return group_norm_silu_reference(x, groups, weight, bias, eps, scale, shift);
  if (groups < 1 || x.size(1) % groups != 0 || weight.numel() != x.size(1) ||
      bias.numel() != x.size(1))
    throw Error("group_norm_silu: " + std::to_string(x.size(1)) + " channels in " +
                std::to_string(groups) + " groups with " + std::to_string(weight.numel()) +
                " weights");
  const auto per_sample_channel = [&](const torch::Tensor& t) -> c10::optional<torch::Tensor> {
    if (!t.defined()) return c10::nullopt;
    return t.reshape({x.size(0), x.size(1)}).to(torch::kFloat32).contiguous();
  };
  return GroupNormSiluFunction::apply(x, weight, bias, per_sample_channel(scale),
                                      per_sample_channel(shift), groups, eps,
                                      static_cast<int64_t>(kernel));
}

}  // namespace spritetorch::diffusion
