// Shared-memory tiles of the mma.sync kernels (mma_sync/fwd_kernel.cuh, mma_sync/bwd_kernel.cuh):
// the XOR swizzle of 16-byte chunks and the cp.async tile copy into it.
#pragma once
#include <stdint.h>

#include "warp_primitives.cuh"  // cp_async_16, smem_u32

namespace fm3::hopper::mma_sync {

// Element offset of (row, 16-byte chunk) in a [rows][kCols] tile of 16-bit elements, the chunk
// XOR-swizzled by the row so that 8 consecutive rows of one chunk column fall into 8 different bank
// groups (ldmatrix, transposed or not). A permutation of each row's chunks only when the row holds
// whole groups of 8 chunks (kCols % 64 == 0).
template <int kCols>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kCols + ((chunk ^ (row & 7)) * 8);
}

// cp.async a [kRows][kHeadDim] tile starting at global row row0; rows at or past n_valid are
// zero-filled.
template <typename T, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t row_stride, int row0, int n_valid) {
  constexpr int kChunks = kHeadDim / 8, kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "tile copy must divide evenly among threads");
#pragma unroll
  for (int i = 0; i < kTotal / kThreads; ++i) {
    const int idx = i * kThreads + threadIdx.x, r = idx / kChunks, c = idx % kChunks;
    const bool ok = r < n_valid;
    const T* src = g + static_cast<int64_t>(row0 + (ok ? r : 0)) * row_stride + c * 8;
    cp_async_16(smem_u32(s + swz<kHeadDim>(r, c)), src, ok ? 16 : 0);
  }
}

}  // namespace fm3::hopper::mma_sync
