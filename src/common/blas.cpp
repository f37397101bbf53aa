#include "common/blas.h"

#include <dlfcn.h>

#include "common/error.h"

namespace spritetorch::blas {

namespace {

// The CBLAS ABI: enums are ints (CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112).
using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

SgemmFn find_sgemm() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return fn;
}

}  // namespace

bool has_sgemm() { return find_sgemm() != nullptr; }

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  const SgemmFn fn = find_sgemm();
  if (!fn) throw Error("cblas_sgemm is not available in this process");
  fn(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, 1.0f, a, lda, b,
     ldb, beta, c, ldc);
}

}  // namespace spritetorch::blas
