// bf16 matrix products with float32 sums, for the CPU MLP step's first layer under
// --precision bf16 on CPUs with AVX512_BF16 (vdpbf16ps: 32 bf16 products a vector, twice the fp32
// FMA's): on a Zen 5 core the seed's layer-1 product takes 20.5 us against 35.4 us in fp32
// (bench/bf16_gemm_probe). Values are rounded to bf16 (nearest even) and their products summed in
// float32, as autocast's bf16 matmuls do.
//
// vdpbf16ps multiplies pairs of neighbours along the summed dimension, so each operand is stored
// with that dimension's neighbours next to each other:
//
//   nt: C = A B^T (+ bias, ReLU)   A (m x k) and B (n x k) bf16 row-major, k summed: the forward
//                                  z = x W^T + b with x and W as they lie (rows along k);
//   tn: C = A^T B                  A (k x m) and B (k x n) summed over k, stored in the pair
//                                  layout of pack_row_pairs (rows 2q and 2q + 1 interleaved): the
//                                  weight gradient dz^T x, summed over the batch.
//
// available() says whether this CPU runs them; the functions throw Error where it does not.
#pragma once

#include <cstdint>

namespace spritetorch::bf16 {

// AVX-512 F/BW/VL and AVX512_BF16, with the OS saving the 512-bit state.
bool available();

// bf16 <-> float32. to_bf16 rounds to nearest even, as LibTorch does; NaN stays NaN.
uint16_t to_bf16(float value);
float to_float(uint16_t value);
// out[i] = to_bf16(in[i]) for i < n.
void round_floats(const float* in, uint16_t* out, int64_t n);

// The pair layout of a (rows x cols) float32 matrix (row stride ld): pair (q, j) holds rows 2q and
// 2q + 1 of column j, out[(q * cols + j) * 2 + e] = to_bf16(src[(2q + e) * ld + j]); an odd last
// row is paired with 0. out holds (rows + 1) / 2 * cols * 2 values. rows_out, when given, gets the
// same values row-major as well, rows_out[r * cols + j] = to_bf16(src[r * ld + j]), in the same
// pass over src.
void pack_row_pairs(const float* src, int rows, int cols, int ld, uint16_t* out,
                    uint16_t* rows_out = nullptr);

// Row-major C (m x n, row stride ldc) = A (m x k, stride lda) B^T, B stored (n x k, stride ldb),
// all bf16; then + bias[j] when bias is given and max(0, c) when relu (NaN stays NaN).
void nt(int m, int n, int k, const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c,
        int ldc, const float* bias, bool relu);

// Row-major C (m x n, row stride ldc) = A^T B, summed over `pairs` pairs of rows of A (k x m) and
// B (k x n) stored by pack_row_pairs with cols lda and ldb: element (q, i) of A is the pair at
// a + (q * lda + i) * 2.
void tn(int m, int n, int pairs, const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c,
        int ldc);

}  // namespace spritetorch::bf16
