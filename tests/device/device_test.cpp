#include "device/device.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/small_gemm.h"
#include "test_util.h"

namespace spritetorch::device {
namespace {

using spritetorch::testing::error_of;

TEST(DeviceSpec, ParsesEveryAcceptedForm) {
  EXPECT_EQ(parse_device_spec("auto").kind, DeviceKind::kAuto);
  EXPECT_EQ(parse_device_spec("cpu").kind, DeviceKind::kCpu);
  EXPECT_EQ(parse_device_spec("mps").kind, DeviceKind::kMps);
  EXPECT_EQ(parse_device_spec("cuda").kind, DeviceKind::kCuda);
  EXPECT_EQ(parse_device_spec("cuda").index, -1);
  const auto spec = parse_device_spec("cuda:7");
  EXPECT_EQ(spec.kind, DeviceKind::kCuda);
  EXPECT_EQ(spec.index, 7);
  EXPECT_EQ(to_string(spec), "cuda:7");
}

TEST(DeviceSpec, RejectsMalformedStrings) {
  for (const char* bad :
       {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "cuda:1:2", " cpu"}) {
    const auto message = error_of([&] { parse_device_spec(bad); });
    EXPECT_NE(message.find("unknown device"), std::string::npos) << bad;
    EXPECT_NE(message.find("cuda:N"), std::string::npos) << "lists the accepted forms: " << message;
  }
}

TEST(DevicePolicy, AutoPrefersCudaThenMpsThenCpu) {
  const auto auto_spec = parse_device_spec("auto");
  EXPECT_EQ(resolve_device(auto_spec, {true, 2, true}), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device(auto_spec, {false, 0, true}), torch::Device(torch::kMPS));
  EXPECT_EQ(resolve_device(auto_spec, {true, 0, false}), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device(auto_spec, {false, 0, false}), torch::Device(torch::kCPU));
}

TEST(DevicePolicy, ExplicitRequestsThatCanBeMet) {
  EXPECT_EQ(resolve_device(parse_device_spec("cpu"), {true, 2, true}), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device(parse_device_spec("cuda"), {true, 2, false}),
            torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device(parse_device_spec("cuda:1"), {true, 2, false}),
            torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(resolve_device(parse_device_spec("mps"), {false, 0, true}), torch::Device(torch::kMPS));
}

TEST(DevicePolicy, UnmetRequestsNameWhatIsAvailable) {
  auto msg = error_of([] { resolve_device(parse_device_spec("cuda"), {false, 0, false}); });
  EXPECT_NE(msg.find("without CUDA"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available: cpu"), std::string::npos) << msg;

  msg = error_of([] { resolve_device(parse_device_spec("cuda:3"), {true, 1, false}); });
  EXPECT_NE(msg.find("only 1 CUDA device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available: cpu, cuda:0"), std::string::npos) << msg;

  msg = error_of([] { resolve_device(parse_device_spec("cuda"), {true, 0, false}); });
  EXPECT_NE(msg.find("no CUDA device is visible"), std::string::npos) << msg;

  msg = error_of([] { resolve_device(parse_device_spec("mps"), {true, 1, false}); });
  EXPECT_NE(msg.find("MPS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available: cpu, cuda:0"), std::string::npos) << msg;
}

TEST(DevicePolicy, ThisMachineResolvesAuto) {
  const auto a = probe_availability();
  const auto picked = pick_device("auto");
  if (a.cuda_devices > 0) {
    EXPECT_TRUE(picked.is_cuda());
  } else if (!a.mps) {
    EXPECT_TRUE(picked.is_cpu());
  }
  EXPECT_FALSE(list_devices().empty());
  EXPECT_TRUE(list_devices()[0].device.is_cpu());
  EXPECT_EQ(display_name(torch::Device(torch::kCPU)).rfind("cpu (", 0), 0u);
}

// Conv nets run channels_last on CUDA and on a CPU whose AVX2 or AVX-512 kernels run (where the
// fused norm has its NHWC form); MPS keeps NCHW.
TEST(DevicePolicy, ChannelsLastOnCudaAndAvx2Cpus) {
  EXPECT_TRUE(channels_last_pays(torch::Device("cuda:0")));
  EXPECT_FALSE(channels_last_pays(torch::Device(torch::kMPS)));
  EXPECT_EQ(channels_last_pays(torch::Device(torch::kCPU)),
            gemm::available(gemm::Kernel::avx512) || gemm::available(gemm::Kernel::avx2));
}

// The CPU's peak is the process's peak RSS: it covers memory the run touched; MPS reports none.
TEST(DevicePeakMemory, CpuPeakCoversTouchedMemoryAndMpsIsUnknown) {
  const PeakMemory before = peak_memory(torch::Device(torch::kCPU));
  ASSERT_GT(before.bytes, 0);
  EXPECT_EQ(before.what, "peak RSS of the process");
  // More than the peak so far, every page written: the peak must now be at least this much.
  const int64_t bytes = before.bytes + (128 << 20);
  auto touched = torch::ones({bytes / 4}, torch::kFloat32);
  const PeakMemory after = peak_memory(torch::Device(torch::kCPU));
  EXPECT_GE(after.bytes, bytes);
  EXPECT_FLOAT_EQ(touched[bytes / 4 - 1].item<float>(), 1.0f);  // keep it alive until here
  reset_peak_memory(torch::Device(torch::kCPU));                // no reset for RSS
  EXPECT_GE(peak_memory(torch::Device(torch::kCPU)).bytes, after.bytes);
  EXPECT_EQ(peak_memory(torch::Device(torch::kMPS)).bytes, -1);
}

TEST(DeviceCheck, MismatchNamesBothDevices) {
  // The meta device stands in for "another device" on a CPU-only machine.
  const auto elsewhere = torch::empty({2, 3}, torch::TensorOptions().device(torch::kMeta));
  const auto msg = error_of([&] {
    expect_on_device(elsewhere, torch::Device(torch::kCPU), "the training batch", "the model");
  });
  EXPECT_NE(msg.find("the training batch is on meta"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the model is on cpu"), std::string::npos) << msg;
  EXPECT_NO_THROW(expect_on_device(torch::zeros({1}), torch::Device(torch::kCPU), "x", "y"));
}

TEST(DeviceCuda, BatchAndModelLandOnCuda) {
  if (probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = pick_device("cuda");
  auto t = torch::ones({4}).to(cuda);
  EXPECT_TRUE(t.is_cuda());
  const auto msg =
      error_of([&] { expect_on_device(torch::ones({1}), cuda, "the batch", "the model"); });
  EXPECT_NE(msg.find("the batch is on cpu but the model is on cuda:0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace spritetorch::device
