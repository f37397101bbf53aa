// Hostile and corrupt files get a clear DataError (file, expected, found), never a crash or an
// allocation the size of what a header claims. Also replays every committed fuzz input
// (fuzz/corpus/<target>/ and the crash regressions in tests/data/fuzz/<target>/) through its
// reader.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "common/error.h"
#include "common/json_field.h"
#include "data/idx_reader.h"
#include "data/picture.h"
#include "io/png.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/model_state.h"
#include "train/trainer.h"

namespace spritetorch {
namespace {

using testing::idx_bytes;
using testing::ScratchDir;
using testing::write_bytes;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <typename F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(HostileIdx, TruncatedGzipStreamIsAClearError) {
  ScratchDir dir;
  std::vector<uint8_t> pixels(50 * 784);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  testing::write_gz(dir.file("full.gz"), idx_bytes({50, 28, 28}, pixels));
  const std::string gz = slurp(dir.file("full.gz"));
  for (size_t keep : {gz.size() / 2, gz.size() - 4, size_t{12}}) {
    std::ofstream(dir.file("cut.gz"), std::ios::binary)
        .write(gz.data(), static_cast<std::streamsize>(keep));
    const std::string msg = data_error_of([&] { data::read_idx(dir.file("cut.gz")); });
    EXPECT_NE(msg.find(dir.file("cut.gz") + ": expected "), std::string::npos)
        << keep << ": " << msg;
  }
}

TEST(HostileCheckpoint, HugeLengthFieldAndBadCrcAreClearErrors) {
  ScratchDir dir;
  train::Checkpoint c;
  c.meta = {{"model", "simplenn"}, {"input_shape", {3}}, {"classes", 2}};
  c.model = train::model_state(*models::make_model({"simplenn", {3}, 2}));
  train::save_checkpoint(dir.file("ok.ckpt"), c);
  const std::string good = slurp(dir.file("ok.ckpt"));

  std::string huge = good;
  for (int i = 20; i < 28; ++i) huge[i] = '\xff';  // payload length 2^64-1
  std::string msg = data_error_of([&] { train::load_checkpoint_bytes(huge, "huge.ckpt"); });
  EXPECT_NE(msg.find("huge.ckpt: expected 18446744073709551615 payload bytes"), std::string::npos)
      << msg;

  std::string bad_crc = good;
  bad_crc[28] ^= 1;
  msg = data_error_of([&] { train::load_checkpoint_bytes(bad_crc, "crc.ckpt"); });
  EXPECT_NE(msg.find("crc.ckpt: expected a payload matching its CRC-32"), std::string::npos) << msg;

  EXPECT_NE(data_error_of([&] { train::load_checkpoint_bytes("", "empty.ckpt"); }).find("0 bytes"),
            std::string::npos);
}

TEST(HostileCheckpoint, MetadataCannotSizeAnAbsurdModel) {
  train::Checkpoint c;
  c.model = train::model_state(*models::make_model({"simplenn", {3}, 2}));  // 62 weights
  for (const auto& [shape, classes] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
           {{1, 65536, 65536}, 10},  // 2^32 inputs
           {{3}, 1000000},           // 10^6 classes
           {{-1}, 2},
           {{}, 2}}) {
    c.meta = {{"model", "ann"}, {"input_shape", shape}, {"classes", classes}};
    const std::string msg =
        data_error_of([&] { train::model_from_checkpoint(c, "evil.ckpt", torch::kCPU); });
    EXPECT_NE(msg.find("evil.ckpt: expected "), std::string::npos) << msg;
  }
}

// Metadata that would build a model but describe it wrongly: the wrong kind of checkpoint, names
// for other classes, a test-time transform this build does not know. Each is refused naming the
// file and the field (before, a generator was "found no 'input_shape'", and the other three were
// used as they were: classify printed a wrong name or none).
TEST(HostileCheckpoint, MetadataThatDescribesTheModelWronglyIsRefused) {
  train::Checkpoint c;
  const auto model = models::make_model({"simplenn", {3}, 2});
  c.model = train::model_state(*model);
  const nlohmann::json good = {{"task", "classify"},
                               {"model", "simplenn"},
                               {"input_shape", {3}},
                               {"classes", 2},
                               {"class_names", {"bow", "sword"}},
                               {"test_time_augment", "none"}};
  c.meta = good;
  ASSERT_NO_THROW(train::model_from_checkpoint(c, "ok.ckpt", torch::kCPU));
  ASSERT_NO_THROW(train::checkpoint_forward(c.meta, model, "ok.ckpt"));
  c.meta.erase("class_names");  // optional: a dataset without names predicts numbers
  c.meta.erase("task");         // absent in the oldest checkpoints
  EXPECT_NO_THROW(train::model_from_checkpoint(c, "old.ckpt", torch::kCPU));

  auto refused = [&](const char* key, const nlohmann::json& value) {
    c.meta = good;
    c.meta[key] = value;
    return data_error_of([&] {
      train::model_from_checkpoint(c, "evil.ckpt", torch::kCPU);
      train::checkpoint_forward(c.meta, model, "evil.ckpt");
    });
  };
  std::string msg = refused("task", "generate");
  EXPECT_NE(msg.find("evil.ckpt: expected a classifier checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("generator"), std::string::npos) << msg;
  msg = refused("task", "bogus");
  // (A task spritetorch does not know is a task of a user's program:
  // tests/train/user_task_test.cpp.)
  EXPECT_NE(msg.find("a classifier spritetorch can build (ann, "), std::string::npos) << msg;
  EXPECT_NE(msg.find("found task 'bogus'"), std::string::npos) << msg;
  msg = refused("class_names", {"bow"});
  EXPECT_NE(msg.find("one name for each of its 2 classes, found 1 names"), std::string::npos)
      << msg;
  msg = refused("class_names", {"a", "b", "c"});
  EXPECT_NE(msg.find("found 3 names"), std::string::npos) << msg;
  msg = refused("test_time_augment", "rotate");
  EXPECT_NE(msg.find("'test_time_augment' as none or flip, found 'rotate'"), std::string::npos)
      << msg;
}

// Each committed input of a fuzz target must give a clean result (a value or DataError/Error).
int replay(const std::string& folder, const std::function<void(const std::string&)>& read) {
  namespace fs = std::filesystem;
  if (!fs::exists(folder)) return 0;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(folder)) {
    try {
      read(entry.path().string());
    } catch (const Error&) {
    }
    ++count;
  }
  ::testing::Test::RecordProperty(fs::path(folder).filename().string(), count);
  return count;
}

const std::string kSource = SPRITETORCH_TEST_DIR "/..";

// An unsigned field given a negative number (an imported file's "seed": -5) is refused, not
// wrapped to 2^64 - 5; a string is refused as before.
// A checkpoint of a run that diverged (or another tool's) with a NaN or infinity in its weights:
// its outputs are NaN, which eval read as a loss of -nan, classify as class 0 with confidence -nan.
TEST(HostileCheckpoint, NonFiniteWeightsAreRefusedNamingTheTensor) {
  train::Checkpoint c;
  const auto model = models::make_model({"simplenn", {3}, 2});
  c.model = train::model_state(*model);
  c.meta = {{"task", "classify"}, {"model", "simplenn"}, {"input_shape", {3}}, {"classes", 2}};
  ASSERT_NO_THROW(train::model_from_checkpoint(c, "ok.ckpt", torch::kCPU));
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto& [name, tensor] = *c.model.rbegin();
    const torch::Tensor kept = tensor.clone();
    tensor.view(-1)[0] = bad;
    const std::string error =
        data_error_of([&] { train::model_from_checkpoint(c, "nan.ckpt", torch::kCPU); });
    EXPECT_NE(
        error.find("nan.ckpt: expected finite weights, found NaN or infinity in '" + name + "'"),
        std::string::npos)
        << error;
    tensor = kept;
  }
}

TEST(HostileCheckpoint, ANegativeNumberForAnUnsignedFieldIsRefused) {
  const nlohmann::json good = {{"seed", 5}}, negative = {{"seed", -5}}, text = {{"seed", "5"}};
  EXPECT_EQ(json_field(good, "seed", uint64_t{0}, "m.pt", "seed"), 5u);
  try {
    json_field(negative, "seed", uint64_t{0}, "m.pt", "seed");
    ADD_FAILURE() << "-5 read as an unsigned seed";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("'seed' as an integer >= 0, found a JSON number (-5)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(json_field(text, "seed", uint64_t{0}, "m.pt", "seed"), DataError);
  EXPECT_EQ(json_field(negative, "seed", int64_t{0}, "m.pt", "seed"), -5);
}

TEST(FuzzInputs, IdxCorpusAndRegressionsReadCleanly) {
  for (const char* target : {"idx_fuzzer", "idx_gz_fuzzer"}) {
    replay(kSource + "/tests/data/fuzz/" + target, [](const std::string& p) { data::read_idx(p); });
  }
  EXPECT_GT(
      replay(kSource + "/fuzz/corpus/idx_fuzzer", [](const std::string& p) { data::read_idx(p); }),
      0);
}

TEST(FuzzInputs, CheckpointCorpusAndRegressionsLoadCleanly) {
  auto load = [](const std::string& p) {
    const auto c = train::load_checkpoint(p);
    train::model_from_checkpoint(c, p, torch::kCPU);
  };
  EXPECT_GT(replay(kSource + "/fuzz/corpus/checkpoint_fuzzer", load), 0);
  replay(kSource + "/tests/data/fuzz/checkpoint_fuzzer", load);
}

TEST(FuzzInputs, PngCorpusAndRegressionsDecodeCleanly) {
  auto read = [](const std::string& p) {
    const auto rgba = io::read_png(p);
    data::picture_to_input(rgba, {1, 28, 28});
    data::picture_to_input(rgba, {4, 16, 16});
  };
  // Each seed is a valid PNG but the truncated ones: they decode to (H, W, 4).
  EXPECT_GT(replay(kSource + "/fuzz/corpus/png_fuzzer", read), 8);
  EXPECT_EQ(io::read_png(kSource + "/fuzz/corpus/png_fuzzer/palette-trns-4x4").sizes(),
            (std::vector<int64_t>{4, 4, 4}));
  replay(kSource + "/tests/data/fuzz/png_fuzzer", read);
}

// checkpoint_payload_fuzzer's inputs are payloads: wrapped in a valid header as the target does.
TEST(FuzzInputs, CheckpointPayloadCorpusAndRegressionsLoadCleanly) {
  auto load = [](const std::string& p) {
    const std::string payload = slurp(p);
    std::string bytes = "SPRITETORCH-CKPT";
    auto put = [&bytes](uint64_t value, int n) {
      for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
    };
    put(train::kCheckpointVersion, 4);
    put(payload.size(), 8);
    put(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()),
              static_cast<uInt>(payload.size())),
        4);
    const auto c = train::load_checkpoint_bytes(bytes + payload, p);
    train::model_from_checkpoint(c, p, torch::kCPU);
  };
  EXPECT_GT(replay(kSource + "/fuzz/corpus/checkpoint_payload_fuzzer", load), 0);
  replay(kSource + "/tests/data/fuzz/checkpoint_payload_fuzzer", load);
}

}  // namespace
}  // namespace spritetorch
