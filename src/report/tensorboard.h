// TensorBoard event files, written the way PyTorch's SummaryWriter writes them, so that
// `tensorboard --logdir DIR` shows scalars and images. No TensorFlow or protobuf library: the file
// is TFRecord framing around tensorflow.Event messages whose few fields we encode by hand (field
// numbers from tensorboard/compat/proto/event.proto and summary.proto):
//
//   record  = uint64 LE length | uint32 LE masked CRC-32C(length) | payload | masked
//   CRC-32C(payload) Event   = wall_time (1, double) | step (2, int64) | file_version (3, string) |
//   summary (5) Summary = repeated Value (1);  Value = tag (1) | simple_value (2, float) | image
//   (4) Image   = height (1) | width (2) | colorspace (3) | encoded_image_string (4, PNG)
//
// This is the writer only; tests/report/read_tfevents.py reads the files back with protobuf.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>

#include "train/trainer.h"

namespace spritetorch::report {

// One TFRecord: the framing around `payload`.
std::string tfrecord(const std::string& payload);

// Appends events to a new file events.out.tfevents.<unix secs>.<hostname>.<pid>.<n> in `dir`
// (created with its parents). The first record is the file_version event "brain.Event:2".
// Events are buffered; flush() makes them visible to a running TensorBoard. A write that fails
// is cut back to the last whole record, so the file never ends in half a record; a file whose
// first record cannot be written is removed.
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);
  ~EventWriter();  // flushes; errors at that point are swallowed (call flush() to see them)
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // image: (H, W, C) uint8, C = 1 (grey), 3 (RGB) or 4 (RGBA), any device; stored as PNG.
  void add_image(const std::string& tag, const torch::Tensor& image, int64_t step);
  // Throws Error naming the file and the reason when it cannot be written (disk full, ...); the
  // events that were not written are dropped.
  void flush();

  const std::string& path() const { return path_; }

  // For a run refused before it started: the file removed, and its folder where this writer made
  // it and nothing else is in it (TensorBoard would list either as a run). Nothing is written
  // after.
  void discard();

 private:
  void write_event(int64_t step, const std::string& summary_or_version_field);

  std::string path_;
  bool made_folder_ = false;
  int fd_ = -1;
  std::string pending_;  // records not written yet
  int64_t written_ = 0;  // bytes of whole records in the file
};

// Training progress into an EventWriter: the running loss at every log interval and the test
// evaluations within epochs (step = global step: (epoch - 1) * steps per epoch + step), per epoch
// loss, accuracy (classifiers) and throughput (step = epoch), and a generator's sample sheets as
// images "samples/generated" (step = epoch). Everything is also passed on to `next` (the CLI's
// printer), when given. Flushes after every epoch and every sheet so a live TensorBoard follows the
// run. The events are an extra: the first write that fails is passed to `note` (one line) and the
// events stop there, while the training goes on.
class TensorBoardObserver : public train::TrainObserver {
 public:
  using Note = std::function<void(const std::string&)>;
  explicit TensorBoardObserver(EventWriter& writer, train::TrainObserver* next = nullptr,
                               Note note = {})
      : writer_(writer), next_(next), note_(std::move(note)) {}
  void on_start(const std::string& device, const train::Settings& settings) override;
  void on_log(const train::StepLog& log) override;
  void on_epoch(const train::EpochReport& report) override;
  // --eval-every-steps: eval/test_loss, eval/test_accuracy at the global step.
  void on_eval(const train::EvalPoint& point, const train::StepTick& at) override;
  void on_samples(int64_t epoch, const torch::Tensor& sprites, int64_t per_class) override;
  // Runs `events` on the writer and flushes it, unless an earlier write failed; a failure is the
  // one note. For events outside training (the training samples, the final test results).
  void write(const std::function<void(EventWriter&)>& events);
  bool failed() const { return failed_; }
  // on_start came: the run began, and its events are a run's.
  bool started() const { return started_; }

 private:
  EventWriter& writer_;
  train::TrainObserver* next_;
  Note note_;
  bool failed_ = false;
  bool started_ = false;
};

}  // namespace spritetorch::report
