// Wall-clock timing that means what it says on an asynchronous device: the clock is read only
// after the device has finished the work queued so far.
#pragma once

#include <torch/torch.h>

#include <chrono>

namespace spritetorch {

// Blocks until every kernel queued on `device` has finished (a no-op on the CPU).
void synchronize(const torch::Device& device);

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
