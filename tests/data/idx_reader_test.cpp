#include "data/idx_reader.h"

#include <gtest/gtest.h>
#include <filesystem>

#include "common/error.h"
#include "data/fashion_mnist.h"
#include "test_util.h"

namespace spritetorch::data {
namespace {

using spritetorch::testing::idx_bytes;
using spritetorch::testing::ScratchDir;
using spritetorch::testing::write_bytes;
using spritetorch::testing::write_gz;

std::string error_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> ramp(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

TEST(IdxReader, ReadsPlainFile) {
  ScratchDir dir;
  write_bytes(dir.file("a"), idx_bytes({3, 2, 2}, ramp(12)));
  const auto t = read_idx(dir.file("a"));
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(t.scalar_type(), torch::kUInt8);
  EXPECT_EQ(t[2][1][1].item<uint8_t>(), static_cast<uint8_t>(11 * 7));
}

TEST(IdxReader, ReadsGzipFileLikeThePlainOne) {
  ScratchDir dir;
  write_bytes(dir.file("plain"), idx_bytes({5, 3}, ramp(15)));
  write_gz(dir.file("packed.gz"), idx_bytes({5, 3}, ramp(15)));
  EXPECT_TRUE(torch::equal(read_idx(dir.file("plain")), read_idx(dir.file("packed.gz"))));
}

TEST(IdxReader, RejectsBadMagicAndType) {
  ScratchDir dir;
  auto bytes = idx_bytes({2}, {1, 2});
  bytes[0] = 0x42;
  write_bytes(dir.file("magic"), bytes);
  EXPECT_NE(error_of(dir.file("magic")).find("expected IDX magic 0x0000"), std::string::npos);
  bytes = idx_bytes({2}, {1, 2});
  bytes[2] = 0x0D;  // float32: not what image datasets use
  write_bytes(dir.file("type"), bytes);
  EXPECT_NE(error_of(dir.file("type")).find("element type 0x08"), std::string::npos);
}

TEST(IdxReader, RejectsTruncatedAndPaddedFiles) {
  ScratchDir dir;
  auto bytes = idx_bytes({4, 4}, ramp(16));
  bytes.resize(bytes.size() - 3);
  write_bytes(dir.file("short"), bytes);
  const auto msg = error_of(dir.file("short"));
  EXPECT_NE(msg.find(dir.file("short")), std::string::npos) << "names the file: " << msg;
  EXPECT_NE(msg.find("expected 16 data bytes, found 13"), std::string::npos) << msg;

  bytes = idx_bytes({4, 4}, ramp(17));
  write_bytes(dir.file("long"), bytes);
  EXPECT_NE(error_of(dir.file("long")).find("trailing bytes"), std::string::npos);

  write_bytes(dir.file("empty"), {});
  EXPECT_NE(error_of(dir.file("empty")).find("4-byte IDX header"), std::string::npos);
  EXPECT_NE(error_of(dir.file("missing")).find("cannot be opened"), std::string::npos);
}

TEST(IdxReader, HeaderClaimingBillionsOfImagesFailsWithoutAllocatingThem) {
  ScratchDir dir;
  // 10^9 images of 28x28 claimed, 100 bytes present: must fail as truncated, not try 784 GB.
  write_bytes(dir.file("liar"), idx_bytes({1000000000u, 28, 28}, ramp(100)));
  const auto msg = error_of(dir.file("liar"));
  EXPECT_NE(msg.find("at most"), std::string::npos) << msg;
  write_bytes(dir.file("liar2"), idx_bytes({1000000u, 28, 28}, ramp(100)));
  EXPECT_NE(error_of(dir.file("liar2")).find("found 100 (truncated file)"), std::string::npos);
}

TEST(IdxReader, RejectsZeroDimensionsAndCorruptGzip) {
  ScratchDir dir;
  write_bytes(dir.file("zero"), idx_bytes({0, 28}, {}));
  EXPECT_NE(error_of(dir.file("zero")).find("non-zero dimensions"), std::string::npos);
  // A gzip header followed by garbage.
  write_bytes(dir.file("bad.gz"),
              {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0x03, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3});
  EXPECT_FALSE(error_of(dir.file("bad.gz")).empty());
}

class FashionMnistFolder : public ::testing::Test {
 protected:
  void write_split(const std::string& prefix, uint32_t images, uint32_t labels,
                   uint8_t max_label = 9) {
    write_gz(dir_.file(prefix + "-images-idx3-ubyte.gz"),
             idx_bytes({images, 28, 28}, ramp(images * 784)));
    std::vector<uint8_t> l(labels);
    for (uint32_t i = 0; i < labels; ++i) l[i] = static_cast<uint8_t>(i % (max_label + 1));
    write_gz(dir_.file(prefix + "-labels-idx1-ubyte.gz"), idx_bytes({labels}, l));
  }
  ScratchDir dir_;
};

TEST_F(FashionMnistFolder, LoadsImagesAsNchwWithClassNames) {
  write_split("train", 20, 20);
  const auto d = load_fashion_mnist(dir_.path().string(), Split::kTrain);
  EXPECT_EQ(d.inputs.sizes(), (std::vector<int64_t>{20, 1, 28, 28}));
  EXPECT_EQ(d.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.labels[13].item<int64_t>(), 3);
  EXPECT_EQ(d.class_names.front(), "T-shirt/top");
  EXPECT_EQ(d.class_names.back(), "Ankle boot");
}

TEST_F(FashionMnistFolder, CountMismatchBadLabelAndMissingFileAreClearErrors) {
  write_split("train", 20, 19);
  try {
    load_fashion_mnist(dir_.path().string(), Split::kTrain);
    FAIL() << "count mismatch accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 20 labels"), std::string::npos) << e.what();
  }
  write_split("t10k", 13, 13, 12);  // labels 0..12
  try {
    load_fashion_mnist(dir_.path().string(), Split::kTest);
    FAIL() << "label 12 accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("labels 0..9"), std::string::npos) << e.what();
  }
  try {
    load_fashion_mnist(dir_.file("nowhere"), Split::kTest);
    FAIL() << "missing folder accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "nowhere: expected a folder holding Fashion-MNIST's t10k IDX files"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("found no such folder"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("dataset-fashion-mnist"), std::string::npos);
    // The test split alone (eval) needs its two files, and the hint names them.
    EXPECT_NE(e.hint().find("t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte"), std::string::npos)
        << e.hint();
  }
  std::filesystem::create_directory(dir_.file("empty"));
  try {  // a folder without the files names the first one missing
    load_fashion_mnist(dir_.file("empty"), Split::kTest);
    FAIL() << "a folder without the test files accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("t10k-images-idx3-ubyte"), std::string::npos) << e.what();
  }
}

TEST(FashionMnistReal, DebianPackageReadsWithExpectedCounts) {
  SKIP_WITHOUT_FASHION_MNIST();
  const auto train = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain);
  const auto test = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTest);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  // Balanced: 6000 of each class in train.
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kInt64)));
}

}  // namespace
}  // namespace spritetorch::data
