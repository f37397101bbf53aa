// PNG reading for every colour type, write round trip, sheets, and corrupt files.
#include "io/png.h"

#include <gtest/gtest.h>

#include <png.h>
#include <zlib.h>
#include <array>

#include "common/error.h"
#include "test_util.h"

namespace spritetorch::io {
namespace {

using spritetorch::testing::ScratchDir;
using spritetorch::testing::write_bytes;

// Encodes `pixels` (H x W x channels of `format`) with libpng's simplified writer.
std::string encode(uint32_t w, uint32_t h, uint32_t format, const std::vector<uint8_t>& pixels,
                   const std::vector<uint8_t>& colormap = {}) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = w;
  image.height = h;
  image.format = format;
  image.colormap_entries = static_cast<uint32_t>(colormap.size() / 4);
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_get_memory_size(image, size, 0, pixels.data(), 0,
                                              colormap.empty() ? nullptr : colormap.data()));
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0,
                                        colormap.empty() ? nullptr : colormap.data()));
  out.resize(size);
  return out;
}

// What libpng's low-level writer takes that the simplified one cannot: any bit depth and colour
// type, interlacing, a gAMA chunk. `rows`: h rows of packed samples (16-bit big-endian).
struct LowLevelPng {
  uint32_t w = 1, h = 1;
  int depth = 8, colour_type = PNG_COLOR_TYPE_RGB;
  bool interlaced = false;
  double gamma = 0;                // 0: no gAMA chunk
  std::vector<png_color> palette;  // PLTE for PNG_COLOR_TYPE_PALETTE
};

void append_to_string(png_structp png, png_bytep data, size_t size) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), size);
}

// Plain locals only: libpng's longjmp on an error must not skip destructors.
bool write_low_level(const LowLevelPng& spec, png_bytepp rows, std::string* out) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, out, append_to_string, nullptr);
  png_set_IHDR(png, info, spec.w, spec.h, spec.depth, spec.colour_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty())
    png_set_PLTE(png, info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  if (spec.gamma > 0) png_set_gAMA(png, info, spec.gamma);
  png_write_info(png, info);
  if (spec.interlaced) png_set_interlace_handling(png);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

std::string encode_low_level(const LowLevelPng& spec, std::vector<uint8_t> samples) {
  const size_t row_bytes = samples.size() / spec.h;
  std::vector<png_bytep> rows(spec.h);
  for (uint32_t y = 0; y < spec.h; ++y) rows[y] = samples.data() + y * row_bytes;
  std::string out;
  EXPECT_TRUE(write_low_level(spec, rows.data(), &out));
  return out;
}

std::vector<uint8_t> rgba_at(const torch::Tensor& img, int64_t y, int64_t x) {
  std::vector<uint8_t> v;
  for (int c = 0; c < 4; ++c) v.push_back(img[y][x][c].item<uint8_t>());
  return v;
}

TEST(Png, ReadsRgba) {
  const auto img =
      decode_png(encode(2, 1, PNG_FORMAT_RGBA, {10, 20, 30, 40, 50, 60, 70, 255}), "rgba");
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(rgba_at(img, 0, 0), (std::vector<uint8_t>{10, 20, 30, 40}));
  EXPECT_EQ(rgba_at(img, 0, 1), (std::vector<uint8_t>{50, 60, 70, 255}));
}

TEST(Png, ReadsRgbAsOpaque) {
  const auto img = decode_png(encode(1, 2, PNG_FORMAT_RGB, {1, 2, 3, 4, 5, 6}), "rgb");
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{2, 1, 4}));
  EXPECT_EQ(rgba_at(img, 1, 0), (std::vector<uint8_t>{4, 5, 6, 255}));
}

TEST(Png, ReadsGreyAndGreyAlpha) {
  // Grey values at the extremes survive libpng's gamma handling exactly.
  const auto grey = decode_png(encode(2, 1, PNG_FORMAT_GRAY, {0, 255}), "grey");
  EXPECT_EQ(rgba_at(grey, 0, 0), (std::vector<uint8_t>{0, 0, 0, 255}));
  EXPECT_EQ(rgba_at(grey, 0, 1), (std::vector<uint8_t>{255, 255, 255, 255}));
  const auto ga = decode_png(encode(2, 1, PNG_FORMAT_GA, {255, 255, 0, 0}), "grey+alpha");
  EXPECT_EQ(rgba_at(ga, 0, 0), (std::vector<uint8_t>{255, 255, 255, 255}));
  EXPECT_EQ(ga[0][1][3].item<uint8_t>(), 0);
}

TEST(Png, ReadsIndexedWithTransparency) {
  // Palette: 0 transparent, 1 opaque red, 2 opaque green; written as PLTE + tRNS.
  const std::vector<uint8_t> colormap = {0, 0, 0, 0, 255, 0, 0, 255, 0, 255, 0, 255};
  const auto bytes = encode(3, 1, PNG_FORMAT_RGBA_COLORMAP, {0, 1, 2}, colormap);
  EXPECT_EQ(static_cast<uint8_t>(bytes[25]), 3) << "colour type in IHDR should be 3 (indexed)";
  const auto img = decode_png(bytes, "indexed");
  EXPECT_EQ(img[0][0][3].item<uint8_t>(), 0);
  EXPECT_EQ(rgba_at(img, 0, 1), (std::vector<uint8_t>{255, 0, 0, 255}));
  EXPECT_EQ(rgba_at(img, 0, 2), (std::vector<uint8_t>{0, 255, 0, 255}));
}

TEST(Png, SixteenBitSamplesAreRoundedAndGammaIsIgnored) {
  // 16-bit v reads as round(v / 257), whatever the colour type and interlacing, and a gAMA chunk
  // does not move the values: a sprite's pixels are taken as stored.
  std::vector<uint8_t> rgba16;  // 9 x 3 pixels of RGBA, 16 bits big-endian
  std::vector<std::array<int, 4>> expected;
  // Low bytes just past and just short of the half, that round up and down.
  auto wide_of = [](int i, int c) {
    return c * 257 + (c == 255 ? 0 : i % 3 == 0 ? 129 : i % 3 == 1 ? 128 : 0);
  };
  for (int i = 0; i < 27; ++i) {
    const std::array<int, 4> v = {i * 9, 255 - i * 9, (i * 37) % 256, i % 2 ? 255 : i * 5};
    for (int c : v) {
      const int wide = wide_of(i, c);
      rgba16.push_back(static_cast<uint8_t>(wide >> 8)), rgba16.push_back(wide & 0xff);
    }
    expected.push_back(v);
  }
  for (const bool interlaced : {false, true}) {
    LowLevelPng spec;
    spec.w = 9, spec.h = 3, spec.depth = 16, spec.colour_type = PNG_COLOR_TYPE_RGBA;
    spec.interlaced = interlaced;
    spec.gamma = 1.0;
    const auto img = decode_png(encode_low_level(spec, rgba16), "rgba16.png");
    for (int i = 0; i < 27; ++i)
      for (int c = 0; c < 4; ++c) {
        const int wide = wide_of(i, expected[i][c]);
        EXPECT_EQ(img[i / 9][i % 9][c].item<int>(), (wide + 128) / 257)
            << "pixel " << i << " channel " << c << (interlaced ? " (interlaced)" : "");
      }
  }
  LowLevelPng grey;
  grey.w = 2, grey.h = 1, grey.depth = 16, grey.colour_type = PNG_COLOR_TYPE_GRAY;
  const auto g = decode_png(encode_low_level(grey, {0x10, 0x10, 0x80, 0x80}), "grey16.png");
  EXPECT_EQ(rgba_at(g, 0, 0), (std::vector<uint8_t>{16, 16, 16, 255}));
  EXPECT_EQ(rgba_at(g, 0, 1), (std::vector<uint8_t>{128, 128, 128, 255}));
  LowLevelPng rgb;
  rgb.w = 1, rgb.h = 1, rgb.gamma = 0.5556;  // 8-bit RGB with a gAMA chunk
  EXPECT_EQ(rgba_at(decode_png(encode_low_level(rgb, {16, 128, 200}), "gama.png"), 0, 0),
            (std::vector<uint8_t>{16, 128, 200, 255}));
}

TEST(Png, LowBitDepthsSizedByTheirBitsAndPaletteIndicesPastThePalette) {
  // A 1-bit 1024 x 1024 sheet is a few hundred bytes: its raw data (128 KiB), not its RGBA size,
  // is what the file's length must be able to hold.
  LowLevelPng sheet;
  sheet.w = sheet.h = 1024, sheet.depth = 1, sheet.colour_type = PNG_COLOR_TYPE_PALETTE;
  sheet.palette = {{0, 0, 0}, {250, 10, 20}};
  std::vector<uint8_t> bits(1024 * 128, 0);
  bits[0] = 0x80;  // the first pixel is colour 1
  const auto bytes = encode_low_level(sheet, bits);
  ASSERT_LT(bytes.size() * 1032, 1024u * 1024u);  // what the RGBA-sized check refused
  const auto img = decode_png(bytes, "sheet.png");
  EXPECT_EQ(rgba_at(img, 0, 0), (std::vector<uint8_t>{250, 10, 20, 255}));
  EXPECT_EQ(rgba_at(img, 1023, 1023), (std::vector<uint8_t>{0, 0, 0, 255}));

  // Index 3 of a two-colour palette: read as opaque black, and said.
  LowLevelPng indexed;
  indexed.w = 2, indexed.h = 1, indexed.colour_type = PNG_COLOR_TYPE_PALETTE;
  indexed.palette = {{1, 2, 3}, {4, 5, 6}};
  std::vector<std::string> warnings;
  const auto past = decode_png(encode_low_level(indexed, {1, 3}), "past.png", &warnings);
  EXPECT_EQ(rgba_at(past, 0, 0), (std::vector<uint8_t>{4, 5, 6, 255}));
  EXPECT_EQ(rgba_at(past, 0, 1), (std::vector<uint8_t>{0, 0, 0, 255}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("palette index 3 past the palette's 2 colours"), std::string::npos)
      << warnings[0];
  warnings.clear();
  decode_png(encode_low_level(indexed, {1, 0}), "fine.png", &warnings);
  EXPECT_TRUE(warnings.empty());
}

TEST(Png, RefusesPicturesBeyondTheLimitBeforeAllocating) {
  // 8192 x 8193 1-bit grey: 8 MiB of raw data in a file of a few KiB, 256 MiB as RGBA.
  LowLevelPng big;
  big.w = 8192, big.h = 8193, big.depth = 1, big.colour_type = PNG_COLOR_TYPE_GRAY;
  const auto bytes = encode_low_level(big, std::vector<uint8_t>(8193 * 1024, 0));
  try {
    decode_png(bytes, "big.png");
    FAIL() << "a picture past kMaxPicturePixels was decoded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("8192x8193 in its header"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at most 67108864 pixels"), std::string::npos) << e.what();
  }
}

TEST(Png, WriteReadRoundTrip) {
  ScratchDir dir;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto img = at::randint(0, 256, {5, 7, 4}, gen, torch::kInt64).to(torch::kUInt8);
  write_png(dir.file("a.png"), img);
  EXPECT_TRUE(torch::equal(read_png(dir.file("a.png")), img));
}

TEST(Png, ReadsKenneyIndexedSheet) {
  const auto img =
      read_png(std::string(SPRITETORCH_TEST_DIR) + "/fixtures/kenney_1bit_colored_packed.png");
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{352, 784, 4}));
  const auto alpha = img.select(2, 3);
  EXPECT_TRUE(
      ((alpha == 0) | (alpha == 255)).all().item<bool>());  // index 0 transparent, rest opaque
  EXPECT_GT((alpha == 0).sum().item<int64_t>(), 0);
  EXPECT_GT((alpha == 255).sum().item<int64_t>(), 0);
}

std::string error_of(const std::string& bytes) {
  try {
    decode_png(bytes, "bad.png");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(Png, RejectsCorruptInput) {
  const auto good = encode(4, 4, PNG_FORMAT_RGBA, std::vector<uint8_t>(64, 9));
  EXPECT_NE(error_of("").find("bad.png: expected a PNG file"), std::string::npos);
  EXPECT_NE(error_of("GIF89a-not-a-png").find("expected a PNG file"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, good.size() / 2)).find("bad.png"), std::string::npos);
  std::string flipped = good;
  flipped[40] ^= 0x55;  // inside the IDAT data: a CRC or inflate error
  EXPECT_NE(error_of(flipped), "");
  // A valid IHDR (with a correct CRC) that claims 60000 x 60000 pixels in a tiny file.
  std::string big = good;
  const uint32_t side = 60000;
  for (int i = 0; i < 4; ++i)
    big[16 + i] = big[20 + i] = static_cast<char>((side >> (24 - 8 * i)) & 0xff);
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(big.data() + 12), 17));
  for (int i = 0; i < 4; ++i) big[29 + i] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
  EXPECT_NE(error_of(big).find("60000x60000"), std::string::npos) << error_of(big);
  EXPECT_THROW(read_png("/nonexistent/x.png"), DataError);
}

TEST(Png, SheetHasPaddingAndScale) {
  const auto sprites = torch::full({5, 4, 3, 2}, 200, torch::kUInt8);
  const auto sheet = make_sheet(sprites, {/*columns=*/3, /*padding=*/1, /*scale=*/2});
  // 2 rows x 3 columns of 3x2 tiles with 1-pixel padding: (2*4+1) x (3*3+1), scaled by 2.
  EXPECT_EQ(sheet.sizes(), (std::vector<int64_t>{18, 20, 4}));
  EXPECT_EQ(sheet[0][0][3].item<uint8_t>(), 0);    // padding is transparent
  EXPECT_EQ(sheet[2][2][3].item<uint8_t>(), 200);  // first tile starts at (1, 1) * 2
  EXPECT_EQ(sheet[10][14][3].item<uint8_t>(), 0);  // the sixth slot stays empty
}

TEST(Png, NearestNeighbourOnly) {
  const auto x = torch::tensor({1, 2, 3, 4}, torch::kUInt8).view({1, 1, 2, 2});
  const auto up = resize_nearest(x, 4);
  EXPECT_EQ(up[0][0][3][3].item<uint8_t>(), 4);
  EXPECT_EQ(up[0][0][0][1].item<uint8_t>(), 1);
  // Every output value is an input value: no interpolation.
  EXPECT_TRUE(torch::isin(up, x.flatten()).all().item<bool>());
  EXPECT_TRUE(torch::equal(resize_nearest(up, 2), x));
  EXPECT_TRUE(torch::equal(upscale_nearest(x, 2), up));
}

// (1, 4, h, w) uint8 sprite: every pixel `rgba`.
torch::Tensor filled(int64_t h, int64_t w, std::array<int, 4> rgba) {
  return torch::tensor(std::vector<int>(rgba.begin(), rgba.end()), torch::kUInt8)
      .view({1, 4, 1, 1})
      .expand({1, 4, h, w})
      .contiguous();
}

// resize_area's reduction written as one pass over the whole picture: the reference for the
// row-at-a-time form it takes for large pictures.
torch::Tensor area_in_one_pass(const torch::Tensor& images, int64_t size) {
  namespace F = torch::nn::functional;
  const auto pool = F::AdaptiveAvgPool2dFuncOptions({size, size});
  const auto x = images.to(torch::kFloat32);
  const auto alpha = x.narrow(1, 3, 1) / 255.0f;
  const auto mean_alpha = F::adaptive_avg_pool2d(alpha, pool);
  const auto rgb =
      F::adaptive_avg_pool2d(x.narrow(1, 0, 3) * alpha, pool) / mean_alpha.clamp_min(1e-12);
  const auto a = images.narrow(1, 3, 1);
  const auto hard = ((a == 0) | (a == 255)).flatten(1).all(1).view({-1, 1, 1, 1});
  const auto out_alpha =
      torch::where(hard, (mean_alpha >= 0.5f).to(torch::kFloat32), mean_alpha) * 255.0f;
  return torch::cat({rgb, out_alpha}, 1).round().clamp(0, 255).to(torch::kUInt8);
}

TEST(Png, AreaResizeKeepsThinLinesThatNearestNeighbourLoses) {
  // A transparent 4x4 sprite with a 1-pixel red line down column 0 (an outline's edge): halved,
  // nearest neighbour samples columns 1 and 3 and loses the line; the area mean keeps it as a
  // hard-edged red column (half of each 2x2 block is line: alpha 0.5 -> opaque).
  auto line = filled(4, 4, {0, 255, 0, 0});  // transparent pixels may carry any colour
  line.select(3, 0).copy_(torch::tensor({255, 0, 0, 255}, torch::kUInt8).view({1, 4, 1}));
  EXPECT_EQ(resize_nearest(line, 2).select(1, 3).max().item<int>(), 0);
  const auto area = resize_area(line, 2);
  EXPECT_TRUE(
      torch::equal(area.select(3, 0),
                   torch::tensor({255, 255, 0, 0, 0, 0, 255, 255}, torch::kUInt8).view({1, 4, 2})))
      << area;  // red and opaque: the transparent green lends no colour
  EXPECT_EQ(area.select(3, 1).select(1, 3).max().item<int>(), 0);  // the rest stays transparent

  // Colours average over the opaque pixels of each area; soft alpha averages rather than
  // snapping to 0 or 255.
  auto halves = filled(2, 2, {0, 0, 0, 255});
  halves.select(3, 1).copy_(torch::tensor({200, 100, 50, 255}, torch::kUInt8).view({1, 4, 1}));
  EXPECT_TRUE(torch::equal(resize_area(halves, 1).flatten(),
                           torch::tensor({100, 50, 25, 255}, torch::kUInt8)));
  EXPECT_EQ(resize_area(filled(4, 4, {10, 20, 30, 128}), 2).select(1, 3).min().item<int>(), 128);

  // Pixel art stored at twice its size comes back exactly; growing is pixel repetition.
  const auto art = torch::randint(0, 256, {3, 4, 8, 8}, torch::kUInt8);
  const auto doubled = upscale_nearest(art, 2).contiguous();
  auto hard = art.clone();
  hard.select(1, 3).copy_((art.select(1, 3) >= 128).to(torch::kUInt8) * 255);
  const auto hard_doubled = upscale_nearest(hard, 2).contiguous();
  EXPECT_TRUE(torch::equal(resize_area(hard_doubled, 8).select(1, 3), hard.select(1, 3)));
  EXPECT_TRUE(torch::equal(resize_area(doubled, 8).select(1, 3), art.select(1, 3)));
  // Opaque pixels keep their colours exactly.
  const auto opaque = hard.select(1, 3).unsqueeze(1).expand_as(hard) == 255;
  EXPECT_TRUE(
      torch::equal(resize_area(hard_doubled, 8).masked_select(opaque), hard.masked_select(opaque)));
  EXPECT_TRUE(torch::equal(resize_area(art, 16), resize_nearest(art, 16)));
  // A large picture is reduced an output row at a time: the same areas and values.
  const auto huge_art = upscale_nearest(hard, 160).contiguous();  // (3, 4, 1280, 1280)
  ASSERT_GT(huge_art.numel(), int64_t{4} << 20);
  EXPECT_TRUE(torch::equal(resize_area(huge_art, 8).select(1, 3), hard.select(1, 3)));
  EXPECT_TRUE(
      torch::equal(resize_area(huge_art, 8).masked_select(opaque), hard.masked_select(opaque)));
  // Areas that do not divide the picture evenly, soft alpha: as in one pass over the picture.
  const auto photo = torch::randint(0, 256, {1, 4, 1100, 1300}, torch::kUInt8);
  ASSERT_GT(photo.numel(), int64_t{4} << 20);
  EXPECT_TRUE(torch::equal(resize_area(photo, 7), area_in_one_pass(photo, 7)));
  EXPECT_TRUE(torch::equal(resize_area(photo.narrow(3, 0, 5), 7),  // taller than wide: up and down
                           area_in_one_pass(photo.narrow(3, 0, 5), 7)));

  EXPECT_TRUE(torch::equal(resize_sprites(line, 2, "nearest"), resize_nearest(line, 2)));
  EXPECT_TRUE(torch::equal(resize_sprites(line, 2, "area"), area));
  EXPECT_THROW(resize_sprites(line, 2, "bicubic"), Error);
}

}  // namespace
}  // namespace spritetorch::io
