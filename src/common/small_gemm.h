// Matrix products for the small shapes of the CPU MLP step (a batch of 64, layers of 10-784 units).
//
// On such shapes OpenBLAS spends a good part of each call outside its kernel: it zeroes C for
// beta = 0 and packs both operands into panels, every call (~15% of the seed step's samples in
// `perf record`). The products here read their operands where they lie, write C once, and fuse
// a layer's bias and ReLU into the store. Two forms cover a dense layer's forward and backward:
//
//   nt: C = A B^T (+ bias, ReLU)   A and B both contiguous along the inner dimension:
//                                  the forward z = x W^T + b, W stored (out, in) as in LibTorch;
//   nn: C = op(A) B                B and C contiguous along the output columns, A read through
//                                  any two strides: weight gradients dz^T a (A transposed) and
//                                  input gradients dz W (A as stored).
//
// The kernel is picked once at run time: AVX-512 (F, BW, VL) when the CPU has it, else AVX2+FMA,
// else the BLAS library (cblas_sgemm, common/blas.h), else plain loops; SPRITETORCH_GEMM_KERNEL
// names one to use instead (to compare them). They agree within float rounding (tests compare
// each with torch::mm); bench/small_gemm_bench.cpp times them against each other. The step's Adam
// update follows the same choice (train/adam_kernels.h).
#pragma once

namespace spritetorch::gemm {

enum class Kernel { avx2, avx512, blas, loops };

// The fastest kernel this process can run, or the one SPRITETORCH_GEMM_KERNEL names (throws Error
// when it names none or one that cannot run here).
Kernel best_kernel();
// Whether `kernel` can run here (avx2: the CPU has AVX2 and FMA; avx512: also AVX-512 F, BW and VL
// with the OS saving their registers; blas: cblas_sgemm was found).
bool available(Kernel kernel);
const char* kernel_name(Kernel kernel);  // "avx2", "avx512", "blas", "loops"

// Row-major C (m x n, row stride ldc) = A (m x k, stride lda) B^T, with B stored (n x k, stride
// ldb); then c[i][j] += bias[j] when bias is given, and max(0, c) when relu (NaN stays NaN).
void nt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
        const float* bias, bool relu, Kernel kernel = best_kernel());

// Row-major C (m x n, row stride ldc) = A (m x k) B, B stored (k x n, stride ldb), where A's
// element (i, p) is a[i * a_row + p * a_col]: (a_row, a_col) = (lda, 1) for A as stored,
// (1, lda) for A stored transposed (k x m).
void nn(int m, int n, int k, const float* a, int a_row, int a_col, const float* b, int ldb,
        float* c, int ldc, Kernel kernel = best_kernel());

}  // namespace spritetorch::gemm
