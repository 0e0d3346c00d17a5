// Block summary on the GPU: for every (batch, mask head, key block of block_n
// columns) the min/max of the four normalized boundary vectors (8 int32 in
// fm3::BlockSummary order). O(S_k) work, one warp per key block, coalesced
// column reads; the columns are normalized with fm3::load_column and folded
// with fm3::summary_add (mask.h), the same functions every other path uses.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "fm3/mask.h"

namespace fm3::hopper {

constexpr int kSummaryWarpsPerCta = 8;

__device__ __forceinline__ int32_t warp_min(int32_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ int32_t warp_max(int32_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// grid.x * kSummaryWarpsPerCta >= n_bh * n_blocks; one warp per key block.
__global__ void __launch_bounds__(kSummaryWarpsPerCta * 32)
    block_summary_kernel(const int32_t* __restrict__ sri, int n_bh, int seqlen_q, int seqlen_k,
                         int mask_cols, bool causal, int block_n, int n_blocks,
                         BlockSummary* __restrict__ out) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kSummaryWarpsPerCta + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= static_cast<int64_t>(n_bh) * n_blocks) return;
  const int64_t bh = w / n_blocks;
  const int blk = static_cast<int>(w % n_blocks);
  const int32_t* col0 = sri + bh * seqlen_k * mask_cols;
  const int n0 = blk * block_n, n1 = min(n0 + block_n, seqlen_k);
  BlockSummary s = empty_summary();
  for (int j = n0 + lane; j < n1; j += 32)
    summary_add(s, load_column(col0 + static_cast<int64_t>(j) * mask_cols, j, mask_cols, causal, seqlen_q,
                               causal_offset_of(seqlen_q, seqlen_k)));
  s.lts_min = warp_min(s.lts_min);
  s.lts_max = warp_max(s.lts_max);
  s.lte_min = warp_min(s.lte_min);
  s.lte_max = warp_max(s.lte_max);
  s.uts_min = warp_min(s.uts_min);
  s.uts_max = warp_max(s.uts_max);
  s.ute_min = warp_min(s.ute_min);
  s.ute_max = warp_max(s.ute_max);
  if (lane == 0) out[w] = s;
}

inline cudaError_t launch_block_summary(const int32_t* sri, int n_bh, int seqlen_q, int seqlen_k,
                                        int mask_cols, bool causal, int block_n,
                                        BlockSummary* out, cudaStream_t stream) {
  const int n_blocks = (seqlen_k + block_n - 1) / block_n;
  const int64_t warps = static_cast<int64_t>(n_bh) * n_blocks;
  const int64_t ctas = (warps + kSummaryWarpsPerCta - 1) / kSummaryWarpsPerCta;
  block_summary_kernel<<<static_cast<unsigned>(ctas), kSummaryWarpsPerCta * 32, 0, stream>>>(
      sri, n_bh, seqlen_q, seqlen_k, mask_cols, causal, block_n, n_blocks, out);
  return cudaGetLastError();
}

}  // namespace fm3::hopper
