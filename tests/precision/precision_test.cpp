#include "precision/precision.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace spritetorch::precision {
namespace {

// bf16_auto: whether the CPU's native bf16 is one auto takes (AMD's) or not (Intel's).
device::DeviceInfo cpu_info(bool bf16, bool bf16_auto = true) {
  device::DeviceInfo info;
  info.device = torch::kCPU;
  info.bf16 = bf16;
  info.bf16_auto = bf16 && bf16_auto;
  return info;
}

device::DeviceInfo cuda_info(bool bf16) {
  device::DeviceInfo info;
  info.device = torch::Device(torch::kCUDA, 0);
  info.bf16 = bf16;
  info.bf16_auto = bf16;
  info.fp16 = true;
  return info;
}

TEST(Precision, ParsesTheFourNamesAndRejectsOthers) {
  for (const auto& name : precision_names()) EXPECT_EQ(to_string(parse_precision(name)), name);
  EXPECT_THROW(parse_precision("fp8"), Error);
  EXPECT_THROW(parse_precision("BF16"), Error);
}

TEST(Precision, Fp32NeverAutocastsOrScales) {
  const auto plan = resolve_precision(Precision::kFp32, cpu_info(true));
  EXPECT_EQ(plan.precision, Precision::kFp32);
  EXPECT_FALSE(plan.autocast);
  EXPECT_FALSE(plan.grad_scaling);
}

TEST(Precision, Bf16OnCpuAutocastsWithoutScaling) {
  const auto plan = resolve_precision(Precision::kBf16, cpu_info(true));
  EXPECT_TRUE(plan.autocast);
  EXPECT_EQ(plan.compute_dtype, torch::kBFloat16);
  EXPECT_EQ(plan.device_type, c10::DeviceType::CPU);
  EXPECT_FALSE(plan.grad_scaling);
}

TEST(Precision, Fp16OnCpuIsRefusedWithAHintTowardsBf16) {
  try {
    resolve_precision(Precision::kFp16, cpu_info(true));
    FAIL() << "fp16 on the CPU must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos);
    EXPECT_NE(e.hint().find("bf16"), std::string::npos);
  }
}

TEST(Precision, Fp16OnCudaScalesTheLoss) {
  const auto plan = resolve_precision(Precision::kFp16, cuda_info(true));
  EXPECT_TRUE(plan.autocast);
  EXPECT_EQ(plan.compute_dtype, torch::kFloat16);
  EXPECT_EQ(plan.device_type, c10::DeviceType::CUDA);
  EXPECT_TRUE(plan.grad_scaling);
}

TEST(Precision, AutoFollowsTheDevicesBf16Support) {
  EXPECT_EQ(resolve_precision(Precision::kAuto, cpu_info(true)).precision, Precision::kBf16);
  EXPECT_EQ(resolve_precision(Precision::kAuto, cpu_info(false)).precision, Precision::kFp32);
  EXPECT_EQ(resolve_precision(Precision::kAuto, cuda_info(true)).precision, Precision::kBf16);
  EXPECT_EQ(resolve_precision(Precision::kAuto, cuda_info(false)).precision, Precision::kFp32);
  // Native bf16 that was measured slower than fp32 (an Intel Xeon's): auto keeps fp32, says why,
  // and an explicit bf16 is still taken without the "no native bf16" warning.
  const auto intel = resolve_precision(Precision::kAuto, cpu_info(true, false));
  EXPECT_EQ(intel.precision, Precision::kFp32);
  EXPECT_NE(intel.description.find("trains slower than fp32"), std::string::npos)
      << intel.description;
  const auto asked = resolve_precision(Precision::kBf16, cpu_info(true, false));
  EXPECT_EQ(asked.precision, Precision::kBf16);
  EXPECT_EQ(asked.description.find("no native bf16"), std::string::npos) << asked.description;
}

TEST(Precision, MixedPrecisionOnMpsIsRefusedAndAutoFallsBackToFp32) {
  device::DeviceInfo mps;
  mps.device = torch::Device(torch::kMPS);
  mps.fp16 = true;
  EXPECT_THROW(resolve_precision(Precision::kBf16, mps), Error);
  EXPECT_THROW(resolve_precision(Precision::kFp16, mps), Error);
  EXPECT_EQ(resolve_precision(Precision::kAuto, mps).precision, Precision::kFp32);
}

}  // namespace
}  // namespace spritetorch::precision
