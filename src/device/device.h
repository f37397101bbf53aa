// Where work runs. Parses the user's device string, finds what the machine has, picks the best
// device the way the seeds teach (CUDA, else MPS, else CPU) and checks that tensors meeting in one
// operation live on one device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace spritetorch::device {

enum class DeviceKind { kAuto, kCpu, kCuda, kMps };

// What the user asked for: "auto", "cpu", "cuda", "cuda:N" or "mps". index -1 = not given.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kAuto;
  int index = -1;
};

// Throws spritetorch::Error (exit 2) for anything else, listing the accepted forms.
DeviceSpec parse_device_spec(const std::string& text);
std::string to_string(const DeviceSpec& spec);

// What this process can use. Injectable so that the CUDA and MPS branches of the policy can be
// tested on a CPU-only machine.
struct Availability {
  bool cuda_built = false;  // this LibTorch was compiled with CUDA
  int cuda_devices = 0;     // visible CUDA devices (0 when not built or no driver)
  bool mps = false;
};
Availability probe_availability();

// Applies the policy: auto = cuda:0 if any CUDA device, else mps, else cpu. A request that cannot
// be met throws spritetorch::Error naming what is available.
torch::Device resolve_device(const DeviceSpec& spec, const Availability& available);
// resolve_device(parse_device_spec(text), probe_availability()).
torch::Device pick_device(const std::string& text);

// One row of `spritetorch devices`.
struct DeviceInfo {
  torch::Device device = torch::kCPU;
  std::string name;
  int64_t total_memory = -1;       // bytes; -1 = unknown
  int64_t free_memory = -1;        // bytes; -1 = unknown
  std::string compute_capability;  // "9.0" on CUDA, empty elsewhere
  bool bf16 = false;               // bf16 arithmetic is supported (natively or emulated fast)
  // --precision auto's choice: bf16 where it is native and was measured faster than fp32 on this
  // kind of device (describe_device says which); bf16_auto implies bf16.
  bool bf16_auto = false;
  bool fp16 = false;
};
std::vector<DeviceInfo> list_devices();
DeviceInfo describe_device(const torch::Device& device);

// Whether conv nets on `device` should run channels_last: on CUDA (cuDNN's tensor cores want NHWC)
// and on a CPU with AVX-512 or AVX2 + FMA, where oneDNN's NHWC convolutions made the sprite CNNs
// 1.4-1.5x faster on a Zen 4 and 1.2x on an AVX2-only Zen 3, and with the fused norm's NHWC form
// (models/bn_relu_pool.h) fastcnn 1.2-1.25x on both; the 1-channel Fashion-MNIST CNN is the same
// within 4% (docs/precision.md). MPS and CPUs without AVX2 keep NCHW.
bool channels_last_pays(const torch::Device& device);

// The most memory a run has held on `device`: on CUDA the caching allocator's peak of bytes
// allocated to tensors since reset_peak_memory (what torch.cuda.max_memory_allocated reports; the
// cache it keeps on top is not counted), on the CPU the process's peak resident set since it
// started (getrusage; LibTorch, the data and freed blocks kept for reuse included). bytes = -1
// where unknown (MPS). `what` names which of the two it is, for the report.
struct PeakMemory {
  int64_t bytes = -1;
  std::string what;  // "max allocated on cuda:0", "peak RSS of the process"
};
PeakMemory peak_memory(const torch::Device& device);
// CUDA: the next peak_memory starts from what is allocated now. Elsewhere nothing: RSS has no
// reset.
void reset_peak_memory(const torch::Device& device);

// "cuda:0 (NVIDIA H100 80GB HBM3)", "cpu (AMD EPYC 7B13)".
std::string display_name(const torch::Device& device);

// Throws spritetorch::Error, naming both devices, when `tensor` is not on `expected`. Called where
// the library's own tensors meet the caller's (model vs batch) so a mismatch never reaches
// LibTorch's internal error.
void expect_on_device(const torch::Tensor& tensor, const torch::Device& expected,
                      const std::string& what, const std::string& owner);

}  // namespace spritetorch::device
