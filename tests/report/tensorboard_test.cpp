// The TensorBoard writer: CRC-32C against RFC 3720's vectors, TFRecord framing, and the whole file
// read back by tests/report/read_tfevents.py, which decodes it with crcmod and protobuf (no code
// shared with the writer).
#include "report/tensorboard.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/crc32c.h"
#include "common/error.h"
#include "io/png.h"
#include "test_util.h"

namespace spritetorch::report {
namespace {

TEST(Crc32cTest, MatchesRfc3720Vectors) {
  std::array<uint8_t, 32> bytes{};
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x8A9136AAu);  // 32 zero bytes
  bytes.fill(0xFF);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x46DD794Eu);  // incrementing
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x113FDB5Cu);  // decrementing
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);              // the usual check value
  // Continuing over a split gives the CRC of the whole.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
}

TEST(Crc32cTest, MaskRotatesAndAddsTensorFlowsConstant) {
  EXPECT_EQ(mask_crc32c(0), 0xA282EAD8u);
  EXPECT_EQ(mask_crc32c(0x8000u), 0x00000001u + 0xA282EAD8u);  // bit 15 rotates to bit 0
}

uint64_t read_le(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  return value;
}

TEST(TfRecordTest, FramesPayloadWithLengthAndMaskedCrcs) {
  const std::string payload = "hello, tensorboard";
  const std::string record = tfrecord(payload);
  ASSERT_EQ(record.size(), 8 + 4 + payload.size() + 4);
  EXPECT_EQ(read_le(record, 0, 8), payload.size());
  EXPECT_EQ(read_le(record, 8, 4), mask_crc32c(crc32c(record.data(), 8)));
  EXPECT_EQ(record.substr(12, payload.size()), payload);
  EXPECT_EQ(read_le(record, 12 + payload.size(), 4),
            mask_crc32c(crc32c(payload.data(), payload.size())));
}

// The interpreter with Debian's modules: /usr/bin/python3 first (a pyenv or venv python3 on PATH
// may lack them).
std::string python() {
  return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

// Runs a shell command; its stdout+stderr appended to `output`, its exit code returned (-1 when it
// could not run or did not exit).
int run_command(const std::string& command, std::string& output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs the independent reader; the events as JSON, or GTEST_SKIP-worthy status 77.
int read_events(const std::string& path, std::vector<nlohmann::json>& events, std::string& output) {
  const int code = run_command(
      python() + " " + SPRITETORCH_TEST_DIR "/report/read_tfevents.py '" + path + "'", output);
  if (code != 0) return code;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) events.push_back(nlohmann::json::parse(line));
  return 0;
}

TEST(TensorBoardTest, IndependentReaderDecodesScalarsAndImages) {
  testing::ScratchDir dir;
  const std::string log_dir = dir.file("logs/run1");  // created with its parents
  std::string path;
  // A 2x3 RGB image with distinct pixels.
  const auto image = torch::arange(18, torch::kUInt8).mul(13).reshape({2, 3, 3});
  {
    EventWriter writer(log_dir);
    path = writer.path();
    writer.add_scalar("train/loss", 0.75, 1);
    writer.add_scalar("train/loss", 0.5, 2);
    writer.add_scalar("big/step", -3.25, int64_t{1} << 40);
    writer.add_image("samples", image, 7);
    // The observer: running loss and lr at the global step, epoch scalars at the epoch.
    TensorBoardObserver observer(writer);
    observer.on_log({/*epoch=*/2, /*step=*/5, /*steps=*/10, /*running_loss=*/0.25, /*lr=*/0.002,
                     /*global_step=*/15});
    train::EpochReport epoch;
    epoch.epoch = 2, epoch.loss = 0.125, epoch.accuracy = 0.875, epoch.images_per_second = 1000;
    observer.on_epoch(epoch);  // flushes: the file is complete before the writer closes
    std::vector<nlohmann::json> live;
    std::string live_output;
    const int live_code = read_events(path, live, live_output);
    if (live_code == 77) GTEST_SKIP() << live_output;
    ASSERT_EQ(live_code, 0) << live_output;
    EXPECT_EQ(live.size(), 10u);
  }
  const std::string name = std::filesystem::path(path).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\..+\.\d+\.\d+)")))
      << name;

  std::vector<nlohmann::json> events;
  std::string output;
  ASSERT_EQ(read_events(path, events, output), 0) << output;
  ASSERT_EQ(events.size(), 10u) << output;
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_GT(events[0]["wall_time"].get<double>(), 1.6e9);

  auto value_of = [&](size_t i) { return events[i]["values"][0]; };
  EXPECT_EQ(value_of(1)["tag"], "train/loss");
  EXPECT_EQ(events[1]["step"], 1);
  EXPECT_FLOAT_EQ(value_of(1)["simple_value"].get<float>(), 0.75f);
  EXPECT_EQ(events[2]["step"], 2);
  EXPECT_FLOAT_EQ(value_of(2)["simple_value"].get<float>(), 0.5f);
  EXPECT_EQ(events[3]["step"].get<int64_t>(), int64_t{1} << 40);
  EXPECT_FLOAT_EQ(value_of(3)["simple_value"].get<float>(), -3.25f);

  const auto& image_value = value_of(4);
  EXPECT_EQ(image_value["tag"], "samples");
  EXPECT_EQ(events[4]["step"], 7);
  EXPECT_EQ(image_value["image"]["height"], 2);
  EXPECT_EQ(image_value["image"]["width"], 3);
  EXPECT_EQ(image_value["image"]["colorspace"], 3);
  const auto& png = image_value["image"]["png"];
  EXPECT_EQ(png["width"], 3);
  EXPECT_EQ(png["height"], 2);
  EXPECT_EQ(png["channels"], 3);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(png["rows"][y][x * 3 + c].get<int>(), image[y][x][c].item<int>())
            << y << "," << x;

  EXPECT_EQ(value_of(5)["tag"], "train/loss_running");
  EXPECT_EQ(events[5]["step"], 15);  // the log's global step
  EXPECT_FLOAT_EQ(value_of(5)["simple_value"].get<float>(), 0.25f);
  EXPECT_EQ(value_of(6)["tag"], "train/lr");
  EXPECT_EQ(events[6]["step"], 15);
  EXPECT_FLOAT_EQ(value_of(6)["simple_value"].get<float>(), 0.002f);
  EXPECT_EQ(value_of(7)["tag"], "epoch/loss");
  EXPECT_EQ(events[7]["step"], 2);
  EXPECT_FLOAT_EQ(value_of(7)["simple_value"].get<float>(), 0.125f);
  EXPECT_EQ(value_of(8)["tag"], "epoch/accuracy");
  EXPECT_FLOAT_EQ(value_of(8)["simple_value"].get<float>(), 0.875f);
  EXPECT_EQ(value_of(9)["tag"], "epoch/images_per_second");
}

TEST(TensorBoardTest, EvaluationsWithinEpochsAreTestScalarsAtTheGlobalStep) {
  testing::ScratchDir dir;
  std::string path;
  {
    EventWriter writer(dir.file("logs"));
    path = writer.path();
    TensorBoardObserver observer(writer);
    train::EvalPoint point;
    point.loss = 0.5, point.accuracy = 0.75;
    observer.on_eval(point, {/*epoch=*/2, /*epochs=*/3, /*step=*/4, /*steps=*/10, /*samples=*/40,
                             /*global_step=*/37});
    observer.on_epoch(train::EpochReport{});  // flushes
  }
  std::vector<nlohmann::json> events;
  std::string output;
  const int code = read_events(path, events, output);
  if (code == 77) GTEST_SKIP() << output;
  ASSERT_EQ(code, 0) << output;
  std::map<std::string, std::pair<int64_t, float>> scalars;  // tag -> (step, value)
  for (const auto& e : events)
    for (const auto& v : e.value("values", nlohmann::json::array()))
      scalars[v["tag"]] = {e["step"].get<int64_t>(), v["simple_value"].get<float>()};
  ASSERT_TRUE(scalars.count("eval/test_loss")) << output;
  // The run's global step, as the loss's: epoch 1 may have had 33 steps (a resume with another
  // --batch-size), so not (epoch 2 - 1) * 10 steps + step 4.
  EXPECT_EQ(scalars["eval/test_loss"].first, 37);
  EXPECT_FLOAT_EQ(scalars["eval/test_loss"].second, 0.5f);
  ASSERT_TRUE(scalars.count("eval/test_accuracy")) << output;
  EXPECT_FLOAT_EQ(scalars["eval/test_accuracy"].second, 0.75f);
}

// A generator's run: no accuracy scalar (it has none), and each sample sheet as an image at its
// epoch, laid out as the run folder's samples/epoch-NNN.png (one row per class, enlarged).
TEST(TensorBoardTest, GeneratorEpochsHaveNoAccuracyAndSampleSheetsBecomeImages) {
  testing::ScratchDir dir;
  // 6 distinct 8x8 sprites, 3 per class: a 2 x 3 grid enlarged 8x (64 / 8).
  const auto sprites = torch::arange(6 * 4 * 8 * 8, torch::kInt64)
                           .remainder(251)
                           .to(torch::kUInt8)
                           .reshape({6, 4, 8, 8});
  std::string path;
  {
    EventWriter writer(dir.file("gen"));
    path = writer.path();
    TensorBoardObserver observer(writer);
    train::EpochReport epoch;
    epoch.epoch = 3, epoch.loss = 0.5, epoch.has_accuracy = false, epoch.images_per_second = 10;
    observer.on_epoch(epoch);
    observer.on_samples(3, sprites, /*per_class=*/3);
  }
  std::vector<nlohmann::json> events;
  std::string output;
  const int code = read_events(path, events, output);
  if (code == 77) GTEST_SKIP() << output;
  ASSERT_EQ(code, 0) << output;
  std::vector<std::string> tags;
  for (size_t i = 1; i < events.size(); ++i) tags.push_back(events[i]["values"][0]["tag"]);
  EXPECT_EQ(tags, (std::vector<std::string>{"epoch/loss", "epoch/images_per_second",
                                            "samples/generated"}));
  const auto& sheet_event = events.back();
  EXPECT_EQ(sheet_event["step"], 3);
  const auto& png = sheet_event["values"][0]["image"]["png"];
  const torch::Tensor expected = io::make_sheet(sprites, {3, 1, 8});  // (H, W, 4)
  ASSERT_EQ(png["height"], expected.size(0));
  ASSERT_EQ(png["width"], expected.size(1));
  ASSERT_EQ(png["channels"], 4);
  EXPECT_EQ(expected.size(0), (2 * 9 + 1) * 8);  // two rows of 8-pixel sprites, 1-pixel padding
  EXPECT_EQ(expected.size(1), (3 * 9 + 1) * 8);
  const auto flat = expected.reshape({expected.size(0), -1}).contiguous();
  const auto pixels = flat.accessor<uint8_t, 2>();
  int64_t mismatches = 0;
  for (int64_t y = 0; y < flat.size(0); ++y)
    for (int64_t x = 0; x < flat.size(1); ++x)
      mismatches += png["rows"][y][x].get<int>() != pixels[y][x];
  EXPECT_EQ(mismatches, 0);
}

TEST(TensorBoardTest, ReaderRejectsACorruptedRecord) {
  testing::ScratchDir dir;
  std::string path;
  {
    EventWriter writer(dir.file("logs"));
    path = writer.path();
    writer.add_scalar("x", 1.0, 1);
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 6] ^= 0x01;  // a payload byte of the last record
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  std::vector<nlohmann::json> events;
  std::string output;
  const int code = read_events(path, events, output);
  if (code == 77) GTEST_SKIP() << output;
  EXPECT_EQ(code, 1) << output;  // the reader checks the CRCs: it is a real second opinion
  EXPECT_NE(output.find("CRC mismatch"), std::string::npos) << output;
}

// The strongest check: TensorBoard's own reader (EventAccumulator, what `tensorboard --logdir`
// uses). Debian packages no tensorboard, so this skips here and in CI; it runs where tensorboard
// is installed, e.g. the GPU machine's pip environment (issue 9).
TEST(TensorBoardTest, TensorBoardItselfReadsOurEvents) {
  testing::ScratchDir dir;
  const std::string log_dir = dir.file("tb");
  {
    EventWriter writer(log_dir);
    writer.add_scalar("train/loss", 0.75, 1);
    writer.add_scalar("train/loss", 0.5, 2);
    writer.add_image("samples", torch::arange(18, torch::kUInt8).reshape({2, 3, 3}), 7);
  }
  std::string output;
  int code = 77;
  for (const std::string interpreter : {"python3", "/usr/bin/python3"}) {
    output.clear();
    code = run_command(
        interpreter + " " SPRITETORCH_TEST_DIR "/report/read_with_tensorboard.py '" + log_dir + "'",
        output);
    if (code != 77) break;
  }
  if (code == 77) GTEST_SKIP() << output;
  ASSERT_EQ(code, 0) << output;
  std::vector<nlohmann::json> events;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') events.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(events.size(), 3u) << output;
  EXPECT_EQ(events[0]["tag"], "train/loss");
  EXPECT_EQ(events[0]["step"], 1);
  EXPECT_FLOAT_EQ(events[0]["value"].get<float>(), 0.75f);
  EXPECT_EQ(events[1]["step"], 2);
  EXPECT_FLOAT_EQ(events[1]["value"].get<float>(), 0.5f);
  EXPECT_EQ(events[2]["tag"], "samples");
  EXPECT_EQ(events[2]["step"], 7);
  EXPECT_EQ(events[2]["width"], 3);
  EXPECT_EQ(events[2]["height"], 2);
  EXPECT_GT(events[2]["png_bytes"].get<int>(), 8);
}

// Files of this process may grow to `bytes` only (a full disk, without root or a mount): a write
// past it fails with EFBIG instead of raising SIGXFSZ.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_signal_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = old_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_signal_);
  }

 private:
  rlimit old_{};
  void (*old_signal_)(int);
};

// A write that fails during training is one note naming the file and the reason; the events stop
// there, the file keeps whole records only, and nothing is thrown into the training loop.
TEST(TensorBoardTest, AFailedWriteIsOneNoteAndTheFileKeepsWholeRecords) {
  testing::ScratchDir dir;
  std::vector<std::string> notes;
  std::string path;
  std::uintmax_t whole = 0;
  {
    EventWriter writer(dir.file("logs"));
    path = writer.path();
    TensorBoardObserver observer(writer, nullptr,
                                 [&](const std::string& line) { notes.push_back(line); });
    train::EpochReport epoch;
    epoch.epoch = 1, epoch.loss = 0.5, epoch.has_accuracy = false, epoch.images_per_second = 10;
    observer.on_epoch(epoch);
    whole = std::filesystem::file_size(path);
    const auto sprites = torch::zeros({4, 4, 8, 8}, torch::kUInt8);
    {
      FileSizeLimit limit(whole + 20);  // room for part of the next record only
      observer.on_samples(1, sprites, 2);
      epoch.epoch = 2;
      observer.on_epoch(epoch);
      observer.write([](EventWriter& w) { w.add_scalar("test/loss", 0.25, 2); });
    }
    EXPECT_TRUE(observer.failed());
    EXPECT_EQ(std::filesystem::file_size(path), whole);  // no half record
  }
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("cannot write the TensorBoard event file " + path + ": File too large"),
            std::string::npos)
      << notes[0];
  EXPECT_EQ(std::filesystem::file_size(path), whole);  // nothing more at the end either
  std::vector<nlohmann::json> events;
  std::string output;
  const int code = read_events(path, events, output);
  if (code == 77) GTEST_SKIP() << output;
  ASSERT_EQ(code, 0) << output;  // every record whole, every CRC right
  EXPECT_EQ(events.size(), 3u);  // the version, epoch 1's loss and images/s
}

// A file whose first record cannot be written is no event file: removed, and the error says why.
TEST(TensorBoardTest, AFileThatCannotBeStartedIsRemoved) {
  testing::ScratchDir dir;
  std::filesystem::create_directories(dir.file("logs"));
  try {
    FileSizeLimit limit(10);
    EventWriter writer(dir.file("logs"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("logs")));
}

TEST(TensorBoardTest, UnwritableFolderIsAClearError) {
  testing::ScratchDir dir;
  std::ofstream(dir.file("file")) << "x";
  try {
    EventWriter writer(dir.file("file") + "/logs");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TensorBoard folder"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spritetorch::report
