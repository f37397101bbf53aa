// Flat TOML config files: entries with kinds and lines, errors with file:line(:column), literals
// that read back as the same value.
#include "config/toml_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "common/error.h"
#include "test_util.h"

namespace spritetorch::config {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_flat_toml(text, "run.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TomlFileTest, EntriesKeepKindValueAndLineInFileOrder) {
  const auto entries = parse_flat_toml(
      "# a comment\n"
      "zeta = \"cpu\"\n"
      "batch-size = 64\n"
      "\n"
      "lr = 1e-3\n"
      "drop-last = true\n"
      "sizes = [16, 32]\n",
      "run.toml");
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[0].key, "zeta");  // file order, not toml++'s sorted order
  EXPECT_EQ(entries[0].kind, ValueKind::kString);
  EXPECT_EQ(entries[0].values, std::vector<std::string>{"cpu"});
  EXPECT_EQ(entries[0].line, 2);
  EXPECT_EQ(entries[1].key, "batch-size");
  EXPECT_EQ(entries[1].kind, ValueKind::kInteger);
  EXPECT_EQ(entries[1].values, std::vector<std::string>{"64"});
  EXPECT_EQ(entries[1].line, 3);
  EXPECT_EQ(entries[2].kind, ValueKind::kFloat);
  EXPECT_EQ(entries[2].values, std::vector<std::string>{"0.001"});
  EXPECT_EQ(entries[2].line, 5);
  EXPECT_EQ(entries[3].kind, ValueKind::kBoolean);
  EXPECT_EQ(entries[3].values, std::vector<std::string>{"true"});
  EXPECT_EQ(entries[4].kind, ValueKind::kArray);
  EXPECT_EQ(entries[4].values, (std::vector<std::string>{"16", "32"}));
  EXPECT_EQ(entries[4].line, 7);
  EXPECT_EQ(entries[4].column, 1);
}

TEST(TomlFileTest, SyntaxErrorsNameFileLineAndColumn) {
  EXPECT_NE(error_of("epochs = 3\nlr = \n").find("run.toml:2:"), std::string::npos)
      << error_of("epochs = 3\nlr = \n");
  const std::string unterminated = error_of("epochs = 3\n\ndevice = \"cpu\n");
  EXPECT_NE(unterminated.find("run.toml:3:"), std::string::npos) << unterminated;
  EXPECT_NE(unterminated.find("TOML syntax error"), std::string::npos) << unterminated;
  const std::string duplicate = error_of("epochs = 3\nepochs = 4\n");
  EXPECT_NE(duplicate.find("run.toml:2:"), std::string::npos) << duplicate;
}

TEST(TomlFileTest, TablesAndNestedArraysAreErrorsWithTheirLine) {
  const std::string table = error_of("epochs = 3\n[train]\nlr = 0.1\n");
  EXPECT_NE(table.find("run.toml:2: [train]"), std::string::npos) << table;
  const std::string nested = error_of("epochs = 3\n\n\nsizes = [[1], [2]]\n");
  EXPECT_NE(nested.find("run.toml:4: key 'sizes'"), std::string::npos) << nested;
}

TEST(TomlFileTest, MissingFileIsAnErrorNamingIt) {
  try {
    read_flat_toml_file("/nonexistent/run.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/run.toml"), std::string::npos);
  }
}

// A device or an endless pipe would be read until memory runs out: a device is refused by what it
// is, and no file past 1 MiB (no config of options is that long) is read further.
TEST(TomlFileTest, DevicesAndFilesPastOneMebibyteAreRefused) {
  try {
    read_flat_toml_file("/dev/zero");
    FAIL() << "/dev/zero read as a config";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero: expected a TOML config file, found a device"),
              std::string::npos)
        << e.what();
  }
  spritetorch::testing::ScratchDir dir;
  const std::string big = dir.file("big.toml");
  {
    std::ofstream out(big);
    out << "epochs = 1\n# " << std::string(1 << 20, 'x') << "\n";
  }
  try {
    read_flat_toml_file(big);
    FAIL() << "a config past 1 MiB was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("a TOML config file of at most 1 MiB"), std::string::npos)
        << e.what();
  }
  const std::string small = dir.file("small.toml");
  {
    std::ofstream out(small);
    out << "epochs = 2\n";
  }
  const auto entries = read_flat_toml_file(small);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, "epochs");
}

TEST(TomlFileTest, FloatLiteralsAreShortAndReadBackExactly) {
  EXPECT_EQ(toml_float_literal(0.1), "0.1");
  EXPECT_EQ(toml_float_literal(1e-3), "0.001");
  EXPECT_EQ(toml_float_literal(3.0), "3.0");  // not "3", which TOML reads as an integer
  EXPECT_EQ(toml_float_literal(300.0), "300.0");
  EXPECT_EQ(toml_float_literal(-INFINITY), "-inf");
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> exponent(-30, 30);
  for (int i = 0; i < 200; ++i) {
    const double value = std::pow(10.0, exponent(rng)) * (i % 2 ? -1 : 1);
    const auto entries = parse_flat_toml("x = " + toml_float_literal(value) + "\n", "t.toml");
    ASSERT_EQ(entries[0].kind, ValueKind::kFloat) << toml_float_literal(value);
    EXPECT_EQ(std::strtod(entries[0].values[0].c_str(), nullptr), value)
        << toml_float_literal(value);
  }
}

TEST(TomlFileTest, StringLiteralsReadBackAsTheSameString) {
  const std::string nasty = "a \"quoted\" \\path\\\twith\nnewline \x01 and ünïcode";
  const auto entries = parse_flat_toml("s = " + toml_string_literal(nasty) + "\n", "t.toml");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].values[0], nasty);
}

}  // namespace
}  // namespace spritetorch::config
