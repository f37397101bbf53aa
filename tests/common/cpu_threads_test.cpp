// The default split of the cores between LibTorch's intra-op pool and OpenBLAS's threads
// (common/cpu_threads.h), and which models count as convolutional.
#include "common/cpu_threads.h"

#include <gtest/gtest.h>

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

TEST(CpuThreads, ModelsWithConvolutionsAreConvolutional) {
  EXPECT_EQ(cpu_work_of(*models::make_model({"cnn", {1, 28, 28}, 10})), CpuWork::kConvolutions);
  EXPECT_EQ(cpu_work_of(*models::make_model({"ann", {1, 28, 28}, 10})), CpuWork::kMatmuls);
  EXPECT_EQ(cpu_work_of(*models::make_model({"simplenn", {3}, 2})), CpuWork::kMatmuls);
}

}  // namespace
}  // namespace spritetorch
