#include "io/png.h"

#include <png.h>

#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/notes.h"

namespace spritetorch::io {

namespace {

// Deflate cannot expand data by more than about 1032:1; a header that claims more raw image bytes
// than the file could hold is corrupt, and we refuse it before allocating.
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

// What libpng's callbacks see of one decode. libpng reports a fatal error by longjmp, which must
// not cross a frame holding C++ objects with destructors: each call that can fail runs in one of
// the small functions below, under its own setjmp, with plain locals only.
struct PngSource {
  const unsigned char* data = nullptr;
  size_t size = 0, offset = 0;
  char error[256] = {};
  std::vector<std::string>* warnings = nullptr;
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->error, sizeof source->error, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  if (source->warnings->size() < 8)
    source->warnings->push_back(std::string("libpng: ") + message +
                                " (read as libpng recovered it)");
}

void read_from_memory(png_structp png, png_bytep out, size_t count) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (count > source->size - source->offset) png_error(png, "the file ends inside a chunk");
  std::memcpy(out, source->data + source->offset, count);
  source->offset += count;
}

// The ancillary chunks that say how to show the colours (gamma, chromaticities, ICC profile, ...)
// or carry text: a sprite's pixel values are taken as they are stored, so these are skipped
// unread, and a damaged one costs nothing (libpng would warn about profiles that many editors
// write, "iCCP: known incorrect sRGB profile").
constexpr char kUnusedChunks[] =
    "bKGD\0cHRM\0eXIf\0gAMA\0hIST\0iCCP\0iTXt\0oFFs\0pCAL\0pHYs\0sBIT\0sCAL\0sPLT\0sRGB\0tEXt\0"
    "tIME\0zTXt";
constexpr int kUnusedChunkCount = 17;

bool read_png_header(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER,
                              reinterpret_cast<png_const_bytep>(kUnusedChunks), kUnusedChunkCount);
  png_set_user_limits(png, kMaxSide, kMaxSide);
  png_read_info(png, info);
  return true;
}

// Every colour type but palette to 8-bit RGBA, values as stored (no gamma): tRNS expanded to
// alpha, grey of 1-4 bits scaled up to 8, 16-bit samples rounded to 8 (v / 257), grey copied to
// R, G and B, opaque alpha added where the file has none. A palette image gives one index a byte
// (it is looked up by palette_to_rgba, which sees indices past the palette). Interlaced files
// are de-interlaced.
bool set_transforms(png_structp png, png_infop info, bool indexed) {
  if (setjmp(png_jmpbuf(png))) return false;
  if (indexed) {
    png_set_packing(png);
  } else {
    png_set_expand(png);
    png_set_scale_16(png);
    png_set_gray_to_rgb(png);
    png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  return true;
}

bool read_png_rows(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  return true;
}

// (h, w, 1) palette indices -> (h, w, 4) RGBA through the PLTE and tRNS chunks. An index past
// the palette is opaque black (as libpng reads it) and said in `warnings`: libpng itself does
// not check 8-bit indices.
torch::Tensor palette_to_rgba(png_structp png, png_infop info, const torch::Tensor& indices,
                              std::vector<std::string>& warnings) {
  png_colorp palette = nullptr;
  int colours = 0;
  png_get_PLTE(png, info, &palette, &colours);
  png_bytep alpha = nullptr;
  int alphas = 0;
  png_get_tRNS(png, info, &alpha, &alphas, nullptr);
  auto table = torch::zeros({256, 4}, torch::kUInt8);  // index -> RGBA
  auto* entry = table.data_ptr<uint8_t>();
  for (int i = 0; i < 256; ++i, entry += 4) {
    if (i < colours)
      entry[0] = palette[i].red, entry[1] = palette[i].green, entry[2] = palette[i].blue;
    entry[3] = i < alphas && i < colours ? alpha[i] : 255;
  }
  const auto flat = indices.flatten().to(torch::kInt64);
  const int64_t largest = flat.max().item<int64_t>();
  if (largest >= colours)
    warnings.push_back("palette index " + std::to_string(largest) + " past the palette's " +
                       std::to_string(colours) + " colours (read as opaque black)");
  return table.index_select(0, flat).view({indices.size(0), indices.size(1), 4});
}

struct PngReader {  // frees libpng's structures however the decode ends
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

}  // namespace

torch::Tensor decode_png(const std::string& bytes, const std::string& name,
                         std::vector<std::string>* warnings) {
  if (bytes.size() < 8 || png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) != 0)
    throw DataError(name, "a PNG file (signature 89 50 4E 47)",
                    bytes.size() < 8 ? std::to_string(bytes.size()) + " bytes" : "other bytes");
  std::vector<std::string> own_warnings;
  PngSource source;
  source.data = reinterpret_cast<const unsigned char*>(bytes.data());
  source.size = bytes.size();
  source.warnings = warnings ? warnings : &own_warnings;
  PngReader reader;
  reader.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, on_png_error, on_png_warning);
  if (reader.png) reader.info = png_create_info_struct(reader.png);
  if (!reader.png || !reader.info) throw std::bad_alloc();
  png_set_read_fn(reader.png, &source, read_from_memory);
  if (!read_png_header(reader.png, reader.info))
    throw DataError(name, "a valid PNG header", std::string("libpng: ") + source.error);

  const uint64_t w = png_get_image_width(reader.png, reader.info);
  const uint64_t h = png_get_image_height(reader.png, reader.info);
  const std::string size_text = std::to_string(w) + "x" + std::to_string(h);
  if (w == 0 || h == 0 || w > kMaxSide || h > kMaxSide)
    throw DataError(name, "width and height in 1.." + std::to_string(kMaxSide), size_text);
  if (w * h > static_cast<uint64_t>(kMaxPicturePixels))
    throw DataError(
        name, "a picture of at most " + std::to_string(kMaxPicturePixels) + " pixels (8192x8192)",
        size_text + " in its header", "cut a larger sheet into several files");
  // The image data before compression: a filter byte and the packed samples of each row.
  const uint64_t raw_bytes = h * (1 + png_get_rowbytes(reader.png, reader.info));
  if (raw_bytes > static_cast<uint64_t>(bytes.size()) * kMaxDeflateRatio)
    throw DataError(name,
                    "at most " + std::to_string(bytes.size() * kMaxDeflateRatio) +
                        " bytes of image data for a file of " + std::to_string(bytes.size()) +
                        " bytes",
                    size_text + " in its header (" + std::to_string(raw_bytes) + " bytes)");
  const bool indexed = png_get_color_type(reader.png, reader.info) == PNG_COLOR_TYPE_PALETTE;
  if (!set_transforms(reader.png, reader.info, indexed))
    throw DataError(name, "a PNG libpng can convert to RGBA",
                    std::string("libpng: ") + source.error);
  const uint64_t channels = indexed ? 1 : 4;
  if (png_get_rowbytes(reader.png, reader.info) != w * channels)
    throw Error(name + ": libpng gave rows of " +
                std::to_string(png_get_rowbytes(reader.png, reader.info)) + " bytes, not " +
                std::to_string(w * channels));

  auto out = torch::empty(
      {static_cast<int64_t>(h), static_cast<int64_t>(w), static_cast<int64_t>(channels)},
      torch::kUInt8);
  std::vector<png_bytep> rows(h);
  for (uint64_t y = 0; y < h; ++y) rows[y] = out.data_ptr<uint8_t>() + y * w * channels;
  if (!read_png_rows(reader.png, rows.data()))
    throw DataError(name, "complete PNG image data", std::string("libpng: ") + source.error,
                    "the file is truncated or corrupt; re-export it");
  if (indexed) out = palette_to_rgba(reader.png, reader.info, out, *source.warnings);
  if (!warnings)
    for (const auto& warning : own_warnings) note(name + ": " + warning);
  return out;
}

torch::Tensor read_png(const std::string& path, std::vector<std::string>* warnings) {
  return decode_png(read_all(path), path, warnings);
}

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

void write_png(const std::string& path, const torch::Tensor& image, IfExists existing) {
  write_file_atomically(path, encode_png(image, path), existing);
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
  const auto a = images.narrow(1, 3, 1);
  // Sums over (N, 1, s, s) areas of colour weighted by alpha, and of alpha; float32.
  auto area_sums = [&](const torch::Tensor& part, int64_t out_rows) {
    const auto pool = F::AdaptiveAvgPool2dFuncOptions({out_rows, size});
    const auto x = part.to(torch::kFloat32);  // (N, 4, rows, W) in [0, 255]
    const auto alpha = x.narrow(1, 3, 1) / 255.0f;
    return std::make_pair(F::adaptive_avg_pool2d(x.narrow(1, 0, 3) * alpha, pool),
                          F::adaptive_avg_pool2d(alpha, pool));
  };
  torch::Tensor weighted, mean_alpha, hard;  // (N, 3, s, s), (N, 1, s, s), (N, 1, 1, 1) bool
  if (images.numel() <= (int64_t{4} << 20)) {
    std::tie(weighted, mean_alpha) = area_sums(images, size);
    hard = ((a == 0) | (a == 255)).flatten(1).all(1).view({-1, 1, 1, 1});
  } else {
    // A large picture's float copies would take several times its size: one output row at a
    // time, over the source rows of that row's areas (adaptive pooling's floor(i*h/s) to
    // ceil((i+1)*h/s), so the areas and their sums are those of one pass).
    std::vector<torch::Tensor> weighted_rows, alpha_rows;
    hard = torch::ones({images.size(0), 1, 1, 1}, torch::kBool);
    for (int64_t i = 0; i < size; ++i) {
      const int64_t y0 = i * h / size, y1 = ((i + 1) * h + size - 1) / size;
      const auto part = images.narrow(2, y0, y1 - y0);
      auto [row_weighted, row_alpha] = area_sums(part, 1);
      weighted_rows.push_back(row_weighted), alpha_rows.push_back(row_alpha);
      const auto part_alpha = part.narrow(1, 3, 1);
      hard &= ((part_alpha == 0) | (part_alpha == 255)).flatten(1).all(1).view({-1, 1, 1, 1});
    }
    weighted = torch::cat(weighted_rows, 2), mean_alpha = torch::cat(alpha_rows, 2);
  }
  // An area with no opaque pixel has weighted = 0, so its colour comes out 0.
  const auto rgb = weighted / mean_alpha.clamp_min(1e-12);
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
  // One sprite per class (more than 32 classes): rows of 8 classes, not a column of them.
  const int64_t columns = per_class > 1 ? per_class : 8;
  return make_sheet(sprites, {columns, 1, std::max<int64_t>(1, 64 / std::max<int64_t>(size, 1))});
}

}  // namespace spritetorch::io
