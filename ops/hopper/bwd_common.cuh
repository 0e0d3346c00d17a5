// Pieces both backward paths use (the WGMMA kernel, flash_bwd_wgmma.cuh, and the mma.sync fallback,
// flash_bwd_mma_sync.cuh): the tile classification of a (query tile, key block) pair, the mask head of
// a query head, the dQ workspace tile order, and the kernels around the main pass (all launched by
// flash_bwd_launch.cu):
//   bwd_preprocess_kernel  delta = rowsum(dO * O) and lse2 = lse * log2(e)
//                          (+inf for a fully masked row, so its P is exactly 0).
//   bwd_convert_dq_kernel  dq = softmax_scale * dq_accum, cast to T.
#pragma once
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "fm3/mask.h"
#include "mask_scheduler.cuh"  // classify_block, no_mask_summary
#include "warp_primitives.cuh"  // Mma<T>::pack

namespace fm3::hopper::bwd {

// Offset (floats) of dQ element (query ql of a 64-row tile, column d) inside the tile's 64 x head_dim
// block of the tile-blocked dQ workspace (written by the WGMMA kernel's dQ writer, bwd/dq_writer.cuh):
// 64-column parts of 4096 floats, each in WGMMA accumulator order (warp wq, register group j, lane,
// element), so that a warp's float4 stores to shared memory cover 512 contiguous bytes (no bank
// conflicts) and the bulk copy keeps that order.
__host__ __device__ __forceinline__ int dq_tile_offset(int ql, int d) {
  const int part = d / 64, dd = d % 64;
  const int wq = ql / 16, r = (ql % 16) / 8, g = ql % 8;
  const int j = dd / 8, t = (dd % 8) / 2, c = dd % 2;
  return part * 4096 + (wq * 8 + j) * 128 + (g * 4 + t) * 4 + 2 * r + c;
}

// Class of (query rows [m0, m0 + block_m) clipped to seqlen_q, key block [n0, n0 + block_n)): the
// schedulers' rule (classify_block, mask_scheduler.cuh); s: summary of the key block.
__device__ __forceinline__ TileClass classify_pair(const BlockSummary& s, const int32_t* bm, int bm_cols,
                                                   int m0, int block_m, int n0, int block_n, int seqlen_q,
                                                   int seqlen_k, bool causal, int causal_offset) {
  return classify_block(s, bm, bm_cols, m0, min(m0 + block_m, seqlen_q), n0, min(n0 + block_n, seqlen_k), block_n,
                        seqlen_k, causal, causal_offset);
}

// Whether key block nb (of block_n keys) adds to query tile [m0, m0 + block_m) of (batch, mask head)
// bhm, by the rule the producer skips tiles with (classify_pair over the block's summary); bm: that
// head's block_mask or nullptr; causal_offset: seqlen_k - seqlen_q. The deterministic dQ order (bwd/dq_writer.cuh) chains these blocks.
__device__ __forceinline__ bool adds_to_tile(const BwdArgs& a, int64_t bhm, const int32_t* bm, int m0, int block_m,
                                             int nb, int block_n, int n_kblocks, int causal_offset) {
  const BlockSummary summ = a.summary ? a.summary[bhm * n_kblocks + nb] : no_mask_summary(a.seqlen_q);
  return classify_pair(summ, bm, a.bm_cols, m0, block_m, nb * block_n, block_n, a.seqlen_q, a.seqlen_k, a.causal,
                       causal_offset) != kFullyMasked;
}

__device__ __forceinline__ int mask_head(const BwdArgs& a, int h) {
  const int hk = h / (a.num_heads / a.num_heads_k);
  return a.mask_heads == 1 ? 0 : (a.mask_heads == a.num_heads ? h : hk);
}

// ---------------------------------------------------------------------------
// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d] (fp32) and
// lse2[b, h, i] = lse * log2(e), +inf where lse = -inf (no visible key);
// rows i in [seqlen_q, lse_stride) are padding: lse2 = +inf, delta = 0.
// One warp per row; grid.x * 8 warps >= batch * num_heads * lse_stride.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256)
    bwd_preprocess_kernel(const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
                          float* __restrict__ delta, float* __restrict__ lse2, int64_t o_bs, int64_t o_rs,
                          int64_t o_hs, int num_heads, int seqlen_q, int lse_stride, int64_t n_rows) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= n_rows) return;
  const int i = static_cast<int>(w % lse_stride);
  const int64_t bh = w / lse_stride;
  if (i >= seqlen_q) {
    if (lane == 0) {
      delta[w] = 0.f;
      lse2[w] = CUDART_INF_F;
    }
    return;
  }
  const int h = static_cast<int>(bh % num_heads), b = static_cast<int>(bh / num_heads);
  const int64_t off = b * o_bs + static_cast<int64_t>(i) * o_rs + h * o_hs;
  constexpr int kChunks = kHeadDim / 8;
  float sum = 0.f;
  for (int c = lane; c < kChunks; c += 32) {
    const uint4 ov = *reinterpret_cast<const uint4*>(out + off + c * 8);
    const uint4 dv = *reinterpret_cast<const uint4*>(dout + off + c * 8);
    const T* o8 = reinterpret_cast<const T*>(&ov);
    const T* d8 = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += static_cast<float>(o8[e]) * static_cast<float>(d8[e]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) {
    const float l = lse[bh * seqlen_q + i];
    delta[w] = sum;
    lse2[w] = l == -CUDART_INF_F ? CUDART_INF_F : l * 1.4426950408889634f;
  }
}

// dq[b, i, h, :] = scale * dq_accum cast to T; 8 elements per thread. The accumulator is
// [batch, num_heads, acc_rows, head_dim]: row-major (kTiled = false) or, per 64-row tile,
// permuted by dq_tile_offset (the WGMMA kernel's dQ writer).
template <typename T, int kHeadDim, bool kTiled>
__global__ void __launch_bounds__(256)
    bwd_convert_dq_kernel(const float* __restrict__ acc, T* __restrict__ dq, int64_t q_bs, int64_t q_rs,
                          int64_t q_hs, int num_heads, int seqlen_q, int acc_rows, float scale, int64_t n_chunks) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_chunks) return;
  constexpr int kChunks = kHeadDim / 8;
  const int c = static_cast<int>(idx % kChunks);
  const int64_t w = idx / kChunks;  // (b, h, i)
  const int i = static_cast<int>(w % seqlen_q);
  const int64_t bh = w / seqlen_q;
  const int h = static_cast<int>(bh % num_heads), b = static_cast<int>(bh / num_heads);
  float x[8];
  if constexpr (kTiled) {
    const float* tile = acc + (bh * acc_rows + i / 64 * 64) * kHeadDim;
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const float2 v = *reinterpret_cast<const float2*>(tile + dq_tile_offset(i % 64, c * 8 + e));
      x[e] = v.x;
      x[e + 1] = v.y;
    }
  } else {
    const float* row = acc + (bh * acc_rows + i) * kHeadDim + c * 8;
    const float4 x0 = *reinterpret_cast<const float4*>(row);
    const float4 x1 = *reinterpret_cast<const float4*>(row + 4);
    x[0] = x0.x; x[1] = x0.y; x[2] = x0.z; x[3] = x0.w;
    x[4] = x1.x; x[5] = x1.y; x[6] = x1.z; x[7] = x1.w;
  }
  uint4 o;
  o.x = Mma<T>::pack(x[0] * scale, x[1] * scale);
  o.y = Mma<T>::pack(x[2] * scale, x[3] * scale);
  o.z = Mma<T>::pack(x[4] * scale, x[5] * scale);
  o.w = Mma<T>::pack(x[6] * scale, x[7] * scale);
  *reinterpret_cast<uint4*>(dq + b * q_bs + static_cast<int64_t>(i) * q_rs + h * q_hs + c * 8) = o;
}

}  // namespace fm3::hopper::bwd
