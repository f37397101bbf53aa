// Procedural sprites, folder / sheet / .npy readers, the holdout split, and corrupt inputs.
#include "data/sprite_sources.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "data/procedural_sprites.h"
#include "io/png.h"
#include "test_util.h"
#include "train/trainer.h"

namespace spritetorch::data {
namespace {

using spritetorch::testing::error_of;
using spritetorch::testing::ScratchDir;
using spritetorch::testing::write_bytes;

TEST(ProceduralSprites, DeterministicAndCountIndependent) {
  const auto a = make_procedural_sprites(40, 5), b = make_procedural_sprites(40, 5);
  EXPECT_TRUE(torch::equal(a.inputs, b.inputs));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  const auto longer = make_procedural_sprites(100, 5);
  EXPECT_TRUE(torch::equal(longer.inputs.narrow(0, 0, 40), a.inputs));  // any count: a prefix
  EXPECT_FALSE(torch::equal(make_procedural_sprites(40, 6).inputs, a.inputs));
}

TEST(ProceduralSprites, BalancedSymmetricOutlinedTransparent) {
  const auto d = make_procedural_sprites(400, 1);
  EXPECT_EQ(d.inputs.sizes(), (std::vector<int64_t>{400, 4, 16, 16}));
  EXPECT_EQ(d.class_names.size(), 4u);
  EXPECT_TRUE(torch::equal(torch::bincount(d.labels), torch::full({4}, 100, torch::kInt64)));
  const auto alpha = d.inputs.select(1, 3);
  EXPECT_TRUE(((alpha == 0) | (alpha == 255)).all().item<bool>());
  EXPECT_TRUE(torch::equal(d.inputs, d.inputs.flip({3})));  // mirror symmetric
  // Transparent corners, and a transparent background that is a real share.
  EXPECT_EQ(alpha.select(1, 0).select(1, 0).sum().item<int64_t>(), 0);
  EXPECT_EQ(alpha.select(1, 15).select(1, 15).sum().item<int64_t>(), 0);
  const double opaque = (alpha > 0).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(opaque, 0.2);
  EXPECT_LT(opaque, 0.8);
  // Outline: every opaque pixel whose upper neighbour is background is an outline pixel, and the
  // outline colour has HSV value <= 0.24 (max channel <= 62).
  const auto rgb_max = std::get<0>(d.inputs.narrow(1, 0, 3).max(1));  // (N, 16, 16)
  const auto a = alpha > 0;
  const auto edge = a & ~(torch::constant_pad_nd(a.to(torch::kUInt8), {1, 1, 1, 1})
                              .narrow(1, 0, 16)
                              .narrow(2, 1, 16) > 0);
  // Row 0 is left out: a robot's antenna tip may touch the top edge.
  const auto edge_below_top = edge.narrow(1, 1, 15);
  EXPECT_GT(edge_below_top.sum().item<int64_t>(), 1000);
  EXPECT_TRUE((rgb_max.narrow(1, 1, 15).index({edge_below_top}) <= 62).all().item<bool>());
  // Classes differ in their masks: mean alpha images are far apart.
  const auto means = torch::stack({alpha.index({d.labels == 0}).to(torch::kFloat32).mean(0),
                                   alpha.index({d.labels == 3}).to(torch::kFloat32).mean(0)});
  EXPECT_GT((means[0] - means[1]).abs().mean().item<double>(), 10.0);
}

torch::Tensor solid(int64_t h, int64_t w, uint8_t value) {
  auto t = torch::full({h, w, 4}, value, torch::kUInt8);
  t.select(2, 3).fill_(255);
  return t;
}

TEST(SpriteSheet, SlicesWithSpacingMarginAndSkipsEmptyTiles) {
  ScratchDir dir;
  // 3 columns x 2 rows of 4x4 tiles, spacing 1, margin 2: 2+4+1+4+1+4+2 = 18 wide, 2+4+1+4+2 = 13
  // high.
  auto sheet = torch::zeros({13, 18, 4}, torch::kUInt8);
  sheet.select(2, 3).fill_(0);
  uint8_t v = 10;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c, v += 10) {
      if (r == 1 && c == 1) continue;  // an empty slot
      sheet.narrow(0, 2 + r * 5, 4).narrow(1, 2 + c * 5, 4).copy_(solid(4, 4, v));
    }
  // Spacing pixels painted opaque: they must not leak into tiles.
  sheet.narrow(0, 6, 1).fill_(255);
  io::write_png(dir.file("s.png"), sheet);
  SpriteOptions o;
  o.tile_w = o.tile_h = 4;
  o.spacing = 1;
  o.margin = 2;
  o.size = 16;
  const auto d = read_sprite_sheet(dir.file("s.png"), o);
  ASSERT_EQ(d.size(), 5);
  EXPECT_EQ(d.inputs.sizes(), (std::vector<int64_t>{5, 4, 16, 16}));
  EXPECT_EQ(d.class_names, std::vector<std::string>{"sprite"});
  const std::vector<int> expected = {10, 20, 30, 40, 60};  // tile 4 (value 50) was empty
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(d.inputs[i][0].min().item<int>(), expected[i]) << i;
    EXPECT_EQ(d.inputs[i][0].max().item<int>(), expected[i]) << i;
  }
  // The cut itself: row-major indices that count the empty slot, views of the right pixels.
  const SheetGrid grid = cut_sheet(io::read_png(dir.file("s.png")), dir.file("s.png"), o);
  EXPECT_EQ(grid.rows, 2);
  EXPECT_EQ(grid.cols, 3);
  ASSERT_EQ(grid.tiles.size(), 5u);
  const std::vector<int64_t> indices = {0, 1, 2, 3, 5};
  for (size_t i = 0; i < 5; ++i) {
    const SheetTile& t = grid.tiles[i];
    EXPECT_EQ(t.index, indices[i]);
    EXPECT_EQ(t.row * 3 + t.col, t.index);
    EXPECT_EQ(t.pixels.sizes(), (std::vector<int64_t>{4, 4, 4}));
    EXPECT_TRUE(torch::equal(t.pixels, solid(4, 4, static_cast<uint8_t>(expected[i])))) << i;
  }
  o.margin = 4;  // 10 x 5 px inside the margin: 2 columns (4 + 1 + 4), 1 row
  const SheetGrid inner = cut_sheet(io::read_png(dir.file("s.png")), "s.png", o);
  EXPECT_EQ(inner.cols, 2);
  EXPECT_EQ(inner.rows, 1);
  o.margin = 7;  // not one tile fits inside: a DataError naming the file
  EXPECT_THROW(cut_sheet(io::read_png(dir.file("s.png")), "s.png", o), DataError);
  // Options near 2^63 must not overflow into another grid or a LibTorch error.
  for (const int64_t huge : {int64_t{1} << 62, int64_t{5000000000000000000}, INT64_MAX}) {
    SpriteOptions big = o;
    big.margin = huge;
    EXPECT_THROW(cut_sheet(io::read_png(dir.file("s.png")), "s.png", big), DataError) << huge;
    big = o;
    big.tile_w = huge;
    EXPECT_THROW(cut_sheet(io::read_png(dir.file("s.png")), "s.png", big), DataError) << huge;
    big = o;
    big.margin = 2;
    big.spacing = huge;  // one tile per row and column, as a spacing of the sheet's side
    const SheetGrid one = cut_sheet(io::read_png(dir.file("s.png")), "s.png", big);
    EXPECT_EQ(one.rows, 1);
    EXPECT_EQ(one.cols, 1);
    ASSERT_EQ(one.tiles.size(), 1u);
    EXPECT_TRUE(torch::equal(one.tiles[0].pixels, solid(4, 4, 10)));
  }
  o.margin = 2;
  // A label map picks tiles and names classes.
  std::ofstream(dir.file("labels.txt")) << "# tile class\n0 hero\n2 coin\n5 hero\n";
  o.label_map = dir.file("labels.txt");
  const auto labelled = read_sprite_sheet(dir.file("s.png"), o);
  EXPECT_EQ(labelled.class_names, (std::vector<std::string>{"coin", "hero"}));
  EXPECT_TRUE(torch::equal(labelled.labels, torch::tensor({1, 0, 1}, torch::kInt64)));
  std::ofstream(dir.file("bad.txt")) << "99 hero\n";
  o.label_map = dir.file("bad.txt");
  EXPECT_THROW(read_sprite_sheet(dir.file("s.png"), o), DataError);
  // Lines that are not exactly an index and one name are refused, not half read.
  for (const std::string line : {"2.7 b", "2x b", "0 long sword", "-1 b", "3", "x 3", "+2 b"}) {
    std::ofstream(dir.file("bad.txt")) << "0 hero\n" << line << "\n";
    try {
      read_sprite_sheet(dir.file("s.png"), o);
      ADD_FAILURE() << "'" << line << "' was accepted";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + line + "' on line 2"), std::string::npos)
          << e.what();
    }
  }
  // Blank lines, indented comments and Windows line ends are fine.
  std::ofstream(dir.file("crlf.txt")) << "# tile class\r\n  \r\n  # a note\r\n0 hero\r\n2 coin\r\n";
  o.label_map = dir.file("crlf.txt");
  EXPECT_EQ(read_sprite_sheet(dir.file("s.png"), o).class_names,
            (std::vector<std::string>{"coin", "hero"}));
  // A map without one tile line is an error, not a sheet read as if no map had been given.
  std::ofstream(dir.file("comments.txt")) << "# tile class\n\n";
  o.label_map = dir.file("comments.txt");
  try {
    read_sprite_sheet(dir.file("s.png"), o);
    FAIL() << "a label map of comments only was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("at least one 'TILE_INDEX CLASS' line"), std::string::npos)
        << e.what();
  }
}

// A 50x40 sheet cut into 16x16 tiles leaves a 2-pixel strip on the right and an 8-pixel one at
// the bottom: said when they hold visible pixels (sprites that would be lost), not when empty.
TEST(SpriteSheet, AnEdgeStripWithVisiblePixelsIsNoted) {
  auto sheet = torch::zeros({40, 50, 4}, torch::kUInt8);
  sheet.narrow(0, 0, 16).narrow(1, 0, 16).copy_(solid(16, 16, 10));
  SpriteOptions o;
  EXPECT_EQ(cut_sheet(sheet, "s.png", o).uncovered, "");
  sheet.narrow(0, 35, 1).narrow(1, 10, 1).fill_(255);
  const SheetGrid grid = cut_sheet(sheet, "s.png", o);
  EXPECT_EQ(grid.tiles.size(), 1u);
  EXPECT_EQ(grid.uncovered,
            "s.png is 50x40: its 8 pixel rows at the bottom hold visible pixels that no 16x16 tile "
            "covers (check --tile, --spacing and --margin)");
  sheet.narrow(0, 3, 1).narrow(1, 49, 1).fill_(255);
  EXPECT_EQ(cut_sheet(sheet, "s.png", o).uncovered,
            "s.png is 50x40: its 2 pixel columns on the right and 8 pixel rows at the bottom hold "
            "visible pixels that no 16x16 tile covers (check --tile, --spacing and --margin)");
}

TEST(SpriteSheet, KenneyFixture) {
  SpriteOptions o;
  const auto d = read_sprite_sheet(
      std::string(SPRITETORCH_TEST_DIR) + "/fixtures/kenney_1bit_colored_packed.png", o);
  EXPECT_GT(d.size(), 1000);
  EXPECT_LE(d.size(), 49 * 22);
  EXPECT_EQ(d.inputs.sizes().slice(1), (std::vector<int64_t>{4, 16, 16}));
}

// Links that lead nowhere (a loop, a missing class folder) are said and left out, not a raw
// filesystem exception; a link to ".." inside a class folder is named as written; a folder given
// with a trailing slash is named as without it.
TEST(SpriteFolder, LinksThatLeadNowhereAreSaidAndLeftOut) {
  ScratchDir dir;
  const auto root = dir.path() / "set";
  std::filesystem::create_directories(root / "gem");
  io::write_png((root / "gem" / "1.png").string(), solid(16, 16, 1));
  std::filesystem::create_symlink("self", root / "gem" / "self");        // a loop
  std::filesystem::create_symlink("loop", root / "loop");                // a loop at the top
  std::filesystem::create_symlink("/nonexistent-dir", root / "amulet");  // a class that is gone
  std::filesystem::create_symlink("..", root / "gem" / "up");
  ::testing::internal::CaptureStderr();
  const auto d = read_sprite_folder(root.string() + "/", 16);
  const std::string notes = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(d.class_names, (std::vector<std::string>{"gem"}));
  EXPECT_EQ(d.name, "folder:set");
  EXPECT_NE(notes.find(" links lead nowhere (a missing target or a loop), left out: "),
            std::string::npos)
      << notes;
  for (const char* name : {"amulet", "loop", "gem/self"})
    EXPECT_NE(notes.find(name), std::string::npos) << name << ": " << notes;
  EXPECT_NE(notes.find("left out: gem/up"), std::string::npos) << notes;
}

TEST(SpriteFolder, ClassPerSubfolderAnySize) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "b_robot");
  std::filesystem::create_directories(dir.path() / "a_ship");
  std::filesystem::create_directories(dir.path() / "empty");
  io::write_png(dir.file("a_ship/1.png"), solid(8, 8, 1));
  io::write_png(dir.file("a_ship/2.PNG"), solid(32, 32, 2));
  io::write_png(dir.file("b_robot/x.png"), solid(16, 16, 3));
  std::ofstream(dir.file("b_robot/notes.txt")) << "ignored";
  std::filesystem::create_symlink(dir.file("gone.png"), dir.file("b_robot/link.png"));
  // Not read, each said: a PNG outside the class folders, PNGs one folder too deep, a GIF.
  io::write_png(dir.file("stray.png"), solid(8, 8, 4));
  std::filesystem::create_directories(dir.path() / "a_ship" / "walk");
  io::write_png(dir.file("a_ship/walk/1.png"), solid(8, 8, 5));
  std::ofstream(dir.file("b_robot/y.gif")) << "GIF89a";
  ::testing::internal::CaptureStderr();
  const auto d = read_sprite_folder(dir.path().string(), 16);
  // The empty class folder and the broken link are left out, each with a note.
  const std::string notes = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(notes.find(": no .png files in empty, so no class of that name"), std::string::npos)
      << notes;
  EXPECT_NE(notes.find(": 1 .png entries are not files (broken links or folders), left out: " +
                       dir.file("b_robot/link.png")),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find(": 1 .png files are in no class folder, left out: stray.png"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find(": 1 folders inside class folders hold .png files, left out: a_ship/walk"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find(": 1 pictures are not PNG, left out: b_robot/y.gif"), std::string::npos)
      << notes;
  EXPECT_EQ(notes.find("notes.txt"), std::string::npos) << notes;  // not a picture
  EXPECT_EQ(d.class_names, (std::vector<std::string>{"a_ship", "b_robot"}));
  EXPECT_TRUE(torch::equal(d.labels, torch::tensor({0, 0, 1}, torch::kInt64)));
  EXPECT_EQ(d.inputs.sizes(), (std::vector<int64_t>{3, 4, 16, 16}));
  EXPECT_EQ(d.inputs[1][0][15][15].item<int>(), 2);
  const auto big = read_sprite_folder(dir.path().string(), 32);
  EXPECT_EQ(big.inputs.size(2), 32);
  EXPECT_THROW(read_sprite_folder(dir.file("nope"), 16), DataError);
  write_bytes(dir.file("b_robot/broken.png"), {0x89, 'P', 'N', 'G', 0, 0});
  try {
    read_sprite_folder(dir.path().string(), 16);
    FAIL() << "a corrupt PNG in the folder was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.png"), std::string::npos);
  }
}

std::vector<uint8_t> npy(const std::string& descr, const std::string& shape,
                         const std::vector<uint8_t>& data, const std::string& fortran = "False") {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size());
  std::vector<uint8_t> out(bytes.begin(), bytes.end());
  return out;
}

TEST(SpriteNpy, ReadsImagesAndBothLabelForms) {
  ScratchDir dir;
  std::vector<uint8_t> pixels(3 * 2 * 2 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i);
  write_bytes(dir.file("x.npy"), npy("|u1", "(3, 2, 2, 3)", pixels));
  std::vector<uint8_t> ints;  // int64 labels 2, 0, 1
  for (int64_t v : {2, 0, 1})
    for (int b = 0; b < 8; ++b) ints.push_back(static_cast<uint8_t>(v >> (8 * b)));
  write_bytes(dir.file("y.npy"), npy("<i8", "(3,)", ints));
  std::vector<uint8_t> onehot;  // float64 one-hot (3, 3) for the same labels
  for (int64_t v : {2, 0, 1})
    for (int k = 0; k < 3; ++k) {
      const double x = k == v ? 1.0 : 0.0;
      const auto* p = reinterpret_cast<const uint8_t*>(&x);
      onehot.insert(onehot.end(), p, p + 8);
    }
  write_bytes(dir.file("onehot.npy"), npy("<f8", "(3, 3)", onehot));
  const auto d = read_npy_sprites(dir.file("x.npy"), dir.file("y.npy"), 16);
  EXPECT_EQ(d.inputs.sizes(), (std::vector<int64_t>{3, 4, 16, 16}));
  EXPECT_EQ(d.inputs[1][3].min().item<int>(), 255);       // RGB -> opaque
  EXPECT_EQ(d.inputs[0][2][0][0].item<int>(), 2);         // pixel (0,0) channel 2
  EXPECT_EQ(d.inputs[2][0][15][15].item<int>(), 24 + 9);  // last pixel of sprite 2, red
  EXPECT_TRUE(torch::equal(d.labels, torch::tensor({2, 0, 1}, torch::kInt64)));
  EXPECT_EQ(d.num_classes(), 3);
  const auto h = read_npy_sprites(dir.file("x.npy"), dir.file("onehot.npy"), 16);
  EXPECT_TRUE(torch::equal(h.labels, d.labels));
  const auto unlabelled = read_npy_sprites(dir.file("x.npy"), "", 16);
  EXPECT_EQ(unlabelled.class_names, std::vector<std::string>{"sprite"});
}

// A stray huge label is refused by its value before any class is made for it (10^12 names were a
// bad_alloc), and one-hot scores must be numbers.
TEST(SpriteNpy, RefusesLabelsNoCheckpointCouldHoldAndNonFiniteScores) {
  ScratchDir dir;
  write_bytes(dir.file("x.npy"), npy("|u1", "(2, 2, 2, 1)", std::vector<uint8_t>(8, 7)));
  auto int64s = [](std::initializer_list<int64_t> values) {
    std::vector<uint8_t> bytes;
    for (int64_t v : values)
      for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<uint8_t>(v >> (8 * b)));
    return bytes;
  };
  write_bytes(dir.file("huge.npy"), npy("<i8", "(2,)", int64s({0, 1000000000000})));
  EXPECT_EQ(error_of([&] { read_npy_sprites(dir.file("x.npy"), dir.file("huge.npy"), 16); }),
            dir.file("huge.npy") +
                ": expected class indices below 65536 (a checkpoint holds at most that many "
                "classes), found 1000000000000");
  write_bytes(dir.file("top.npy"), npy("<i8", "(2,)", int64s({0, 65535})));
  EXPECT_EQ(read_npy_sprites(dir.file("x.npy"), dir.file("top.npy"), 16).num_classes(), 65536);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<uint8_t> scores(32);
  for (int i = 0; i < 4; ++i) std::memcpy(scores.data() + 8 * i, &nan, 8);
  write_bytes(dir.file("nan.npy"), npy("<f8", "(2, 2)", scores));
  EXPECT_EQ(error_of([&] { read_npy_sprites(dir.file("x.npy"), dir.file("nan.npy"), 16); }),
            dir.file("nan.npy") + ": expected finite one-hot scores, found NaN or infinity");
  // Rows that name no class or several (all zero, multi-hot) are refused, naming the first; soft
  // scores with one largest entry pick it.
  auto doubles = [](std::initializer_list<double> values) {
    std::vector<uint8_t> bytes(8 * values.size());
    std::memcpy(bytes.data(), std::data(values), bytes.size());
    return bytes;
  };
  write_bytes(dir.file("zero.npy"), npy("<f8", "(2, 3)", doubles({0, 1, 0, 0, 0, 0})));
  EXPECT_EQ(error_of([&] { read_npy_sprites(dir.file("x.npy"), dir.file("zero.npy"), 16); }),
            dir.file("zero.npy") +
                ": expected one-hot rows with one largest score (one class each), found row 1 "
                "with its largest score in 3 columns (1 such rows)");
  write_bytes(dir.file("multi.npy"), npy("<f8", "(2, 3)", doubles({1, 1, 0, 0, 1, 1})));
  EXPECT_EQ(error_of([&] { read_npy_sprites(dir.file("x.npy"), dir.file("multi.npy"), 16); }),
            dir.file("multi.npy") +
                ": expected one-hot rows with one largest score (one class each), found row 0 "
                "with its largest score in 2 columns (2 such rows)");
  write_bytes(dir.file("soft.npy"), npy("<f8", "(2, 3)", doubles({0.2, 0.5, 0.3, 0.6, 0.3, 0.1})));
  EXPECT_TRUE(torch::equal(read_npy_sprites(dir.file("x.npy"), dir.file("soft.npy"), 16).labels,
                           torch::tensor({1, 0}, torch::kInt64)));
}

std::string npy_error(const std::vector<uint8_t>& bytes) {
  try {
    parse_npy(std::string(bytes.begin(), bytes.end()), "bad.npy");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(SpriteNpy, RejectsCorruptHeaders) {
  const std::vector<uint8_t> data(8, 1);
  EXPECT_EQ(npy_error(npy("|u1", "(2, 4)", data)), "");
  EXPECT_NE(npy_error({'N', 'U', 'M', 'P', 'Y', 0, 0, 0, 0, 0, 0}).find("magic"),
            std::string::npos);
  auto bad_version = npy("|u1", "(2, 4)", data);
  bad_version[6] = 9;
  EXPECT_NE(npy_error(bad_version).find("version"), std::string::npos);
  auto long_header = npy("|u1", "(2, 4)", data);
  long_header[8] = 0xff;
  long_header[9] = 0xff;
  EXPECT_NE(npy_error(long_header).find("header length"), std::string::npos);
  EXPECT_NE(npy_error(npy("|u1", "(2, 5)", data)).find("found 8 bytes after the header"),
            std::string::npos);
  EXPECT_NE(npy_error(npy("|u1", "(2, 3)", data)).find("bytes after the header"),
            std::string::npos);
  // A shape whose product overflows 64 bits must not wrap around to a small number.
  EXPECT_NE(npy_error(npy("|u1", "(4294967296, 4294967296, 16)", data)).find("64 bits"),
            std::string::npos);
  EXPECT_NE(npy_error(npy("|u1", "(4294967296, 4294967295)", data))
                .find("found 8 bytes after the header"),
            std::string::npos);
  EXPECT_NE(npy_error(npy("|u1", "(2, -4)", data)).find("non-negative"), std::string::npos);
  EXPECT_NE(npy_error(npy(">u2", "(2, 2)", data)).find("descr"), std::string::npos);
  EXPECT_NE(npy_error(npy("|u1", "(2, 4)", data, "True")).find("fortran_order"), std::string::npos);
  EXPECT_NE(npy_error(npy("|u1", "[2, 4]", data)).find("shape"), std::string::npos);
}

TEST(SpriteNpy, RejectsWrongShapesAndLabels) {
  ScratchDir dir;
  write_bytes(dir.file("f.npy"), npy("<f4", "(1, 1, 1, 1)", std::vector<uint8_t>(4, 0)));
  EXPECT_THROW(read_npy_sprites(dir.file("f.npy"), "", 16), DataError);
  write_bytes(dir.file("c5.npy"), npy("|u1", "(1, 1, 1, 5)", std::vector<uint8_t>(5, 0)));
  EXPECT_THROW(read_npy_sprites(dir.file("c5.npy"), "", 16), DataError);
  write_bytes(dir.file("x.npy"), npy("|u1", "(2, 1, 1, 4)", std::vector<uint8_t>(8, 0)));
  write_bytes(dir.file("y3.npy"), npy("|u1", "(3,)", std::vector<uint8_t>(3, 0)));
  EXPECT_THROW(read_npy_sprites(dir.file("x.npy"), dir.file("y3.npy"), 16), DataError);
  EXPECT_THROW(read_npy_sprites(dir.file("missing.npy"), "", 16), DataError);
}

TEST(SpriteSplit, DeterministicDisjointComplete) {
  const auto all = make_procedural_sprites(200, 3);
  const auto a = holdout_split(all, 0.1, 9), b = holdout_split(all, 0.1, 9);
  EXPECT_EQ(a.test.size(), 20);
  EXPECT_EQ(a.train.size(), 180);
  EXPECT_TRUE(torch::equal(a.test.inputs, b.test.inputs));
  EXPECT_FALSE(torch::equal(holdout_split(all, 0.1, 10).test.inputs, a.test.inputs));
  // Each sample lands in exactly one split: pixel sums add up.
  EXPECT_EQ(a.train.inputs.sum().item<int64_t>() + a.test.inputs.sum().item<int64_t>(),
            all.inputs.sum().item<int64_t>());
  EXPECT_THROW(holdout_split(all, 1.0, 1), Error);
}

TEST(SpriteSources, LoadDatasetsHook) {
  train::TrainConfig config;
  config.dataset = "sprites";
  config.sprites.count = 100;
  const auto sets = train::load_datasets(config);
  EXPECT_EQ(sets.train.size(), 90);
  EXPECT_EQ(sets.test.size(), 10);
  EXPECT_EQ(sets.train.inputs.scalar_type(), torch::kUInt8);
  config.dataset = "npy:";
  EXPECT_THROW(train::load_datasets(config), Error);
  config.dataset = "sprites";
  config.sprites.size = 20;
  EXPECT_THROW(train::load_datasets(config), Error);
  EXPECT_EQ(parse_tile("8x12"), (std::pair<int64_t, int64_t>{8, 12}));
  EXPECT_THROW(parse_tile("8x"), Error);
  EXPECT_THROW(parse_tile("0x4"), Error);
}

// A folder's sprites come class by class: --train-limit and --test-limit (eval's --limit) take
// samples spread over each split, so every class stays, where the first N were one class.
TEST(SpriteSources, LimitsKeepEveryClassOfAFolder) {
  ScratchDir dir;
  for (const std::string name : {"a", "b", "c", "d"}) {
    std::filesystem::create_directories(dir.path() / name);
    for (int i = 0; i < 20; ++i)
      io::write_png(dir.file(name + "/" + std::to_string(i) + ".png"),
                    solid(16, 16, static_cast<uint8_t>(10 * i + 1)));
  }
  train::TrainConfig config;
  config.dataset = "folder:" + dir.path().string();
  const auto whole = train::load_datasets(config);  // 72 training sprites, 8 held out
  ASSERT_EQ(whole.train.size(), 72);
  ASSERT_EQ(whole.test.size(), 8);
  config.train_limit = 8;
  config.test_limit = 4;
  const auto limited = train::load_datasets(config);
  ASSERT_EQ(limited.train.size(), 8);
  ASSERT_EQ(limited.test.size(), 4);
  // The 72 hold 12-20 of each class in class order: every class is there, where the first 8 were
  // all a's, and in class order; so in the held-out split.
  const auto kinds = [](const torch::Tensor& labels) {
    return std::get<0>(at::_unique(labels)).numel();
  };
  EXPECT_EQ(kinds(limited.train.labels), 4) << limited.train.labels;
  EXPECT_TRUE(torch::equal(limited.train.labels, std::get<0>(limited.train.labels.sort())));
  EXPECT_TRUE(torch::equal(limited.train.inputs, whole.train.spread(8).inputs));
  EXPECT_EQ(kinds(limited.test.labels), kinds(whole.test.labels)) << limited.test.labels;
  EXPECT_TRUE(torch::equal(limited.test.inputs, whole.test.spread(4).inputs));
}

// An unbalanced folder (2, 5, 1 and 30 sprites): a limit of at least the classes keeps every
// class of the split, where samples at even steps over all of it skipped the small ones.
TEST(SpriteSources, LimitsKeepEveryClassOfAnUnbalancedFolder) {
  ScratchDir dir;
  const std::vector<std::pair<std::string, int>> classes{{"a", 2}, {"b", 5}, {"c", 1}, {"d", 30}};
  for (const auto& [name, count] : classes) {
    std::filesystem::create_directories(dir.path() / name);
    for (int i = 0; i < count; ++i)
      io::write_png(dir.file(name + "/" + std::to_string(i) + ".png"),
                    solid(16, 16, static_cast<uint8_t>(7 * i + 1)));
  }
  train::TrainConfig config;
  config.dataset = "folder:" + dir.path().string();
  config.sprites.holdout = 0.25;
  const auto whole = train::load_datasets(config);
  const auto kinds = [](const torch::Tensor& labels) {
    return std::get<0>(at::_unique(labels)).numel();
  };
  for (const int64_t limit : {4, 5, 7}) {
    config.train_limit = limit;
    config.test_limit = limit;
    const auto limited = train::load_datasets(config);
    EXPECT_EQ(limited.train.size(), limit);
    EXPECT_EQ(limited.test.size(), std::min(limit, whole.test.size()));
    EXPECT_EQ(kinds(limited.train.labels), kinds(whole.train.labels)) << limited.train.labels;
    EXPECT_EQ(kinds(limited.test.labels), kinds(whole.test.labels)) << limited.test.labels;
    // What eval reads: the same held-out samples.
    EXPECT_TRUE(torch::equal(train::load_test_dataset(config).inputs, limited.test.inputs));
  }
}

TEST(Dataset, SpreadTakesEvenStepsAndAllWhenAskedForMore) {
  data::Dataset set;
  set.inputs = torch::arange(10, torch::kLong).view({10, 1});
  set.labels = torch::arange(10, torch::kLong);
  EXPECT_TRUE(torch::equal(set.spread(3).labels, torch::tensor({0, 3, 6}, torch::kLong)));
  EXPECT_TRUE(
      torch::equal(set.spread(5).inputs.view(-1), torch::tensor({0, 2, 4, 6, 8}, torch::kLong)));
  EXPECT_EQ(set.spread(10).size(), 10);
  EXPECT_EQ(set.spread(50).size(), 10);
  EXPECT_EQ(set.spread(0).size(), 0);
}

// Class counts 6, 4, 3 and 9, in class order: a limit of at least the 4 classes keeps each (one,
// the rest in proportion by largest remainders, evenly spread within the class); fewer than the
// classes take one sample of classes at even steps. Samples at even steps over the whole set gave
// counts 2, 0, 1, 1 for 4 and 2, 1, 0, 2 for 5.
TEST(Dataset, SpreadKeepsEveryClassOfAnUnbalancedSet) {
  std::vector<int64_t> labels;
  const std::vector<std::pair<int64_t, size_t>> classes{{0, 6}, {1, 4}, {2, 3}, {3, 9}};
  for (const auto& [label, count] : classes) labels.insert(labels.end(), count, label);
  data::Dataset set;
  set.labels = torch::tensor(labels, torch::kLong);
  set.inputs = torch::arange(set.labels.size(0), torch::kLong).view({-1, 1});
  const auto picked = [&](int64_t n) { return set.spread(n).inputs.view(-1); };
  const auto counts = [&](int64_t n) { return torch::bincount(set.spread(n).labels, {}, 4); };
  EXPECT_TRUE(torch::equal(picked(4), torch::tensor({0, 6, 10, 13}, torch::kLong)));
  EXPECT_TRUE(torch::equal(picked(5), torch::tensor({0, 6, 10, 13, 17}, torch::kLong)));
  // 7 shared by 5, 3, 2 and 8 of the 18 beyond the first: 1.94, 1.17, 0.78, 3.11.
  EXPECT_TRUE(torch::equal(counts(11), torch::tensor({3, 2, 2, 4}, torch::kLong)));
  EXPECT_TRUE(torch::equal(picked(2), torch::tensor({0, 10}, torch::kLong)));
  EXPECT_TRUE(torch::equal(picked(3), torch::tensor({0, 6, 10}, torch::kLong)));
  for (int64_t n = 4; n < set.size(); ++n) {
    const auto c = counts(n);
    EXPECT_EQ(c.sum().item<int64_t>(), n);
    EXPECT_GE(c.min().item<int64_t>(), 1) << n << ": " << c;
    EXPECT_TRUE(torch::equal(set.spread(n).labels, std::get<0>(set.spread(n).labels.sort())));
  }
  EXPECT_TRUE(torch::equal(set.spread(set.size()).labels, set.labels));
}

// An option the dataset does not read is an Error naming it, not a run that ignores it.
TEST(SpriteSources, OptionsTheDatasetDoesNotReadAreRefused) {
  const auto message = [](const std::string& dataset, const SpriteOptions& options) {
    try {
      check_sprite_options_apply(dataset, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const SpriteOptions defaults;
  for (const std::string dataset :
       {"fashion-mnist", "dummy", "sprites", "folder:x", "sheet:x.png", "npy:x.npy"})
    EXPECT_EQ(message(dataset, defaults), "") << dataset;

  SpriteOptions size = defaults;
  size.size = 32;
  EXPECT_EQ(message("fashion-mnist", size),
            "--size applies to sprite datasets (sprites, folder:, sheet:, npy:), not --dataset "
            "fashion-mnist");
  EXPECT_EQ(message("folder:x", size), "");
  SpriteOptions resize = defaults, holdout = defaults, seed = defaults;
  resize.resize = "nearest";
  holdout.holdout = 0.2;
  seed.seed = 7;
  for (const auto& [options, flag] :
       {std::pair{resize, "--resize"}, {holdout, "--holdout"}, {seed, "--data-seed"}}) {
    EXPECT_NE(message("dummy", options).find(flag), std::string::npos) << flag;
    EXPECT_EQ(message("npy:x.npy", options), "") << flag;
  }

  SpriteOptions count = defaults;
  count.count = 100;
  EXPECT_EQ(message("sprites", count), "");
  EXPECT_EQ(message("folder:x", count),
            "--sprite-count applies to the procedural sprites (--dataset sprites), not --dataset "
            "folder:x");

  SpriteOptions tile = defaults, spacing = defaults, margin = defaults, labels = defaults;
  tile.tile_h = 8;
  spacing.spacing = 1;
  margin.margin = 2;
  labels.label_map = "map.txt";
  for (const auto& [options, flag] : {std::pair{tile, "--tile"},
                                      {spacing, "--spacing"},
                                      {margin, "--margin"},
                                      {labels, "--labels"}}) {
    EXPECT_EQ(message("sheet:x.png", options), "") << flag;
    EXPECT_EQ(message("sprites", options), std::string(flag) +
                                               " applies to sprite sheets (--dataset sheet:FILE), "
                                               "not --dataset sprites");
    EXPECT_EQ(message("fashion-mnist", options),
              std::string(flag) +
                  " applies to sprite sheets (--dataset sheet:FILE), not --dataset fashion-mnist");
  }
  EXPECT_EQ(message("dummy", count),
            "--sprite-count applies to the procedural sprites (--dataset sprites), not --dataset "
            "dummy");

  // What a checkpoint recorded is read as the dataset reads it: the rest back at its default.
  SpriteOptions recorded = defaults;
  recorded.size = 32;
  recorded.count = 100;
  recorded.tile_w = 8;
  recorded.label_map = "map.txt";
  recorded.resize = "nearest";
  const SpriteOptions folder = sprite_options_read_by("folder:x", recorded);
  EXPECT_EQ(folder.size, 32);
  EXPECT_EQ(folder.resize, "nearest");
  EXPECT_EQ(folder.count, defaults.count);
  EXPECT_EQ(folder.tile_w, defaults.tile_w);
  EXPECT_EQ(folder.label_map, "");
  EXPECT_EQ(message("folder:x", folder), "");
  const SpriteOptions sheet = sprite_options_read_by("sheet:x.png", recorded);
  EXPECT_EQ(sheet.tile_w, 8);
  EXPECT_EQ(sheet.label_map, "map.txt");
  EXPECT_EQ(sheet.count, defaults.count);
  EXPECT_EQ(sprite_options_read_by("sprites", recorded).count, 100);
  EXPECT_EQ(message("fashion-mnist", sprite_options_read_by("fashion-mnist", recorded)), "");

  // load_datasets refuses before reading anything (no Fashion-MNIST files are needed here).
  train::TrainConfig config;
  config.dataset = "fashion-mnist";
  config.data_dir = "/nonexistent";
  config.sprites.size = 64;
  try {
    train::load_datasets(config);
    ADD_FAILURE() << "load_datasets took --size for fashion-mnist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--size applies to sprite datasets"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace spritetorch::data
