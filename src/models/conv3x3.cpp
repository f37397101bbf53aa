#include "models/conv3x3.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SPRITETORCH_CONV_X86 1
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/compat.h"
#include "common/environment_switch.h"
#include "common/error.h"
#include "common/small_gemm.h"
#include "models/bn_relu_pool.h"

namespace spritetorch::models {

namespace {

// SPRITETORCH_CONV3X3: 1 (or unset) the kernels, 0 LibTorch's convolution.
bool kernels_from_environment() {
  return environment_switch("SPRITETORCH_CONV3X3", "LibTorch's 3x3 convolutions",
                            "spritetorch's AVX2 kernels");
}

// -1 until the environment is read (on first use: a bad value is an Error to report, not a throw
// during static initialisation); then 0 or 1.
std::atomic<int> kernels_on{-1};

#ifdef SPRITETORCH_CONV_X86
#define SPRITETORCH_AVX2 __attribute__((target("avx2,fma")))
// Loops over a block's registers, unrolled before GCC decides what lives in memory.
#define SPRITETORCH_UNROLL _Pragma("GCC unroll 16")

// One image's geometry: H x W pixels, padded to (H + 2) x (W + 2) with a zero border.
struct Plane {
  int h, w;
  int padded_pixels() const { return (h + 2) * (w + 2); }
};

// MR consecutive output pixels x 8 NV output channels: out[i][0, 8 NV) = bias + sum over the
// taps t and input channels c of in[i][tap[t] + c] * w[(t cin + c) ldw + (0, 8 NV)]. in[i] is
// pixel i's top-left tap in the padded image (channels innermost); w points at the panel's first
// column of the packed weights (9 cin rows: tap-major, then input channel). 12 sums, 2 weight
// vectors and 1 broadcast input: 15 of the 16 registers at MR = 6, NV = 2.
template <int MR, int NV>
SPRITETORCH_AVX2 void pixel_block(int cin, const float* const* in, const int* tap, const float* w,
                                  int ldw, const float* bias, float* out, int ldo) {
  __m256 acc[MR][NV];
  SPRITETORCH_UNROLL
  for (int v = 0; v < NV; ++v) {
    const __m256 b = bias ? _mm256_loadu_ps(bias + 8 * v) : _mm256_setzero_ps();
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) acc[i][v] = b;
  }
  for (int t = 0; t < 9; ++t) {
    const float* a[MR];
    SPRITETORCH_UNROLL
    for (int i = 0; i < MR; ++i) a[i] = in[i] + tap[t];
    const float* wt = w + int64_t{t} * cin * ldw;
    for (int c = 0; c < cin; ++c) {
      __m256 wv[NV];
      SPRITETORCH_UNROLL
      for (int v = 0; v < NV; ++v) wv[v] = _mm256_loadu_ps(wt + int64_t{c} * ldw + 8 * v);
      SPRITETORCH_UNROLL
      for (int i = 0; i < MR; ++i) {
        const __m256 ai = _mm256_broadcast_ss(a[i] + c);
        SPRITETORCH_UNROLL
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(ai, wv[v], acc[i][v]);
      }
    }
  }
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + int64_t{i} * ldo + 8 * v, acc[i][v]);
}

using PixelBlock = void (*)(int, const float* const*, const int*, const float*, int, const float*,
                            float*, int);
constexpr int kPixels = 6, kPanelVectors = 2;
constexpr PixelBlock kPixelBlocks[kPixels][kPanelVectors] = {
    {pixel_block<1, 1>, pixel_block<1, 2>}, {pixel_block<2, 1>, pixel_block<2, 2>},
    {pixel_block<3, 1>, pixel_block<3, 2>}, {pixel_block<4, 1>, pixel_block<4, 2>},
    {pixel_block<5, 1>, pixel_block<5, 2>}, {pixel_block<6, 1>, pixel_block<6, 2>}};

// The 9 taps' offsets (floats) from a pixel's top-left tap in a padded image of `channels`.
std::array<int, 9> tap_offsets(const Plane& plane, int channels) {
  std::array<int, 9> tap{};
  for (int kh = 0; kh < 3; ++kh)
    for (int kw = 0; kw < 3; ++kw) tap[kh * 3 + kw] = (kh * (plane.w + 2) + kw) * channels;
  return tap;
}

// One image: out (H W, cout) = the 3x3 convolution of the padded image (H + 2, W + 2, cin) with
// the packed weights w (9 cin, cout). Panels of 16 output channels outside, so that the panel
// (9 cin x 16 floats: 9 KB at cin 16, 18 KB at 32) and the image stay in L1 while the pixels pass.
SPRITETORCH_AVX2 void conv_image(const Plane& plane, int cin, int cout, const float* padded,
                                 const float* w, const float* bias, float* out) {
  const std::array<int, 9> tap = tap_offsets(plane, cin);
  const int pixels = plane.h * plane.w;
  // Blocks of nearly equal size (49 pixels: 4 of 6 and 5 of 5, not 8 of 6 and 1): below 4 pixels
  // a block's FMAs wait on each other's latency, and one pixel alone costs about four.
  const int blocks = (pixels + kPixels - 1) / kPixels;
  for (int co = 0; co < cout; co += 8 * kPanelVectors) {
    const int vectors = std::min(kPanelVectors, (cout - co) / 8);
    for (int block = 0; block < blocks; ++block) {
      const int p = pixels * block / blocks;
      const int mr = pixels * (block + 1) / blocks - p;
      const float* in[kPixels];
      for (int i = 0; i < mr; ++i) {
        const int y = (p + i) / plane.w, x = (p + i) % plane.w;
        in[i] = padded + int64_t{y * (plane.w + 2) + x} * cin;
      }
      kPixelBlocks[mr - 1][vectors - 1](cin, in, tap.data(), w + co, cout,
                                        bias ? bias + co : nullptr, out + int64_t{p} * cout + co,
                                        cout);
    }
  }
}

// The weight gradient's block: dw[i][8 v ..] (MR output channels x NV vectors of the 9 cin
// (tap, channel) columns) += sum over the pixels of the image's rows [rows_begin, rows_end) of
// dy[pixel][i] * padded[pixel's top-left tap + col[v] ..]. dy points at the block's first output
// channel; col[v] = the tap's offset + the vector's first channel (cin is a multiple of 8, so a
// vector never straddles two taps). 12 sums, 3 input vectors and 1 broadcast: all 16 registers at
// MR = 4, NV = 3.
template <int MR, int NV>
SPRITETORCH_AVX2 void weight_block(const Plane& plane, int rows_begin, int rows_end, int cin,
                                   const float* dy, int ldy, const float* padded, const int* col,
                                   float* dw, int lddw) {
  __m256 acc[MR][NV];
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_loadu_ps(dw + int64_t{i} * lddw + 8 * v);
  for (int y = rows_begin; y < rows_end; ++y) {
    const float* d = dy + int64_t{y} * plane.w * ldy;
    const float* row = padded + int64_t{y} * (plane.w + 2) * cin;
    for (int x = 0; x < plane.w; ++x, d += ldy, row += cin) {
      __m256 xv[NV];
      SPRITETORCH_UNROLL
      for (int v = 0; v < NV; ++v) xv[v] = _mm256_loadu_ps(row + col[v]);
      SPRITETORCH_UNROLL
      for (int i = 0; i < MR; ++i) {
        const __m256 di = _mm256_broadcast_ss(d + i);
        SPRITETORCH_UNROLL
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(di, xv[v], acc[i][v]);
      }
    }
  }
  SPRITETORCH_UNROLL
  for (int i = 0; i < MR; ++i) SPRITETORCH_UNROLL
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(dw + int64_t{i} * lddw + 8 * v, acc[i][v]);
}

constexpr int kWeightRows = 4, kWeightVectors = 3;
// The padded input rows a weight-gradient strip spans: ~1/3 of a 512 KB L2, beside dy's rows.
constexpr int64_t kWeightStripBytes = 160 * 1024;

// One image's share of the weight gradient: dw (cout, 9 cin) += dy (H W, cout)^T x the image's
// (tap, channel) columns. cout is a multiple of 8 (so of 4) and 9 cin / 8 of 9 (so of 3).
SPRITETORCH_AVX2 void weight_grad_image(const Plane& plane, int cin, int cout, const float* padded,
                                        const float* dy, float* dw) {
  const std::array<int, 9> tap = tap_offsets(plane, cin);
  const int columns = 9 * cin;
  // Strips of rows whose padded input (the strip's rows and the two around them) stays in L2
  // while every block passes over it: a whole padded 32 x 32 x 96 image (444 KB) came from L3 for
  // each block (the whole convolution 1.08x slower at that shape; docs/sprites.md).
  const int64_t row_bytes = int64_t{plane.w + 2} * cin * static_cast<int64_t>(sizeof(float));
  const int strip = static_cast<int>(std::max<int64_t>(1, kWeightStripBytes / row_bytes - 2));
  for (int y0 = 0; y0 < plane.h; y0 += strip) {
    const int y1 = std::min(plane.h, y0 + strip);
    for (int q = 0; q < columns; q += 8 * kWeightVectors) {
      int col[kWeightVectors];
      for (int v = 0; v < kWeightVectors; ++v) {
        const int c = q + 8 * v;
        col[v] = tap[c / cin] + c % cin;
      }
      for (int co = 0; co < cout; co += kWeightRows)
        weight_block<kWeightRows, kWeightVectors>(plane, y0, y1, cin, dy + co, cout, padded, col,
                                                  dw + int64_t{co} * columns + q, columns);
    }
  }
}
// The 8 x 8 block rows[0..8) (8 floats each) transposed in place: rows[j][i] = old rows[i][j].
SPRITETORCH_AVX2 inline void transpose8(__m256 rows[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    rows[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    rows[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// dst[r][c] = src[c][r] for r < rows, c < cols: src has a row stride of `lds` floats, dst of
// `ldd`. Blocks of 8 x 8 through registers; what is left past the last whole block, singly.
SPRITETORCH_AVX2 void transpose(const float* src, int64_t lds, int rows, int cols, float* dst,
                                int64_t ldd) {
  const int rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int r = 0; r < rows8; r += 8)
    for (int c = 0; c < cols8; c += 8) {
      __m256 block[8];
      for (int i = 0; i < 8; ++i) block[i] = _mm256_loadu_ps(src + (c + i) * lds + r);
      transpose8(block);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (r + i) * ldd + c, block[i]);
    }
  for (int r = 0; r < rows; ++r)
    for (int c = r < rows8 ? cols8 : 0; c < cols; ++c) dst[r * ldd + c] = src[c * lds + r];
}

// A batch of images in, (B, C', H, W) out, channels_last or NCHW (both alike), as the kernels
// index them: they work in (H, W, C) per image, so an NCHW image is transposed on its way into a
// thread's buffer and its result on the way out, which stays in cache.
struct Images {
  int64_t batch;
  int cin, cout;
  Plane plane;
  int64_t in_image, out_image;  // floats per image in and out
  bool nchw;
};
Images images_of(const torch::Tensor& in, int64_t out_channels, bool nchw) {
  Images m{in.size(0),
           static_cast<int>(in.size(1)),
           static_cast<int>(out_channels),
           Plane{static_cast<int>(in.size(2)), static_cast<int>(in.size(3))},
           0,
           0,
           nchw};
  m.in_image = int64_t{m.plane.h} * m.plane.w * m.cin;
  m.out_image = int64_t{m.plane.h} * m.plane.w * m.cout;
  return m;
}

// Copies an image of c channels (H, W, C), or (C, H, W) with nchw, into the interior of `padded`
// ((H + 2) x (W + 2) x C, border zero).
SPRITETORCH_AVX2 void pad_image(const float* image, const Plane& plane, int c, bool nchw,
                                float* padded) {
  const int h = plane.h, w = plane.w;
  for (int y = 0; y < h; ++y) {
    float* row = padded + (static_cast<int64_t>(y + 1) * (w + 2) + 1) * c;
    if (nchw)  // (C, W) of this row -> (W, C)
      transpose(image + int64_t{y} * w, int64_t{h} * w, w, c, row, c);
    else
      std::memcpy(row, image + int64_t{y} * w * c, static_cast<size_t>(w) * c * sizeof(float));
  }
}

// An image of c channels in (H, W, C): `image` itself, or for nchw its transpose in `scratch`.
SPRITETORCH_AVX2 const float* image_hwc(const float* image, const Plane& plane, int c, bool nchw,
                                        float* scratch) {
  if (!nchw) return image;
  const int pixels = plane.h * plane.w;
  transpose(image, pixels, pixels, c, scratch, c);
  return scratch;
}

// Images per weight-gradient group: each group sums into its own buffer, and the groups are
// added in order, so the result does not depend on the threads.
constexpr int64_t kWeightGroups = 8;
#endif  // SPRITETORCH_CONV_X86

// out (B, cout, H, W) = the convolution of in (B, cin, H, W) with the packed weights (9 cin, cout)
// [+ bias], both channels_last or both NCHW contiguous (nchw), one image at a time over LibTorch's
// threads.
void convolve(const torch::Tensor& in, const torch::Tensor& packed, const torch::Tensor& bias,
              bool nchw, torch::Tensor& out) {
#ifdef SPRITETORCH_CONV_X86
  const Images m = images_of(in, out.size(1), nchw);
  const float* x = in.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* y = out.data_ptr<float>();
  at::parallel_for(0, m.batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> padded(static_cast<size_t>(m.plane.padded_pixels()) * m.cin, 0.0f);
    std::vector<float> result(m.nchw ? static_cast<size_t>(m.out_image) : 0);  // (H W, cout)
    const int pixels = m.plane.h * m.plane.w;
    for (int64_t n = begin; n < end; ++n) {
      pad_image(x + n * m.in_image, m.plane, m.cin, m.nchw, padded.data());
      float* image_out = y + n * m.out_image;
      conv_image(m.plane, m.cin, m.cout, padded.data(), w, b, m.nchw ? result.data() : image_out);
      if (m.nchw) transpose(result.data(), m.cout, m.cout, pixels, image_out, pixels);
    }
  });
#else
  (void)in, (void)packed, (void)bias, (void)nchw, (void)out;
  throw Error("conv3x3: the AVX2 kernels are not built for this CPU");
#endif
}

// dw (cout, 3, 3, cin) and, with want_db, db (cout) from x and dy, both channels_last or both
// NCHW contiguous (nchw).
void weight_gradients(const torch::Tensor& x, const torch::Tensor& dy, bool nchw, bool want_db,
                      torch::Tensor& dw, torch::Tensor& db) {
#ifdef SPRITETORCH_CONV_X86
  const Images m = images_of(x, dy.size(1), nchw);
  const int64_t groups = std::min(m.batch, kWeightGroups);
  const int64_t weights = int64_t{m.cout} * 9 * m.cin, size = weights + m.cout;
  // (groups, weights + cout): each group's weight gradient, then its bias gradient.
  auto partial = torch::zeros({groups, size}, x.options());
  const float* xs = x.data_ptr<float>();
  const float* dys = dy.data_ptr<float>();
  float* parts = partial.data_ptr<float>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> padded(static_cast<size_t>(m.plane.padded_pixels()) * m.cin, 0.0f);
    std::vector<float> dy_hwc(m.nchw ? static_cast<size_t>(m.out_image) : 0);
    for (int64_t g = begin; g < end; ++g) {
      float* w = parts + g * size;
      float* b = w + weights;
      for (int64_t n = m.batch * g / groups; n < m.batch * (g + 1) / groups; ++n) {
        pad_image(xs + n * m.in_image, m.plane, m.cin, m.nchw, padded.data());
        const float* d = image_hwc(dys + n * m.out_image, m.plane, m.cout, m.nchw, dy_hwc.data());
        weight_grad_image(m.plane, m.cin, m.cout, padded.data(), d, w);
        if (want_db)
          for (int64_t p = 0; p < int64_t{m.plane.h} * m.plane.w; ++p, d += m.cout)
            for (int c = 0; c < m.cout; ++c) b[c] += d[c];
      }
    }
  });
  // The groups added in order into the first.
  for (int64_t g = 1; g < groups; ++g) {
    const float* part = parts + g * size;
    for (int64_t i = 0; i < size; ++i) parts[i] += part[i];
  }
  const auto total = partial[0];
  dw = total.narrow(0, 0, weights).view({m.cout, 3, 3, m.cin});
  if (want_db) db = total.narrow(0, weights, m.cout);
#else
  (void)x, (void)dy, (void)nchw, (void)want_db, (void)dw, (void)db;
  throw Error("conv3x3: the AVX2 kernels are not built for this CPU");
#endif
}

// Whether x takes the NCHW form of the kernels: NCHW contiguous and not also channels_last
// contiguous (a tensor with one channel or one pixel is both; it keeps channels_last's).
bool takes_nchw(const torch::Tensor& x) {
  return x.is_contiguous() && !x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// Forward packs the weights as (tap, cin, cout); backward's input gradient convolves dy with them
// flipped and transposed, (tap, cout, cin). x, the result and the gradients keep x's layout.
class Conv3x3Function : public torch::autograd::Function<Conv3x3Function> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias_or_none) {
    // (LibTorch's custom functions take no undefined tensor among their inputs: an optional one.)
    const torch::Tensor bias = bias_or_none ? *bias_or_none : torch::Tensor();
    const bool nchw = takes_nchw(x);
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias"] = bias.defined();
    ctx->saved_data["nchw"] = nchw;
    auto out = torch::empty({x.size(0), weight.size(0), x.size(2), x.size(3)},
                            x.options().memory_format(layout(nchw)));
    convolve(x, weight.permute({2, 3, 1, 0}).contiguous(), bias, nchw, out);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const bool nchw = ctx->saved_data["nchw"].toBool();
    const torch::Tensor dy = grads[0].contiguous(layout(nchw));
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x, x.options().memory_format(layout(nchw)));
      convolve(dy, weight.flip({2, 3}).permute({2, 3, 0, 1}).contiguous(), torch::Tensor(), nchw,
               dx);
    }
    // needs_input_grad counts the tensor inputs only: without a bias there is no third.
    const bool want_db = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    if (ctx->needs_input_grad(1) || want_db) {
      torch::Tensor dw_nhwc, bias_grad;
      weight_gradients(x, dy, nchw, want_db, dw_nhwc, bias_grad);
      if (ctx->needs_input_grad(1)) dw = dw_nhwc.permute({0, 3, 1, 2});  // (cout, cin, 3, 3)
      if (want_db) db = bias_grad;
    }
    return {dx, dw, db};
  }

 private:
  static at::MemoryFormat layout(bool nchw) {
    return nchw ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast;
  }
};

bool is_pair(const torch::ExpandingArray<2>& a, int64_t value) {
  return (*a)[0] == value && (*a)[1] == value;
}

}  // namespace

torch::Tensor conv3x3_avx2(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias) {
  return Conv3x3Function::apply(x, weight,
                                bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt);
}

void set_conv3x3_kernel(bool on) { kernels_on = on ? 1 : 0; }

bool conv3x3_kernel() {
  if (kernels_on < 0) kernels_on = kernels_from_environment() ? 1 : 0;
  return kernels_on == 1;
}

// The kernels on, built, and the avx2 matrix kernel selected (what conv3x3_code says).
static bool kernels_selected() {
#ifdef SPRITETORCH_CONV_X86
  return conv3x3_kernel() && gemm::best_kernel() == gemm::Kernel::avx2;
#else
  return false;
#endif
}

std::string conv3x3_code() { return kernels_selected() ? "avx2" : "off"; }

bool conv3x3_fused(const torch::nn::Conv2dImpl& conv, const torch::Tensor& x) {
  if (!kernels_selected() || !fused_ops_use_these_threads()) return false;
  const auto& o = conv.options;
  const auto* padding = compat::variant_get_if<torch::ExpandingArray<2>>(o.padding());
  if (!is_pair(o.kernel_size(), 3) || !is_pair(o.stride(), 1) || !padding ||
      !is_pair(*padding, 1) || !is_pair(o.dilation(), 1) || o.groups() != 1 || o.transposed() ||
      !compat::variant_holds<torch::enumtype::kZeros>(o.padding_mode()))
    return false;
  const auto& w = conv.weight;
  const auto& b = conv.bias;
  if (!w.defined() || !w.is_cpu() || w.scalar_type() != torch::kFloat32 || w.dim() != 4)
    return false;
  if (b.defined() && (!b.is_cpu() || b.scalar_type() != torch::kFloat32 || !b.is_contiguous()))
    return false;
  if (w.size(0) % 8 != 0 || w.size(1) % 8 != 0) return false;
  if (compat::autocast_enabled(c10::DeviceType::CPU)) return false;
  if (!x.defined() || !x.is_cpu() || x.scalar_type() != torch::kFloat32 || x.dim() != 4 ||
      x.size(1) != w.size(1) || x.size(0) == 0 || x.size(2) == 0 || x.size(3) == 0 ||
      !(x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.is_contiguous()))
    return false;
  // The kernels index images and packed weights with int offsets.
  const int64_t plane = (x.size(2) + 2) * (x.size(3) + 2);
  return plane * std::max(w.size(0), w.size(1)) < (int64_t{1} << 30);
}

torch::Tensor conv3x3(torch::nn::Conv2dImpl& conv, const torch::Tensor& x) {
  if (conv3x3_fused(conv, x)) return conv3x3_avx2(x, conv.weight, conv.bias);
  return conv.forward(x);
}

}  // namespace spritetorch::models
