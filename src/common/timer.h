// Wall-clock timing that means what it says on an asynchronous device: the clock is read only
// after the device has finished the work queued so far.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <string>

namespace spritetorch {

// Blocks until every kernel queued on `device` has finished (a no-op on the CPU).
void synchronize(const torch::Device& device);

// The steady clock in seconds since its (arbitrary) epoch: the default clock of what takes one to
// be testable (the progress printer, the thread governor) and the CPU-load readings' wall time.
double steady_seconds();

// "1:05", "1:02:03" (rounded to the second); "?" for a negative or non-finite duration. With
// keep_tenths a duration that is not a whole number of seconds keeps its tenths: "0:12.5".
std::string format_duration(double seconds, bool keep_tenths = false);

class DeviceTimer {
 public:
  explicit DeviceTimer(torch::Device device) : device_(device) { restart(); }
  void restart() {
    synchronize(device_);
    start_ = std::chrono::steady_clock::now();
  }
  // Seconds since construction or the last restart(), after synchronising the device.
  double seconds() const {
    synchronize(device_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  torch::Device device_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace spritetorch
