#include "diffusion/unet.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "common/error.h"
#include "diffusion/group_norm_silu.h"
#include "models/activation_checkpoint.h"
#include "models/conv3x3.h"

namespace spritetorch::diffusion {

namespace {
int64_t groups_for(int64_t channels) { return channels % 8 == 0 ? 8 : 1; }
// GroupNorm in its weights' dtype. fp32 weights under bf16 autocast (training): the norm in fp32,
// as mixed precision wants normalisation (and LibTorch 1.13's CPU group_norm refuses bf16 inputs
// with fp32 weights). A UNet held in bf16 (sampling, bf16_copy): bf16 in and out, the statistics
// accumulated in fp32 inside the kernel. A no-op cast in fp32 runs.
torch::Tensor normalise(torch::nn::GroupNorm& norm, const torch::Tensor& x) {
  return norm(x.to(norm->weight.scalar_type()));
}
// silu(norm(x) (1 + scale) + shift) in the same dtype, one fused kernel on the CPU in fp32.
// scale, shift: (B, C, 1, 1) or undefined.
torch::Tensor normalise_silu(torch::nn::GroupNorm& norm, const torch::Tensor& x,
                             const torch::Tensor& scale = {}, const torch::Tensor& shift = {}) {
  return group_norm_silu(x.to(norm->weight.scalar_type()), norm->options.num_groups(), norm->weight,
                         norm->bias, norm->options.eps(), scale, shift);
}
}  // namespace

torch::Tensor checkpointed_block(ResBlockImpl& block, const torch::Tensor& x,
                                 const torch::Tensor& emb) {
  models::CheckpointOptions options;
  options.preserve_rng = false;  // a ResBlock draws no random numbers
  auto run = [&block](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{block.forward(in[0], in[1])};
  };
  return models::checkpointed(block, run, {x, emb}, options).at(0);
}

torch::Tensor upsample_nearest_x2(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{2 * x.size(2), 2 * x.size(3)})
                               .mode(torch::kNearest));
}

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(
      torch::arange(half, torch::TensorOptions().dtype(torch::kFloat32).device(t.device())) *
      (-std::log(10000.0) / static_cast<double>(half)));                // (dim/2)
  auto args = t.to(torch::kFloat32).unsqueeze(1) * freqs.unsqueeze(0);  // (B, dim/2)
  return torch::cat({args.sin(), args.cos()}, 1);                       // (B, dim)
}

ResBlockImpl::ResBlockImpl(int64_t in, int64_t out, int64_t embed, bool scale_shift)
    : scale_shift_(scale_shift) {
  using torch::nn::Conv2dOptions;
  norm1 = register_module("norm1", torch::nn::GroupNorm(groups_for(in), in));
  conv1 = register_module("conv1",
                          torch::nn::Conv2d(Conv2dOptions(in, out, /*kernel_size=*/3).padding(1)));
  emb_proj = register_module("emb_proj", torch::nn::Linear(embed, scale_shift ? 2 * out : out));
  norm2 = register_module("norm2", torch::nn::GroupNorm(groups_for(out), out));
  conv2 = register_module("conv2",
                          torch::nn::Conv2d(Conv2dOptions(out, out, /*kernel_size=*/3).padding(1)));
  if (in != out)
    skip = register_module("skip", torch::nn::Conv2d(Conv2dOptions(in, out, /*kernel_size=*/1)));
}

// The 3x3 convolutions go through models::conv3x3: spritetorch's AVX2 kernels where they run (fp32
// on an AVX2 CPU without AVX-512; 1.07-1.29x oneDNN's training step on a Zen 3, docs/sprites.md),
// else the layer's own forward.
torch::Tensor ResBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& emb) {
  auto h = models::conv3x3(*conv1, normalise_silu(norm1, x));
  const auto e = emb_proj(emb).unsqueeze(-1).unsqueeze(-1);  // (B, out or 2 out, 1, 1)
  if (scale_shift_) {
    const auto parts = e.chunk(2, 1);  // scale, shift: (B, out, 1, 1) each
    h = normalise_silu(norm2, h, parts[0], parts[1]);
  } else {
    h = normalise_silu(norm2, h + e);
  }
  h = models::conv3x3(*conv2, h);
  return h + (skip ? skip(x) : x);
}

AttentionBlockImpl::AttentionBlockImpl(int64_t channels, int64_t heads) : heads_(heads) {
  using torch::nn::Conv2dOptions;
  norm = register_module("norm", torch::nn::GroupNorm(groups_for(channels), channels));
  qkv = register_module("qkv", torch::nn::Conv2d(Conv2dOptions(channels, 3 * channels, 1)));
  proj = register_module("proj", torch::nn::Conv2d(Conv2dOptions(channels, channels, 1)));
  torch::NoGradGuard no_grad;
  proj->weight.zero_();
  proj->bias.zero_();
}

torch::Tensor AttentionBlockImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), n = x.size(2) * x.size(3), d = c / heads_;
  const auto qkv_out = qkv(normalise(norm, x)).reshape({b, 3, heads_, d, n});
  const auto q = qkv_out.select(1, 0), k = qkv_out.select(1, 1),
             v = qkv_out.select(1, 2);  // (B, h, d, N)
  // Scores and softmax in fp32 (bf16 autocast would round the logits); weights (B, h, N, N).
  const auto scores =
      torch::matmul(q.transpose(2, 3), k).to(torch::kFloat32) / std::sqrt(static_cast<double>(d));
  const auto weights = torch::softmax(scores, -1).to(v.scalar_type());
  const auto out = torch::matmul(v, weights.transpose(2, 3));  // (B, h, d, N)
  return x + proj(out.reshape({b, c, x.size(2), x.size(3)}));
}

UNetImpl::UNetImpl(const UNetOptions& o) : options_(o) {
  using torch::nn::Conv2dOptions;
  const int64_t c1 = o.base * o.mult[0], c2 = o.base * o.mult[1], c3 = o.base * o.mult[2];
  const int64_t e = o.embed;
  time1 = register_module("time1", torch::nn::Linear(e, e));
  time2 = register_module("time2", torch::nn::Linear(e, e));
  class_embed = register_module("class_embed", torch::nn::Embedding(o.classes + 1, e));
  in_conv =
      register_module("in_conv", torch::nn::Conv2d(Conv2dOptions(o.channels, c1, 3).padding(1)));
  block1 = register_module("block1", ResBlock(c1, c1, e, o.scale_shift));  // S
  down1 =
      register_module("down1", torch::nn::Conv2d(Conv2dOptions(c1, c1, 3).stride(2).padding(1)));
  block2 = register_module("block2", ResBlock(c1, c2, e, o.scale_shift));  // S/2
  down2 =
      register_module("down2", torch::nn::Conv2d(Conv2dOptions(c2, c2, 3).stride(2).padding(1)));
  mid1 = register_module("mid1", ResBlock(c2, c3, e, o.scale_shift));  // S/4
  if (o.attention)
    mid_attn = register_module("mid_attn", AttentionBlock(c3, std::max<int64_t>(1, c3 / 32)));
  mid2 = register_module("mid2", ResBlock(c3, c3, e, o.scale_shift));
  up2 = register_module("up2", ResBlock(c3 + c2, c2, e, o.scale_shift));  // S/2
  if (o.attention_s2)
    up2_attn = register_module("up2_attn", AttentionBlock(c2, std::max<int64_t>(1, c2 / 32)));
  up1 = register_module("up1", ResBlock(c2 + c1, c1, e, o.scale_shift));  // S
  out_norm = register_module("out_norm", torch::nn::GroupNorm(groups_for(c1), c1));
  out_conv =
      register_module("out_conv", torch::nn::Conv2d(Conv2dOptions(c1, o.channels, 3).padding(1)));
  // Start from "predict zero noise": a calmer first few hundred steps.
  torch::NoGradGuard no_grad;
  out_conv->weight.zero_();
  out_conv->bias.zero_();
}

torch::Tensor UNetImpl::forward(const torch::Tensor& x, const torch::Tensor& t,
                                const torch::Tensor& c) {
  // The weights' dtype: fp32, or bf16 for a UNet held in bf16 (the casts are no-ops in fp32).
  const auto dtype = in_conv->weight.scalar_type();
  auto emb = time2(torch::silu(time1(timestep_embedding(t, options_.embed).to(dtype))));  // (B, E)
  emb = torch::silu(emb + class_embed(c));
  const bool checkpoint = checkpointing_ && torch::GradMode::is_enabled();
  auto run = [&](ResBlock& block, const torch::Tensor& in) {
    return checkpoint ? checkpointed_block(*block, in, emb) : block(in, emb);
  };
  auto h0 = in_conv(x.to(dtype));    // (B, c1, S, S)
  auto h1 = run(block1, h0);         // (B, c1, S, S)
  auto h2 = run(block2, down1(h1));  // (B, c2, S/2, S/2)
  auto m = run(mid1, down2(h2));     // (B, c3, S/4, S/4)
  if (mid_attn) m = mid_attn(m);
  m = run(mid2, m);
  auto u2 = run(up2, torch::cat({upsample_nearest_x2(m), h2}, 1));  // (B, c2, S/2, S/2)
  if (up2_attn) u2 = up2_attn(u2);
  auto u1 = run(up1, torch::cat({upsample_nearest_x2(u2), h1}, 1));  // (B, c1, S, S)
  return out_conv(normalise_silu(out_norm, u1));  // (B, 4, S, S) in the weights' dtype
}

std::string unet_mult_text(const std::array<int64_t, 3>& mult) {
  return std::to_string(mult[0]) + "," + std::to_string(mult[1]) + "," + std::to_string(mult[2]);
}

namespace {

// The multipliers, or nullopt unless `text` is three whole numbers from 1 to 16 between commas.
std::optional<std::array<int64_t, 3>> read_unet_mult(const std::string& text) {
  std::array<int64_t, 3> mult{};
  size_t at = 0;
  for (size_t i = 0; i < mult.size(); ++i) {
    const size_t end = i + 1 < mult.size() ? text.find(',', at) : text.size();
    const std::string part = end == std::string::npos ? "" : text.substr(at, end - at);
    if (part.empty() || part.size() > 2 ||
        !std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return std::nullopt;
    mult[i] = std::stoll(part);
    if (mult[i] < 1 || mult[i] > 16) return std::nullopt;
    at = end + 1;
  }
  return mult;
}

}  // namespace

std::string unet_mult_problem(const std::string& text) {
  if (read_unet_mult(text)) return "";
  return "'" + text +
         "': expected three whole numbers from 1 to 16 separated by commas, the channel "
         "multipliers at S, S/2 and S/4 (e.g. 1,2,4)";
}

std::array<int64_t, 3> parse_unet_mult(const std::string& text) {
  const auto mult = read_unet_mult(text);
  if (!mult) throw Error("--unet-mult " + unet_mult_problem(text));
  return *mult;
}

}  // namespace spritetorch::diffusion
