// How numbers are stored and computed during training: fp32, or mixed precision with bf16 / fp16
// autocast. The user's choice is resolved once against the device (resolve_precision) into a plan
// that the trainer follows; the plan says whether autocast runs and whether losses are scaled.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/choice.h"

#include "device/device.h"

namespace spritetorch::precision {

enum class Precision { kFp32, kBf16, kFp16, kAuto };
const Choices<Precision>& choices_of(Precision);  // fp32, bf16, fp16, auto

// "fp32" | "bf16" | "fp16" | "auto"; throws spritetorch::Error listing them otherwise.
Precision parse_precision(const std::string& text);
std::string to_string(Precision precision);
const std::vector<std::string>& precision_names();

struct PrecisionPlan {
  Precision precision = Precision::kFp32;  // never kAuto
  bool autocast = false;                   // run the forward under AutocastGuard
  c10::DeviceType device_type = c10::DeviceType::CPU;
  torch::ScalarType compute_dtype = torch::kFloat32;  // autocast's lower-precision dtype
  bool grad_scaling = false;  // dynamic loss scaling (fp16 only: bf16 has fp32's range)
  std::string description;    // one line for the settings table
};

// Rules (docs/precision.md):
//  - fp32 everywhere.
//  - bf16 on CPU and CUDA; weights, gradients and optimizer state stay fp32 (autocast only casts
//    the matrix work). Refused on MPS (this build wires autocast for CPU and CUDA only).
//  - fp16 on CUDA, with dynamic loss scaling. Refused on CPU with a hint to use bf16: LibTorch's
//    CPU fp16 kernels are sparse and slow, and a silent switch would make results depend on the
//    machine. Refused on MPS like bf16.
//  - auto: bf16 where `info.bf16_auto` says the device's native bf16 was measured faster than
//    fp32 (CUDA compute capability >= 8, AMD CPUs with avx512_bf16), else fp32 (Intel's bf16
//    CPUs, whose bf16 autocast trained 0.79-0.89x as fast as fp32: device/device.cpp).
PrecisionPlan resolve_precision(Precision requested, const device::DeviceInfo& info);

}  // namespace spritetorch::precision
