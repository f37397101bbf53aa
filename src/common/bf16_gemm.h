// bf16 matrix products with float32 sums, for the CPU MLP step's first layer under
// --precision bf16 on CPUs with AVX512_BF16 (vdpbf16ps: 32 bf16 products a vector, twice the fp32
// FMA's work). At the seed's layer-1 shapes on one Zen 5 core (bench/bf16_gemm_probe,
// library_bf16): the forward 16.4 us against 34 us in fp32, dW_1 17.7 us against 29.5 us. Values
// are rounded to bf16 (nearest even) and their products summed in float32, as autocast's bf16
// matmuls do.
//
// vdpbf16ps multiplies pairs of neighbours along the summed dimension, so the operands are packed
// with those neighbours side by side, and each kernel broadcasts one pair of A against 16 pairs of
// B (no sums across lanes):
//
//   nt_pairs: C = A B^T (+ bias, ReLU)   A (m x k) row-major, B (n x k) packed by pack_col_pairs:
//                                        the forward z = x W^T + b, k summed;
//   tn:       C = A^T B                  A (k x m) and B (k x n) packed by pack_row_pairs: the
//                                        weight gradient dz^T x, summed over the batch.
//
// available() says whether this CPU runs them; the functions throw Error where it does not.
#pragma once

#include <cstdint>

namespace spritetorch::bf16 {

// AVX-512 F/BW/VL and AVX512_BF16, with the OS saving the 512-bit state.
bool available();

// bf16 <-> float32. to_bf16 rounds to nearest even, as LibTorch does; NaN stays NaN; subnormal
// floats round to signed zero, as vcvtne2ps2bf16 reads them.
uint16_t to_bf16(float value);
float to_float(uint16_t value);

// The pair layout of a (rows x cols) float32 matrix's rows (row stride ld): pair (q, j) holds rows
// 2q and 2q + 1 of column j, out[(q * cols + j) * 2 + e] = to_bf16(src[(2q + e) * ld + j]); an odd
// last row is paired with 0. out holds (rows + 1) / 2 * cols * 2 values. rows_out, when given,
// gets the same values row-major in the same pass over src, in rows of cols rounded up to even
// (the pad 0): rows_out[r * even(cols) + j] = to_bf16(src[r * ld + j]), nt_pairs's A.
void pack_row_pairs(const float* src, int rows, int cols, int ld, uint16_t* out,
                    uint16_t* rows_out = nullptr);

// The pair layout of src's columns: out[(q * rows + r) * 2 + e] = to_bf16(src[r * ld + 2q + e]),
// an odd last column paired with 0; out holds (cols + 1) / 2 * rows * 2 values. W's layout for
// nt_pairs.
void pack_col_pairs(const float* src, int rows, int cols, int ld, uint16_t* out);

// Row-major C (m x n, row stride ldc) = A B^T; then + bias[j] when bias is given and max(0, c)
// when relu (NaN stays NaN). A: bf16 (m x k), row stride lda even and >= k, its elements from k
// to the even length 0 (as pack_row_pairs's rows_out). B (n x k) as pack_col_pairs packed it,
// pair (q, j) at b_pairs + (q * ldb + j) * 2 (ldb: the rows it packed).
void nt_pairs(int m, int n, int k, const uint16_t* a, int lda, const uint16_t* b_pairs, int ldb,
              float* c, int ldc, const float* bias, bool relu);

// Row-major C (m x n, row stride ldc) = A^T B, summed over `pairs` pairs of rows of A (k x m) and
// B (k x n) as pack_row_pairs packed them with cols lda and ldb: element (q, i) of A is the pair
// at a + (q * lda + i) * 2.
void tn(int m, int n, int pairs, const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c,
        int ldc);

}  // namespace spritetorch::bf16
