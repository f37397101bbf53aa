#include "device/device.h"

#include <fstream>
#include <regex>
#include <sstream>

#include "common/compat.h"
#include "common/error.h"
#include "common/small_gemm.h"

#include <sys/resource.h>

#if SPRITETORCH_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace spritetorch::device {

namespace {

const char* kAcceptedForms = "auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps";

std::string available_list(const Availability& a) {
  std::string out = "cpu";
  for (int i = 0; i < a.cuda_devices; ++i) out += ", cuda:" + std::to_string(i);
  if (a.mps) out += ", mps";
  return out;
}

// The value of /proc/cpuinfo's first line that starts with `key` (its first CPU's), without the
// spaces after the colon; empty when there is no such line (not Linux, or not x86).
std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (line.rfind(key, 0) != 0 || colon == std::string::npos) continue;
    const auto value = line.find_first_not_of(' ', colon + 1);
    return value == std::string::npos ? std::string() : line.substr(value);
  }
  return "";
}

std::string read_cpu_model_name() {
  const std::string name = cpuinfo_field("model name");
  return name.empty() ? "CPU" : name;
}

bool cpu_has_flag(const std::string& flag) {
  std::istringstream words(cpuinfo_field("flags"));
  std::string word;
  while (words >> word)
    if (word == flag) return true;
  return false;
}

int64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == key + ":") return kib * 1024;
  return -1;
}

}  // namespace

DeviceSpec parse_device_spec(const std::string& text) {
  static const std::regex kCudaIndexed("cuda:([0-9]{1,3})");
  std::smatch match;
  if (text == "auto") return {DeviceKind::kAuto, -1};
  if (text == "cpu") return {DeviceKind::kCpu, -1};
  if (text == "mps") return {DeviceKind::kMps, -1};
  if (text == "cuda") return {DeviceKind::kCuda, -1};
  if (std::regex_match(text, match, kCudaIndexed))
    return {DeviceKind::kCuda, std::stoi(match[1].str())};
  throw Error("unknown device '" + text + "': expected " + kAcceptedForms,
              "run `spritetorch devices` to see what this machine has");
}

std::string to_string(const DeviceSpec& spec) {
  switch (spec.kind) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kMps:
      return "mps";
    case DeviceKind::kCuda:
      return spec.index < 0 ? "cuda" : "cuda:" + std::to_string(spec.index);
  }
  return "?";
}

Availability probe_availability() {
  Availability a;
  a.cuda_built = SPRITETORCH_WITH_CUDA != 0;
  a.cuda_devices = a.cuda_built && torch::cuda::is_available() ? compat::cuda_device_count() : 0;
  a.mps = compat::mps_available();
  return a;
}

torch::Device resolve_device(const DeviceSpec& spec, const Availability& a) {
  switch (spec.kind) {
    case DeviceKind::kAuto:
      if (a.cuda_devices > 0) return torch::Device(torch::kCUDA, 0);
      if (a.mps) return torch::Device(torch::kMPS);
      return torch::Device(torch::kCPU);
    case DeviceKind::kCpu:
      return torch::Device(torch::kCPU);
    case DeviceKind::kMps:
      if (!a.mps)
        throw Error(
            "device 'mps' requested, but MPS (Apple Metal) is not available here; available: " +
                available_list(a),
            "MPS needs macOS on Apple silicon with an MPS-enabled LibTorch; use --device auto");
      return torch::Device(torch::kMPS);
    case DeviceKind::kCuda: {
      const std::string asked = to_string(spec);
      if (!a.cuda_built)
        throw Error("device '" + asked +
                        "' requested, but this spritetorch was built against a "
                        "LibTorch without CUDA (" +
                        compat::torch_version() + "); available: " + available_list(a),
                    "use --device cpu (or auto), or rebuild against a CUDA LibTorch "
                    "(scripts/gpu-build)");
      if (a.cuda_devices == 0)
        throw Error("device '" + asked + "' requested, but no CUDA device is visible; available: " +
                        available_list(a),
                    "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu");
      const int index = spec.index < 0 ? 0 : spec.index;
      if (index >= a.cuda_devices)
        throw Error("device '" + asked + "' requested, but only " + std::to_string(a.cuda_devices) +
                        " CUDA device(s) are visible; available: " + available_list(a),
                    "CUDA devices are numbered from 0");
      return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
    }
  }
  throw Error("unreachable device kind");
}

torch::Device pick_device(const std::string& text) {
  return resolve_device(parse_device_spec(text), probe_availability());
}

DeviceInfo describe_device(const torch::Device& device) {
  DeviceInfo info;
  info.device = device;
  if (device.is_cpu()) {
    info.name = read_cpu_model_name();
    info.total_memory = meminfo_bytes("MemTotal");
    info.free_memory = meminfo_bytes("MemAvailable");
    // bf16 autocast runs on any x86 CPU but is only worth it with native bf16 instructions.
    info.bf16 = cpu_has_flag("avx512_bf16") || cpu_has_flag("amx_bf16");
    // Native is not enough for auto: bf16 autocast pays on AMD's AVX512-BF16 (Zen 5: the cnn
    // 1.27x, sampling 1.9-2.0x on a Zen 4) but not on an Intel Xeon's (family 6 model 207, AMX
    // not enabled: --recipe fast 0.79x, the cnn 0.89x, sampling 0.73-0.82x), whose vdpbf16ps
    // does no more work a cycle than fp32 FMAs there (docs/precision.md). Intel with AMX tiles is
    // unmeasured, so auto keeps fp32 there too.
    info.bf16_auto = info.bf16 && cpuinfo_field("vendor_id") == "AuthenticAMD";
    info.fp16 = false;  // LibTorch's CPU fp16 kernels are too sparse to train with
    return info;
  }
#if SPRITETORCH_WITH_CUDA
  if (device.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device.index());
    info.name = props->name;
    info.total_memory = static_cast<int64_t>(props->totalGlobalMem);
    c10::cuda::CUDAGuard guard(device);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
      info.free_memory = static_cast<int64_t>(free_bytes);
    info.compute_capability = std::to_string(props->major) + "." + std::to_string(props->minor);
    info.bf16 = props->major >= 8;
    info.bf16_auto = info.bf16;
    info.fp16 = true;
    return info;
  }
#endif
  if (device.is_mps()) {
    info.name = "Apple MPS";
    info.bf16 = false;
    info.fp16 = true;
    return info;
  }
  info.name = device.str();
  return info;
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out{describe_device(torch::Device(torch::kCPU))};
  const Availability a = probe_availability();
  for (int i = 0; i < a.cuda_devices; ++i)
    out.push_back(describe_device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i))));
  if (a.mps) out.push_back(describe_device(torch::Device(torch::kMPS)));
  return out;
}

bool channels_last_pays(const torch::Device& device) {
  return device.is_cuda() || (device.is_cpu() && (gemm::available(gemm::Kernel::avx512) ||
                                                  gemm::available(gemm::Kernel::avx2)));
}

PeakMemory peak_memory(const torch::Device& device) {
  PeakMemory peak;
  if (device.is_cpu()) {
    rusage usage{};
    if (getrusage(RUSAGE_SELF, &usage) == 0)
      peak.bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
    peak.what = "peak RSS of the process";
    return peak;
  }
#if SPRITETORCH_WITH_CUDA
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : 0;
    // allocated_bytes[0]: StatType::AGGREGATE, whose namespace moved between LibTorch 1.13 and 2.x.
    peak.bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[0].peak;
    peak.what = "max allocated on cuda:" + std::to_string(index);
    return peak;
  }
#endif
  peak.what = "not measured on " + device.str();
  return peak;
}

void reset_peak_memory(const torch::Device& device) {
#if SPRITETORCH_WITH_CUDA
  if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#else
  (void)device;
#endif
}

std::string display_name(const torch::Device& device) {
  return device.str() + " (" + describe_device(device).name + ")";
}

void expect_on_device(const torch::Tensor& tensor, const torch::Device& expected,
                      const std::string& what, const std::string& owner) {
  if (tensor.device() == expected) return;
  throw Error(what + " is on " + tensor.device().str() + " but " + owner + " is on " +
                  expected.str() + ": every tensor of one operation must be on one device",
              "move it with .to(" + expected.str() + ") before the call");
}

}  // namespace spritetorch::device
