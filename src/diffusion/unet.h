// A small UNet for class-conditional denoising of sprites: (B, 4, S, S) noisy RGBA in [-1, 1], the
// timestep t and a class index in, the predicted noise (B, 4, S, S) out. Two resolutions below S
// (S/2, S/4; widths base x mult), residual blocks with GroupNorm + SiLU, optionally self-attention
// at S/4 and at S/2, a sinusoidal time embedding and a learned class embedding added into every
// block. Class index `classes` is the "no class" token that classifier-free guidance trains by
// dropping labels at random.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>

namespace spritetorch::diffusion {

struct UNetOptions {
  int64_t channels = 4;  // RGBA
  int64_t base = 16;     // channels per unit of `mult`
  // Channels at S, S/2 and S/4 are base x mult[0], [1], [2] (--unet-mult). A channel at S/4 costs
  // a sixteenth of the FLOPs of one at S, so width there is the cheapest capacity.
  std::array<int64_t, 3> mult = {1, 2, 2};
  int64_t classes = 4;     // real classes; the embedding has classes + 1 rows
  int64_t embed = 128;     // time / class embedding width
  bool attention = false;  // self-attention between the two S/4 blocks (whole-sprite layout)
  // Self-attention after the decoder's S/2 block (DDPM's 32 x 32 model attends at 16 x 16);
  // --unet-attention 2 sets it beside `attention`.
  bool attention_s2 = false;
  // The embedding (time + class) sets a scale and a shift of each block's second GroupNorm
  // (Dhariwal & Nichol 2021's adaptive GroupNorm) instead of being added before it.
  bool scale_shift = false;
};

// Multi-head self-attention over the H x W positions, residual: x + proj(attn(norm(x))). The
// projection starts at zero, so a new block is the identity.
class AttentionBlockImpl : public torch::nn::Module {
 public:
  AttentionBlockImpl(int64_t channels, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);  // (B, C, H, W) -> (B, C, H, W)
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d qkv{nullptr}, proj{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(AttentionBlock);

class ResBlockImpl : public torch::nn::Module {
 public:
  // scale_shift: see UNetOptions (emb_proj then gives 2 x out: scale, shift).
  ResBlockImpl(int64_t in, int64_t out, int64_t embed, bool scale_shift = false);
  // x: (B, in, H, W); emb: (B, embed) -> (B, out, H, W)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& emb);
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, skip{nullptr};
  torch::nn::Linear emb_proj{nullptr};

 private:
  bool scale_shift_ = false;
};
TORCH_MODULE(ResBlock);

class UNetImpl : public torch::nn::Module {
 public:
  explicit UNetImpl(const UNetOptions& options);
  // x: (B, 4, S, S) float32; t: (B) int64; c: (B) int64 in [0, classes] (classes = unconditional).
  // S must be divisible by 4. Returns the predicted noise (B, 4, S, S) in the weights' dtype: the
  // net runs in fp32 (under autocast where asked), or wholly in bf16 once converted to it.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& c);
  const UNetOptions& options() const { return options_; }
  // Activation checkpointing: while grad mode is on, each ResBlock keeps only its inputs and
  // recomputes its activations in backward (less memory, one more block forward per step). The
  // gradients are those of the plain forward.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

  torch::nn::Linear time1{nullptr}, time2{nullptr};
  torch::nn::Embedding class_embed{nullptr};
  torch::nn::Conv2d in_conv{nullptr}, down1{nullptr}, down2{nullptr}, out_conv{nullptr};
  ResBlock block1{nullptr}, block2{nullptr}, mid1{nullptr}, mid2{nullptr}, up2{nullptr},
      up1{nullptr};
  AttentionBlock mid_attn{nullptr};  // only with options.attention
  AttentionBlock up2_attn{nullptr};  // only with options.attention_s2
  torch::nn::GroupNorm out_norm{nullptr};

 private:
  UNetOptions options_;
  bool checkpointing_ = false;
};
TORCH_MODULE(UNet);

// block(x, emb) with activation checkpointing (models/activation_checkpoint.h): the forward keeps
// x and emb only, the backward runs the block again and differentiates it. ResBlocks draw no
// random numbers, so no generator state is kept.
torch::Tensor checkpointed_block(ResBlockImpl& block, const torch::Tensor& x,
                                 const torch::Tensor& emb);

// "1,2,4" <-> {1, 2, 4}. parse_unet_mult throws Error unless the text is three positive integers
// (each at most 16) separated by commas; unet_mult_problem says what is wrong with it ("'a':
// expected three whole numbers ...", empty when nothing), for a parser's own error line.
std::string unet_mult_text(const std::array<int64_t, 3>& mult);
std::array<int64_t, 3> parse_unet_mult(const std::string& text);
std::string unet_mult_problem(const std::string& text);

// x2 nearest-neighbour upsampling, (B, C, H, W) -> (B, C, 2H, 2W): upsample_nearest2d through the
// functional API, whose signature is the same in LibTorch 1.13 and 2.x. It replaced
// repeat_interleave on both axes (index_select forward, index_add backward): on a 2-core Zen 4,
// `generate` 1.2x faster in fp32 (1.1x bf16) and a training step 4% faster.
torch::Tensor upsample_nearest_x2(const torch::Tensor& x);

// Sinusoidal embedding of integer timesteps: (B) -> (B, dim) float32, on t's device.
torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim);

}  // namespace spritetorch::diffusion
