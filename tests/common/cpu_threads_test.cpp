// The default split of the cores between LibTorch's intra-op pool and OpenBLAS's threads
// (common/cpu_threads.h), and which models count as convolutional.
#include "common/cpu_threads.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "models/classifier.h"

namespace spritetorch {
namespace {

TEST(CpuThreads, DefaultsGiveTheCoresToThePoolThatDoesTheWork) {
  const CpuThreads before = current_cpu_threads();
  const bool openblas = before.blas > 0;  // without OpenBLAS only the intra-op side is visible
  auto expect = [&](int intra, int blas, CpuWork work, int cores, int want_intra, int want_blas) {
    const CpuThreads got = apply_cpu_threads(intra, blas, work, cores);
    const std::string what = "--threads " + std::to_string(intra) + " --blas-threads " +
                             std::to_string(blas) +
                             (work == CpuWork::kConvolutions ? ", conv net" : ", MLP") + ", " +
                             std::to_string(cores) + " cores";
    EXPECT_EQ(got.intra_op, want_intra) << what;
    if (openblas) {
      EXPECT_EQ(got.blas, want_blas) << what;
    }
  };
  expect(0, 0, CpuWork::kConvolutions, 2, 2, 1);  // conv nets: LibTorch's own kernels
  expect(0, 0, CpuWork::kMatmuls, 2, 1, 2);       // MLPs: BLAS
  expect(0, 0, CpuWork::kConvolutions, 1, 1, 1);
  // One given: the other takes what is left of the cores, never more than its own default.
  expect(2, 0, CpuWork::kMatmuls, 2, 2, 1);
  expect(1, 0, CpuWork::kMatmuls, 2, 1, 2);
  expect(0, 2, CpuWork::kConvolutions, 2, 1, 2);
  expect(0, 1, CpuWork::kConvolutions, 2, 2, 1);
  expect(1, 0, CpuWork::kConvolutions, 2, 1, 1);
  // Both given: as given, even when they oversubscribe the cores.
  expect(2, 2, CpuWork::kMatmuls, 2, 2, 2);
  apply_cpu_threads(before.intra_op, std::max(before.blas, 0), CpuWork::kMatmuls);
}

TEST(CpuThreads, CoresAreTheAllowedOnesSharedThenCappedByOmpNumThreads) {
  EXPECT_EQ(cpu_cores_for(16, 1, nullptr), 16);
  EXPECT_EQ(cpu_cores_for(16, 4, nullptr), 4);  // 4 ranks on the machine: a quarter each
  EXPECT_EQ(cpu_cores_for(3, 4, nullptr), 1);   // ... at least one
  EXPECT_EQ(cpu_cores_for(16, 1, "2"), 2);      // OMP_NUM_THREADS caps a process
  EXPECT_EQ(cpu_cores_for(16, 4, "2"), 2);      // ... per process, after the share
  EXPECT_EQ(cpu_cores_for(4, 1, "32"), 4);      // ... but never adds cores
  EXPECT_EQ(cpu_cores_for(16, 1, "3,1"), 3);    // nested levels: the outer one
  EXPECT_EQ(cpu_cores_for(16, 1, ""), 16);      // empty, junk, zero or negative: ignored
  EXPECT_EQ(cpu_cores_for(16, 1, "many"), 16);
  EXPECT_EQ(cpu_cores_for(16, 1, "4x"), 16);
  EXPECT_EQ(cpu_cores_for(16, 1, "0"), 16);
  EXPECT_EQ(cpu_cores_for(16, 1, "-2"), 16);
  EXPECT_EQ(cpu_cores_for(0, 1, nullptr), 1);  // hardware_concurrency() may say 0
}

// At start, an OMP_NUM_THREADS past the cores (65536 started that many threads and crashed) or
// one OpenMP cannot read (a stack trace from LibTorch) becomes LibTorch's threads = the cores.
TEST(CpuThreads, AnOmpNumThreadsPastTheCoresOrUnreadableIsCappedAtStart) {
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string kept = before ? before : "";
  const int threads = at::get_num_threads();
  const auto with = [](const char* value) {
    if (value)
      ::setenv("OMP_NUM_THREADS", value, 1);
    else
      ::unsetenv("OMP_NUM_THREADS");
    at::set_num_threads(1);
    return cap_threads_from_environment();
  };
  for (const char* past : {"65536", "0", "", "many", "-3"}) {
    EXPECT_TRUE(with(past)) << past;
    EXPECT_EQ(at::get_num_threads(), cpu_cores()) << past;
  }
  for (const char* within : {"1", "1,1"}) {
    EXPECT_FALSE(with(within)) << within;
    EXPECT_EQ(at::get_num_threads(), 1) << within;  // left as it was
  }
  EXPECT_FALSE(with(nullptr));
  if (before)
    ::setenv("OMP_NUM_THREADS", kept.c_str(), 1);
  else
    ::unsetenv("OMP_NUM_THREADS");
  at::set_num_threads(threads);
}

TEST(CpuThreads, TheBlasIsNamedWithWhatItsThreadsFollow) {
  EXPECT_EQ(describe_blas("OpenBLAS 0.3.21 DYNAMIC_ARCH", false), "OpenBLAS 0.3.21 DYNAMIC_ARCH");
  const std::string mkl = describe_blas(nullptr, true);  // a pip torch: no "install OpenBLAS"
  EXPECT_EQ(mkl.rfind("MKL inside LibTorch", 0), 0u) << mkl;
  EXPECT_EQ(mkl.find("install"), std::string::npos) << mkl;
  EXPECT_NE(describe_blas(nullptr, false).find("install libopenblas0-pthread"), std::string::npos);
  // LibTorch calls its MKL even when an OpenBLAS is loaded beside it.
  EXPECT_EQ(describe_blas("OpenBLAS 0.3.21", true), mkl);
}

TEST(CpuThreads, OpenBlasCoresBelowTheCpuAreCalledOutWithTheSettingThatFixesThem) {
  // Debian 12's OpenBLAS on an Intel Xeon it does not know: SSE3 kernels on an AVX-512 CPU.
  EXPECT_EQ(openblas_core_advice("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(openblas_core_advice("Sandybridge", true, false), "Haswell");
  EXPECT_EQ(openblas_core_advice("Nehalem", true, true), "SkylakeX");
  // AVX2 kernels on an AVX-512 CPU (OPENBLAS_CORETYPE=Haswell on a Zen 5: half the sgemm rate).
  EXPECT_EQ(openblas_core_advice("Haswell", true, true), "SkylakeX");
  EXPECT_EQ(openblas_core_advice("Zen", true, true), "SkylakeX");
  // Right choices, and the cases where there is nothing to say.
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(openblas_core_advice(core, true, true), "") << core;
  for (const char* core : {"Haswell", "Zen", "Excavator"})
    EXPECT_EQ(openblas_core_advice(core, true, false), "") << core;  // an AVX2-only CPU
  EXPECT_EQ(openblas_core_advice("Prescott", false, false), "");     // an SSE-only CPU
  EXPECT_EQ(openblas_core_advice(nullptr, true, true), "");          // not OpenBLAS
}

TEST(CpuThreads, ModelsWithConvolutionsAreConvolutional) {
  EXPECT_EQ(cpu_work_of(*models::make_model({"cnn", {1, 28, 28}, 10})), CpuWork::kConvolutions);
  EXPECT_EQ(cpu_work_of(*models::make_model({"ann", {1, 28, 28}, 10})), CpuWork::kMatmuls);
  EXPECT_EQ(cpu_work_of(*models::make_model({"simplenn", {3}, 2})), CpuWork::kMatmuls);
}

}  // namespace
}  // namespace spritetorch
