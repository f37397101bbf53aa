#include "interop/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "test_util.h"

namespace spritetorch::interop {
namespace {

using spritetorch::testing::ScratchDir;

// A file built by hand from the format's definition, independent of our writer.
std::string handmade(const std::string& json, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((json.size() >> (8 * i)) & 0xff));
  return out + json + data;
}

std::string floats(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

std::string read_error(const std::string& bytes) {
  try {
    read_safetensors_bytes(bytes, "w.safetensors");
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Safetensors, ReadsAHandmadeFile) {
  const auto file = read_safetensors_bytes(
      handmade(
          R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[],"data_offsets":[8,16]},)"
          R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
          floats({1.5f, -2.0f}) + std::string("\x07\0\0\0\0\0\0\0", 8)),
      "hand");
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(file.tensors[0].first, "a");  // data order
  EXPECT_TRUE(torch::equal(file.tensors[0].second, torch::tensor({1.5f, -2.0f})));
  EXPECT_EQ(file.tensors[1].second.dim(), 0);
  EXPECT_EQ(file.tensors[1].second.item<int64_t>(), 7);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  ASSERT_NE(file.find("b"), nullptr);
  EXPECT_EQ(file.find("c"), nullptr);
}

TEST(Safetensors, RoundTripKeepsOrderDtypesAndMetadata) {
  ScratchDir dir;
  TensorFile file;
  file.tensors = {{"z.weight", torch::randn({3, 4})},
                  {"a.half", torch::randn({5}).to(torch::kFloat16)},
                  {"m.bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
                  {"d", torch::randn({2}, torch::kFloat64)},
                  {"i", torch::arange(6, torch::kInt32).view({2, 3})},
                  {"u", torch::tensor({0, 255}, torch::kUInt8)},
                  {"s", torch::tensor({-3}, torch::kInt8)},
                  {"b", torch::tensor({true, false})},
                  {"empty", torch::zeros({0, 7})},
                  {"strided", torch::arange(12, torch::kFloat32).view({3, 4}).t()}};
  file.metadata = {{"format", "pt"}, {"note", "x\"y"}};
  write_safetensors(dir.file("t.safetensors"), file);
  const auto back = read_safetensors(dir.file("t.safetensors"));
  ASSERT_EQ(back.tensors.size(), file.tensors.size());
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, file.tensors[i].first);
    EXPECT_EQ(back.tensors[i].second.scalar_type(), file.tensors[i].second.scalar_type());
    EXPECT_TRUE(torch::equal(back.tensors[i].second, file.tensors[i].second))
        << file.tensors[i].first;
  }
  EXPECT_EQ(back.metadata, file.metadata);
}

TEST(Safetensors, HeaderIsPaddedSoDataIsAligned) {
  TensorFile file;
  file.tensors = {{"w", torch::ones({3})}};
  const std::string bytes = safetensors_bytes(file);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  EXPECT_EQ(header % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header + 12);
}

TEST(Safetensors, WriterRefusesWhatTheFormatCannotHold) {
  TensorFile complex;
  complex.tensors = {{"c", torch::zeros({2}, torch::kComplexFloat)}};
  EXPECT_THROW(safetensors_bytes(complex), Error);
  TensorFile reserved;
  reserved.tensors = {{"__metadata__", torch::zeros({2})}};
  EXPECT_THROW(safetensors_bytes(reserved), Error);
  TensorFile twice;
  twice.tensors = {{"a", torch::zeros({2})}, {"a", torch::zeros({2})}};
  EXPECT_THROW(safetensors_bytes(twice), Error);
}

TEST(Safetensors, RejectsMalformedFilesNamingTheProblem) {
  const std::string two = floats({1, 2});
  const auto entry = [](const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" +
           offsets + "}}";
  };
  EXPECT_NE(read_error("abc").find("3 bytes"), std::string::npos);
  std::string huge_header = handmade("{}", "");
  huge_header[5] = 1;  // header length 2^40
  EXPECT_NE(read_error(huge_header).find("header length"), std::string::npos);
  EXPECT_NE(read_error(handmade("{\"w\":", "")).find("invalid JSON"), std::string::npos);
  EXPECT_NE(read_error(handmade("[1,2]", "")).find("a JSON array"), std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F33", "[2]", "[0,8]"), two)).find("dtype \"F33\""),
            std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F32", "[-2]", "[0,8]"), two)).find("non-negative"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F32", "[2]", "[0,8]"), floats({1}))).find("truncated"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F32", "[3]", "[0,8]"), two)).find("12 bytes"),
            std::string::npos);
  EXPECT_NE(
      read_error(handmade(entry("F32", "[4611686018427387904,4]", "[0,8]"), two)).find("64 bits"),
      std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F32", "[2]", "[8,0]"), two)).find("data_offsets"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F32", "[2]", "[0,8]"), two + "xx")).find("10 bytes"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(entry("F32", "[1]", "[4,8]"), two)).find("at byte 4"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                two))
                .find("tensor 'b' at byte 4"),
            std::string::npos);  // overlap
  EXPECT_NE(read_error(handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                two))
                .find("'a' twice"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(R"({"__metadata__":{"k":1}})", "")).find("string values"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(entry("BOOL", "[2]", "[0,2]"), std::string("\x01\x02", 2)))
                .find("byte value 2"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(R"({"w":{"dtype":"F32","shape":[2]}})", two)).find("data_offsets"),
            std::string::npos);
  for (const auto& message : {read_error("abc"), read_error(handmade("[1]", ""))})
    EXPECT_EQ(message.rfind("w.safetensors: expected", 0), 0u) << message;
}

TEST(Safetensors, MissingFileIsADataError) {
  EXPECT_THROW(read_safetensors("/nonexistent/w.safetensors"), DataError);
}

}  // namespace
}  // namespace spritetorch::interop
