// Small fp32 matrix products for the CPU kernels: C[M][N] += A[M][K] * B[K][N],
// row-major with leading dimensions. A register-tiled micro-kernel keeps a
// kRows x 32 block of C in vector registers across the K loop (GCC/Clang
// vector extensions; no intrinsics), which is ~3x faster than row-by-row axpy
// on tiles of the attention kernels' size.
#pragma once
#include <string.h>

namespace fm3::cpu {

typedef float vec16 __attribute__((vector_size(64), aligned(4)));

#ifdef __AVX512F__
constexpr int kMicroRows = 8;  // 8 x 2 zmm accumulators out of 32 registers
#else
constexpr int kMicroRows = 2;  // each vec16 is two ymm: 2 x 4 out of 16 registers
#endif

template <int R, int V>  // R rows x (16 * V) columns of C
inline void gemm_micro(const float* __restrict a, int lda, const float* __restrict b, int ldb,
                       float* __restrict c, int ldc, int k_len) {
  vec16 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = vec16{};
  for (int k = 0; k < k_len; ++k) {
    vec16 bv[V];
    for (int v = 0; v < V; ++v) memcpy(&bv[v], b + static_cast<long>(k) * ldb + 16 * v, sizeof(vec16));
    for (int r = 0; r < R; ++r) {
      const float av = a[static_cast<long>(r) * lda + k];
      for (int v = 0; v < V; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      float* dst = c + static_cast<long>(r) * ldc + 16 * v;
      vec16 cv;
      memcpy(&cv, dst, sizeof(vec16));
      cv += acc[r][v];
      memcpy(dst, &cv, sizeof(vec16));
    }
}

template <int R>  // the last n < 16 columns
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
  for (; j + 32 <= n; j += 32) gemm_micro<R, 2>(a, lda, b + j, ldb, c + j, ldc, k_len);
  for (; j + 16 <= n; j += 16) gemm_micro<R, 1>(a, lda, b + j, ldb, c + j, ldc, k_len);
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

}  // namespace fm3::cpu
