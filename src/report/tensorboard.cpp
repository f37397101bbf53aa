#include "report/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "io/png.h"

namespace spritetorch::report {

namespace {

// Protocol buffer wire format, the handful of pieces an Event needs.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (field << 3) | type);
}

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

// int32 / int64 fields: negative numbers are 10-byte two's-complement varints.
void put_int(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Field numbers of tensorflow.Event, Summary, Summary.Value and Summary.Image.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueImage = 4;
constexpr uint32_t kImageHeight = 1, kImageWidth = 2, kImageColorspace = 3, kImageEncoded = 4;

std::string summary_field(const std::string& value_message) {
  std::string summary;
  put_bytes(summary, kSummaryValue, value_message);
  std::string field;
  put_bytes(field, kEventSummary, summary);
  return field;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

std::string tfrecord(const std::string& payload) {
  std::string length;
  put_little_endian(length, payload.size(), 8);
  std::string record = length;
  put_little_endian(record, mask_crc32c(crc32c(length.data(), length.size())), 4);
  record += payload;
  put_little_endian(record, mask_crc32c(crc32c(payload.data(), payload.size())), 4);
  return record;
}

EventWriter::EventWriter(const std::string& dir) {
  static std::atomic<int> files_opened{0};
  std::error_code error;
  made_folder_ = std::filesystem::create_directories(dir, error);
  if (error) throw Error("cannot create the TensorBoard folder " + dir + ": " + error.message());
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) + "." +
            host_name() + "." + std::to_string(getpid()) + "." + std::to_string(files_opened++)))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error("cannot create the TensorBoard event file " + path_ + ": " + std::strerror(errno));
  std::string version;
  put_bytes(version, kEventFileVersion, "brain.Event:2");
  write_event(0, version);
  try {
    flush();
  } catch (const Error&) {  // a file without its version record is no event file
    ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
    throw;
  }
}

void EventWriter::discard() {
  pending_.clear();
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(path_.c_str());
  std::error_code ignored;
  if (made_folder_) std::filesystem::remove(std::filesystem::path(path_).parent_path(), ignored);
}

EventWriter::~EventWriter() {
  try {
    flush();
  } catch (const Error&) {  // a destructor must not throw; flush() reported nothing new anyway
  }
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::write_event(int64_t step, const std::string& what_field) {
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  if (step != 0) put_int(event, kEventStep, step);  // proto3: 0 is the default, not written
  event += what_field;
  pending_ += tfrecord(event);
}

void EventWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string value_message;
  put_bytes(value_message, kValueTag, tag);
  put_float(value_message, kValueSimpleValue, static_cast<float>(value));
  write_event(step, summary_field(value_message));
}

void EventWriter::add_image(const std::string& tag, const torch::Tensor& image, int64_t step) {
  const std::string png = io::encode_png(image, "TensorBoard image '" + tag + "'");
  std::string image_message;
  put_int(image_message, kImageHeight, image.size(0));
  put_int(image_message, kImageWidth, image.size(1));
  put_int(image_message, kImageColorspace, image.size(2));  // 1 grey, 3 RGB, 4 RGBA: the channels
  put_bytes(image_message, kImageEncoded, png);
  std::string value_message;
  put_bytes(value_message, kValueTag, tag);
  put_bytes(value_message, kValueImage, image_message);
  write_event(step, summary_field(value_message));
}

void EventWriter::flush() {
  if (fd_ < 0 || pending_.empty()) return;
  const std::string bytes = std::move(pending_);
  pending_.clear();
  // Half a record would end the file in garbage: a failed write goes back to the last whole one.
  if (const int error = append_whole(fd_, bytes, written_))
    throw Error("cannot write the TensorBoard event file " + path_ + ": " + std::strerror(error));
  written_ += static_cast<int64_t>(bytes.size());
}

void TensorBoardObserver::write(const std::function<void(EventWriter&)>& events) {
  if (failed_) return;
  try {
    events(writer_);
    writer_.flush();
  } catch (const Error& e) {
    failed_ = true;
    if (note_) note_(std::string(e.what()) + "; no more TensorBoard events for this run");
  }
}

void TensorBoardObserver::on_start(const std::string& device, const train::Settings& settings) {
  started_ = true;
  if (next_) next_->on_start(device, settings);
}

void TensorBoardObserver::on_log(const train::StepLog& log) {
  if (!failed_) {  // buffered: written with the epoch's events
    writer_.add_scalar("train/loss_running", log.running_loss, log.global_step);
    if (log.lr > 0)
      writer_.add_scalar("train/lr", log.lr, log.global_step);  // the schedule's curve
  }
  if (next_) next_->on_log(log);
}

void TensorBoardObserver::on_epoch(const train::EpochReport& report) {
  write([&](EventWriter& w) {
    w.add_scalar("epoch/loss", report.loss, report.epoch);
    if (report.has_accuracy) w.add_scalar("epoch/accuracy", report.accuracy, report.epoch);
    w.add_scalar("epoch/images_per_second", report.images_per_second, report.epoch);
    if (report.has_test) {  // --eval-every: the test set after this epoch
      w.add_scalar("epoch/test_loss", report.test_loss, report.epoch);
      if (report.has_accuracy)
        w.add_scalar("epoch/test_accuracy", report.test_accuracy, report.epoch);
    }
  });
  if (next_) next_->on_epoch(report);
}

void TensorBoardObserver::on_eval(const train::EvalPoint& point, const train::StepTick& at) {
  if (!failed_) {  // buffered: written with the epoch's events; at on_log's step
    writer_.add_scalar("eval/test_loss", point.loss, at.global_step);
    if (point.has_accuracy)
      writer_.add_scalar("eval/test_accuracy", point.accuracy, at.global_step);
  }
  if (next_) next_->on_eval(point, at);
}

void TensorBoardObserver::on_samples(int64_t epoch, const torch::Tensor& sprites,
                                     int64_t per_class) {
  write([&](EventWriter& w) {
    w.add_image("samples/generated", io::make_sample_sheet(sprites, per_class), epoch);
  });
  if (next_) next_->on_samples(epoch, sprites, per_class);
}

}  // namespace spritetorch::report
