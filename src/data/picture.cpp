#include "data/picture.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "io/png.h"

namespace spritetorch::data {

namespace {

// (1, C, h, w) float in [0, 255] -> (1, C, H, W) uint8: area means down, nearest neighbour up.
torch::Tensor scale_to(torch::Tensor x, int64_t height, int64_t width) {
  namespace F = torch::nn::functional;
  if (x.size(2) >= height && x.size(3) >= width)
    x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions({height, width}));
  else
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{height, width})
                              .mode(torch::kNearest));
  return x.round().clamp(0, 255).to(torch::kUInt8);
}

}  // namespace

bool takes_pictures(const std::vector<int64_t>& input_shape) {
  if (input_shape.size() != 3 || input_shape[1] <= 0 || input_shape[2] <= 0) return false;
  const int64_t channels = input_shape[0];
  return channels == 1 || channels == 3 || (channels == 4 && input_shape[1] == input_shape[2]);
}

torch::Tensor picture_to_input(const torch::Tensor& rgba, const std::vector<int64_t>& input_shape,
                               bool invert, const std::string& sprite_resize) {
  if (rgba.dim() != 3 || rgba.size(2) != 4 || rgba.scalar_type() != torch::kUInt8)
    throw Error("picture_to_input: expected (h, w, 4) uint8 RGBA pixels, got " +
                c10::str(rgba.sizes()) + " " + std::string(c10::toString(rgba.scalar_type())));
  if (!takes_pictures(input_shape))
    throw Error("this model takes inputs of shape " + c10::str(c10::IntArrayRef(input_shape)) +
                    ", not pictures",
                "classify works with image classifiers: (4, S, S) sprites, (1, H, W) or "
                "(3, H, W) pictures");
  const int64_t channels = input_shape[0];
  if (channels == 4)
    // Contiguous, as every batch a model sees: a picture already of the model's size comes back
    // from the resize as the permuted view of its pixels.
    return io::resize_sprites(rgba.permute({2, 0, 1}).unsqueeze(0), input_shape[1], sprite_resize)
        .contiguous();
  // In bands of about a million pixels: a large picture's float copies would otherwise take
  // several times its size. The values are the same either way (each is one pixel's own).
  const int64_t h = rgba.size(0), w = rgba.size(1);
  auto out = torch::empty({channels, h, w}, torch::kFloat32);  // (C, h, w) in [0, 255]
  const int64_t band = std::max<int64_t>(1, (int64_t{1} << 20) / w);
  for (int64_t y = 0; y < h; y += band) {
    const int64_t rows = std::min(band, h - y);
    const auto pixels = rgba.narrow(0, y, rows).permute({2, 0, 1}).to(torch::kFloat32);
    auto rgb = pixels.narrow(0, 0, 3);  // (3, rows, w) in [0, 255]
    if (invert) rgb = 255.0f - rgb;
    const auto alpha = pixels.narrow(0, 3, 1) / 255.0f;  // composited over black
    if (channels == 3) {
      out.narrow(1, y, rows).copy_(rgb * alpha);
    } else {
      const auto weights = torch::tensor({0.299f, 0.587f, 0.114f}).view({3, 1, 1});
      out.narrow(1, y, rows).copy_((rgb * weights).sum(0, /*keepdim=*/true) * alpha);
    }
  }
  return scale_to(out.unsqueeze(0), input_shape[1], input_shape[2]);
}

}  // namespace spritetorch::data
