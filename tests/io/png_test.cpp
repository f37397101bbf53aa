// PNG reading for every colour type, write round trip, sheets, and corrupt files.
#include "io/png.h"

#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

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
  EXPECT_TRUE(png_image_write_get_memory_size(image, size, 0, pixels.data(), 0, colormap.empty() ? nullptr : colormap.data()));
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0,
                                        colormap.empty() ? nullptr : colormap.data()));
  out.resize(size);
  return out;
}

std::vector<uint8_t> rgba_at(const torch::Tensor& img, int64_t y, int64_t x) {
  std::vector<uint8_t> v;
  for (int c = 0; c < 4; ++c) v.push_back(img[y][x][c].item<uint8_t>());
  return v;
}

TEST(Png, ReadsRgba) {
  const auto img = decode_png(encode(2, 1, PNG_FORMAT_RGBA, {10, 20, 30, 40, 50, 60, 70, 255}), "rgba");
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

TEST(Png, WriteReadRoundTrip) {
  ScratchDir dir;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto img = at::randint(0, 256, {5, 7, 4}, gen, torch::kInt64).to(torch::kUInt8);
  write_png(dir.file("a.png"), img);
  EXPECT_TRUE(torch::equal(read_png(dir.file("a.png")), img));
}

TEST(Png, ReadsKenneyIndexedSheet) {
  const auto img = read_png(std::string(SPRITETORCH_TEST_DIR) + "/fixtures/kenney_1bit_colored_packed.png");
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{352, 784, 4}));
  const auto alpha = img.select(2, 3);
  EXPECT_TRUE(((alpha == 0) | (alpha == 255)).all().item<bool>());  // index 0 transparent, rest opaque
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
  for (int i = 0; i < 4; ++i) big[16 + i] = big[20 + i] = static_cast<char>((side >> (24 - 8 * i)) & 0xff);
  const uint32_t crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(big.data() + 12), 17));
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

}  // namespace
}  // namespace spritetorch::io
