#include "precision/precision.h"

#include "common/compat.h"
#include "common/error.h"

namespace spritetorch::precision {

const Choices<Precision>& choices_of(Precision) {
  static const Choices<Precision> c{{{Precision::kFp32, "fp32"},
                                     {Precision::kBf16, "bf16"},
                                     {Precision::kFp16, "fp16"},
                                     {Precision::kAuto, "auto"}}};
  return c;
}

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> kNames = choices_of(Precision{}).names();
  return kNames;
}

Precision parse_precision(const std::string& text) {
  return choices_of(Precision{}).parse(text, "precision");
}

std::string to_string(Precision precision) { return choices_of(Precision{}).name(precision); }

PrecisionPlan resolve_precision(Precision requested, const device::DeviceInfo& info) {
  const torch::Device& device = info.device;
  PrecisionPlan plan;
  plan.device_type = device.type();
  if (requested == Precision::kAuto) {
    const bool bf16 = info.bf16_auto && compat::autocast_supported(device.type());
    plan = resolve_precision(bf16 ? Precision::kBf16 : Precision::kFp32, info);
    plan.description +=
        bf16        ? " (auto: native bf16 on this device)"
        : info.bf16 ? " (auto: this CPU's native bf16 trains slower than fp32 on Intel Xeons; "
                      "--precision bf16 to try it)"
                    : " (auto: no native bf16 here)";
    return plan;
  }
  if (requested == Precision::kFp32) {
    plan.description = "fp32";
    return plan;
  }
  const std::string name = to_string(requested);
  if (!compat::autocast_supported(device.type()))
    throw Error("--precision " + name + " is not supported on " + device.str() +
                    ": mixed precision is wired up for CPU and CUDA only",
                "use --precision fp32 on this device");
  if (requested == Precision::kFp16 && device.is_cpu())
    throw Error(
        "--precision fp16 is not supported on the CPU: LibTorch's CPU fp16 kernels are "
        "too sparse and slow to train with",
        "use --precision bf16 (same memory savings, fp32's exponent range, no loss scaling)");
  plan.precision = requested;
  plan.autocast = true;
  plan.compute_dtype = requested == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat16;
  plan.grad_scaling = requested == Precision::kFp16;
  plan.description = name + " autocast, fp32 weights" +
                     std::string(plan.grad_scaling ? ", dynamic loss scaling" : "");
  if (requested == Precision::kBf16 && !info.bf16)
    plan.description += " (no native bf16 on this device: expect it to be slower than fp32)";
  return plan;
}

}  // namespace spritetorch::precision
