// Direct single-precision GEMM through the BLAS library LibTorch itself links (OpenBLAS on Debian).
//
// For the small matrices of the seed MLP, at::mm costs a few microseconds of dispatch per call on
// top of the arithmetic; calling cblas_sgemm on raw pointers removes that and lets one product
// write into a column slice of a larger matrix (ldc). The symbol is looked up at run time, like
// OpenBLAS's thread controls (cpu_threads.cpp): a LibTorch without an exported CBLAS (e.g. one with
// MKL linked in statically) simply reports it missing, and callers keep their LibTorch path.
#pragma once

namespace spritetorch::blas {

// True when cblas_sgemm was found in the process.
bool has_sgemm();

// Row-major C (m x n) = op(A) op(B) + beta C, with op(A) (m x k) and op(B) (k x n); A is stored
// (k x m) when trans_a, B is stored (n x k) when trans_b. Leading dimensions are row strides.
// Throws Error when has_sgemm() is false.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc);

}  // namespace spritetorch::blas
