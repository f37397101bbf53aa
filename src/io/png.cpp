#include "io/png.h"

#include <png.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"

namespace spritetorch::io {

namespace {

// Deflate cannot expand data by more than about 1032:1; a header that claims more pixels than the
// file could hold is corrupt, and we refuse it before allocating.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint32_t kMaxSide = 1u << 16;

std::string read_all(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError(path, "a PNG file", "a folder (a folder of sprites is --dataset folder:PATH)");
  check_input_file(path, "a readable PNG file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "a readable PNG file", "no such file or no permission");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

torch::Tensor decode_png(const std::string& bytes, const std::string& name) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (bytes.size() < 8 || png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) != 0)
    throw DataError(name, "a PNG file (signature 89 50 4E 47)",
                    bytes.size() < 8 ? std::to_string(bytes.size()) + " bytes" : "other bytes");
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    throw DataError(name, "a valid PNG header", std::string("libpng: ") + image.message);
  const uint64_t w = image.width, h = image.height;
  if (w == 0 || h == 0 || w > kMaxSide || h > kMaxSide) {
    png_image_free(&image);
    throw DataError(name, "width and height in 1.." + std::to_string(kMaxSide),
                    std::to_string(w) + "x" + std::to_string(h));
  }
  const uint64_t pixels = w * h;  // < 2^32: no overflow in 64 bits
  if (pixels > (static_cast<uint64_t>(bytes.size()) * kMaxDeflateRatio)) {
    png_image_free(&image);
    throw DataError(name,
                    "at most " + std::to_string(bytes.size() * kMaxDeflateRatio) +
                        " pixels for a file of " + std::to_string(bytes.size()) + " bytes",
                    std::to_string(w) + "x" + std::to_string(h) + " in its header");
  }
  image.format = PNG_FORMAT_RGBA;  // libpng expands palette, tRNS, grey and 16-bit to 8-bit RGBA
  auto out = torch::empty({static_cast<int64_t>(h), static_cast<int64_t>(w), 4}, torch::kUInt8);
  if (!png_image_finish_read(&image, /*background=*/nullptr, out.data_ptr<uint8_t>(),
                             /*row_stride=*/0, /*colormap=*/nullptr)) {
    const std::string message = image.message;
    png_image_free(&image);
    throw DataError(name, "complete PNG image data", "libpng: " + message,
                    "the file is truncated or corrupt; re-export it");
  }
  png_image_free(&image);
  return out;
}

torch::Tensor read_png(const std::string& path) { return decode_png(read_all(path), path); }

std::string encode_png(const torch::Tensor& image_in, const std::string& name) {
  if (image_in.dim() != 3 ||
      (image_in.size(2) != 4 && image_in.size(2) != 3 && image_in.size(2) != 1) ||
      image_in.scalar_type() != torch::kUInt8)
    throw Error("encoding " + name + " as PNG: expected (H, W, 4|3|1) uint8, found " +
                c10::str(image_in.sizes()) + " " + c10::toString(image_in.scalar_type()));
  const auto image = image_in.cpu().contiguous();
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.size(1));
  png.height = static_cast<png_uint_32>(image.size(0));
  const int64_t channels = image.size(2);
  png.format = channels == 4 ? PNG_FORMAT_RGBA : channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  png_alloc_size_t size = 0;
  if (!png_image_write_get_memory_size(png, size, 0, image.data_ptr<uint8_t>(), 0, nullptr))
    throw Error("cannot encode " + name + ": libpng: " + png.message);
  std::string bytes(size, '\0');
  if (!png_image_write_to_memory(&png, bytes.data(), &size, 0, image.data_ptr<uint8_t>(), 0,
                                 nullptr))
    throw Error("cannot encode " + name + ": libpng: " + png.message);
  bytes.resize(size);
  return bytes;
}

void write_png(const std::string& path, const torch::Tensor& image) {
  write_file_atomically(path, encode_png(image, path));
}

torch::Tensor upscale_nearest(const torch::Tensor& image, int64_t scale) {
  if (scale < 1) throw Error("--scale must be >= 1, got " + std::to_string(scale));
  if (scale == 1) return image;
  if (image.dim() == 3)  // (H, W, C)
    return image.repeat_interleave(scale, 0).repeat_interleave(scale, 1);
  return image.repeat_interleave(scale, -2).repeat_interleave(scale, -1);  // (N, C, H, W)
}

torch::Tensor resize_nearest(const torch::Tensor& images, int64_t size) {
  const int64_t h = images.size(2), w = images.size(3);
  if (h == size && w == size) return images;
  // Source index of each target pixel: floor((i + 0.5) * src / dst), the usual nearest rule.
  auto index = [](int64_t src, int64_t dst) {
    return ((torch::arange(dst, torch::kFloat64) + 0.5) * (static_cast<double>(src) / dst))
        .floor()
        .clamp_max(src - 1)
        .to(torch::kInt64);
  };
  return images.index_select(2, index(h, size).to(images.device()))
      .index_select(3, index(w, size).to(images.device()));
}

torch::Tensor resize_area(const torch::Tensor& images, int64_t size) {
  if (images.dim() != 4 || images.size(1) != 4 || images.scalar_type() != torch::kUInt8)
    throw Error("resize_area: expected (N, 4, H, W) uint8 sprites, got " +
                c10::str(images.sizes()) + " " + std::string(c10::toString(images.scalar_type())));
  const int64_t h = images.size(2), w = images.size(3);
  if (h <= size && w <= size) return resize_nearest(images, size);
  namespace F = torch::nn::functional;
  const auto pool = F::AdaptiveAvgPool2dFuncOptions({size, size});
  const auto x = images.to(torch::kFloat32);  // (N, 4, H, W) in [0, 255]
  const auto alpha = x.narrow(1, 3, 1) / 255.0f;
  const auto mean_alpha = F::adaptive_avg_pool2d(alpha, pool);                    // (N, 1, s, s)
  const auto weighted = F::adaptive_avg_pool2d(x.narrow(1, 0, 3) * alpha, pool);  // (N, 3, s, s)
  // An area with no opaque pixel has weighted = 0, so its colour comes out 0.
  const auto rgb = weighted / mean_alpha.clamp_min(1e-12);
  const auto a = images.narrow(1, 3, 1);
  const auto hard = ((a == 0) | (a == 255)).flatten(1).all(1).view({-1, 1, 1, 1});  // (N, 1, 1, 1)
  const auto out_alpha =
      torch::where(hard, (mean_alpha >= 0.5f).to(torch::kFloat32), mean_alpha) * 255.0f;
  return torch::cat({rgb, out_alpha}, 1).round().clamp(0, 255).to(torch::kUInt8);
}

torch::Tensor resize_sprites(const torch::Tensor& images, int64_t size, const std::string& method) {
  if (method == "area") return resize_area(images, size);
  if (method == "nearest") return resize_nearest(images, size);
  throw Error("unknown sprite resize '" + method + "': expected area or nearest");
}

namespace {

int64_t sheet_columns(int64_t n, const SheetOptions& options) {
  return options.columns > 0
             ? options.columns
             : std::max<int64_t>(
                   1, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n)))));
}

}  // namespace

void check_sheet_size(int64_t count, int64_t h, int64_t w, const SheetOptions& options) {
  const int64_t cols = sheet_columns(count, options), p = options.padding;
  const int64_t rows = std::max<int64_t>(1, (count + cols - 1) / cols);
  // In long double: the factors come from flags and may be absurd.
  const long double height = (static_cast<long double>(rows) * (h + p) + p) * options.scale;
  const long double width = (static_cast<long double>(cols) * (w + p) + p) * options.scale;
  if (height > kMaxSheetSide || width > kMaxSheetSide || height * width > kMaxSheetPixels)
    throw Error("a sheet of " + std::to_string(static_cast<uint64_t>(width)) + "x" +
                    std::to_string(static_cast<uint64_t>(height)) + " pixels: sheets are at most " +
                    std::to_string(kMaxSheetSide) + " pixels a side and " +
                    std::to_string(kMaxSheetPixels) + " pixels in all",
                "fewer sprites a row or in all, or a smaller --scale");
}

torch::Tensor make_sheet(const torch::Tensor& sprites_in, const SheetOptions& options) {
  if (sprites_in.dim() != 4 || sprites_in.size(1) != 4)
    throw Error("a sprite sheet needs (N, 4, H, W) sprites, found " + c10::str(sprites_in.sizes()));
  const auto sprites = sprites_in.cpu().to(torch::kUInt8);
  const int64_t n = sprites.size(0), h = sprites.size(2), w = sprites.size(3), p = options.padding;
  check_sheet_size(n, h, w, options);
  const int64_t cols = sheet_columns(n, options);
  const int64_t rows = std::max<int64_t>(1, (n + cols - 1) / cols);
  auto sheet = torch::zeros({rows * (h + p) + p, cols * (w + p) + p, 4}, torch::kUInt8);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t y = p + (i / cols) * (h + p), x = p + (i % cols) * (w + p);
    sheet.narrow(0, y, h).narrow(1, x, w).copy_(sprites[i].permute({1, 2, 0}));
  }
  return upscale_nearest(sheet, options.scale);
}

torch::Tensor make_sample_sheet(const torch::Tensor& sprites, int64_t per_class) {
  const int64_t size = sprites.dim() == 4 ? sprites.size(2) : 1;
  return make_sheet(sprites, {per_class, 1, std::max<int64_t>(1, 64 / std::max<int64_t>(size, 1))});
}

}  // namespace spritetorch::io
