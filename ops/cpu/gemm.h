// Small fp32 matrix products for the CPU kernels: C[M][N] += A[M][K] * B[K][N],
// row-major with leading dimensions. A register-tiled micro-kernel keeps a
// kMicroRows x (2 * kLanes) block of C in vector registers across the K loop (GCC/Clang
// vector extensions; no intrinsics), which is ~3x faster than row-by-row axpy
// on tiles of the attention kernels' size. The vector width is the unit's own (a wider
// vector type than the unit has is split badly by GCC: 60x slower on AVX2).
#pragma once
#include <string.h>

#include "cpu_isa.h"

#if defined(__AVX512F__) || defined(FM3_CPU_AVX512)
#define FM3_CPU_LANES 16  // zmm; 8 x 2 accumulators out of 32 registers
#define FM3_CPU_MICRO_ROWS 8
#elif defined(__AVX2__) || defined(FM3_CPU_AVX2)
#define FM3_CPU_LANES 8  // ymm; 4 x 2 accumulators, 2 of B and a broadcast out of 16 registers
#define FM3_CPU_MICRO_ROWS 4
#else
#define FM3_CPU_LANES 4  // xmm (SSE2, any x86-64); as for AVX2
#define FM3_CPU_MICRO_ROWS 4
#endif

namespace fm3::cpu::FM3_CPU_ISA {

constexpr int kLanes = FM3_CPU_LANES;
constexpr int kMicroRows = FM3_CPU_MICRO_ROWS;
// Unaligned, and may alias float: loads and stores through it are single vector moves (a
// memcpy into a vector went through the stack on AVX2, a store-forwarding stall per load).
typedef float vecf __attribute__((vector_size(FM3_CPU_LANES * sizeof(float)), aligned(4), may_alias));

template <int R, int V>  // R rows x (kLanes * V) columns of C
inline void gemm_micro(const float* __restrict a, int lda, const float* __restrict b, int ldb,
                       float* __restrict c, int ldc, int k_len) {
  vecf acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = vecf{};
  for (int k = 0; k < k_len; ++k) {
    vecf bv[V];
    for (int v = 0; v < V; ++v) bv[v] = *reinterpret_cast<const vecf*>(b + static_cast<long>(k) * ldb + kLanes * v);
    for (int r = 0; r < R; ++r) {
      const float av = a[static_cast<long>(r) * lda + k];
      for (int v = 0; v < V; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      *reinterpret_cast<vecf*>(c + static_cast<long>(r) * ldc + kLanes * v) += acc[r][v];
    }
}

template <int R>  // the last n < kLanes columns
inline void gemm_tail(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int n, int k_len) {
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < k_len; ++k) {
      const float av = a[static_cast<long>(r) * lda + k];
      for (int j = 0; j < n; ++j) c[static_cast<long>(r) * ldc + j] += av * b[static_cast<long>(k) * ldb + j];
    }
}

template <int R>
inline void gemm_rows(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int n, int k_len) {
  int j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) gemm_micro<R, 2>(a, lda, b + j, ldb, c + j, ldc, k_len);
  for (; j + kLanes <= n; j += kLanes) gemm_micro<R, 1>(a, lda, b + j, ldb, c + j, ldc, k_len);
  if (j < n) gemm_tail<R>(a, lda, b + j, ldb, c + j, ldc, n - j, k_len);
}

// C[m][n] += A[m][k] * B[k][n]
inline void gemm_acc(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int n,
                     int k_len) {
  int i = 0;
  for (; i + kMicroRows <= m; i += kMicroRows)
    gemm_rows<kMicroRows>(a + static_cast<long>(i) * lda, lda, b, ldb, c + static_cast<long>(i) * ldc, ldc, n, k_len);
  for (; i < m; ++i)
    gemm_rows<1>(a + static_cast<long>(i) * lda, lda, b, ldb, c + static_cast<long>(i) * ldc, ldc, n, k_len);
}

// dst[n][m] = src[m][n]
inline void transpose(const float* src, int m, int n, float* dst) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) dst[j * m + i] = src[i * n + j];
}

}  // namespace fm3::cpu::FM3_CPU_ISA
