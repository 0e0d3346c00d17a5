// Pieces both backward paths use (the WGMMA kernel, bwd/kernel.cuh, and the mma.sync fallback,
// mma_sync/bwd_kernel.cuh): the tile classification of a (query tile, key block) pair, the mask head of
// a query head, the dQ workspace tile order, and the kernels around the main pass (all launched by
// flash_bwd_launch.cu):
//   bwd_preprocess_kernel  delta = rowsum(dO * O) and lse2 = lse * log2(e)
//                          (+inf for a fully masked row, so its P is exactly 0); clears dq_accum.
//   bwd_convert_dq_kernel  dq = softmax_scale * dq_accum, cast to T (bwd_convert_dq_tiled_kernel:
//                          from the WGMMA kernel's tile-blocked accumulator).
//   bwd_sink_partial_kernel, bwd_sink_grad_kernel
//                          the learnable sink's gradient from lse and delta.
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
  return mask_head_of(h, hk, a.num_heads, a.mask_heads);
}

// ---------------------------------------------------------------------------
// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d] (fp32, over the kHeadDimV columns of O) and
// lse2[b, h, i] = lse * log2(e), +inf where lse = -inf (no visible key);
// rows i in [seqlen_q, lse_stride) are padding: lse2 = +inf, delta = 0. Each row also clears its
// kTileDim floats of the dQ accumulator (the accumulator's w-th chunk, whatever its layout: the
// rows cover it whole), which spares a memset's pass over it.
// kPrepLanesPerRow lanes per row (one 16-byte chunk of O and dO each at head dims 64 and 128), so
// every lane loads: the largest power of two <= kHeadDimV / 8, at most 32 (a row's lanes reduce with
// xor shuffles inside their group). grid.x * 8 warps * (32 / kPrepLanesPerRow) rows >= batch *
// num_heads * lse_stride.
constexpr int prep_lanes_per_row(int chunks) {
  int lanes = 1;
  while (lanes * 2 <= chunks && lanes < 32) lanes *= 2;
  return lanes;
}
template <int kHeadDim>
constexpr int kPrepLanesPerRow = prep_lanes_per_row(kHeadDim / 8);

template <typename T, int kTileDim, int kHeadDimV>
__global__ void __launch_bounds__(256)
    bwd_preprocess_kernel(const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
                          float* __restrict__ delta, float* __restrict__ lse2, float* __restrict__ dq_accum,
                          int64_t o_bs, int64_t o_rs, int64_t o_hs, int num_heads, int seqlen_q, int lse_stride,
                          int64_t n_rows) {
  constexpr int kChunks = kHeadDimV / 8, kLanes = kPrepLanesPerRow<kHeadDimV>, kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32, sub = lane % kLanes;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32) * kRowsPerWarp + lane / kLanes;
  const bool in_range = w < n_rows;  // no early return: the row's lanes reduce with full-warp shuffles
  if (in_range) {
    float4* acc = reinterpret_cast<float4*>(dq_accum + w * kTileDim);
#pragma unroll
    for (int c = sub; c < kTileDim / 4; c += kLanes) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int i = in_range ? static_cast<int>(w % lse_stride) : seqlen_q;
  const int64_t bh = w / lse_stride;
  float sum = 0.f;
  if (i < seqlen_q) {
    const int h = static_cast<int>(bh % num_heads), b = static_cast<int>(bh / num_heads);
    const int64_t off = b * o_bs + static_cast<int64_t>(i) * o_rs + h * o_hs;
#pragma unroll
    for (int c = sub; c < kChunks; c += kLanes) {
      const uint4 ov = *reinterpret_cast<const uint4*>(out + off + c * 8);
      const uint4 dv = *reinterpret_cast<const uint4*>(dout + off + c * 8);
      const T* o8 = reinterpret_cast<const T*>(&ov);
      const T* d8 = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += static_cast<float>(o8[e]) * static_cast<float>(d8[e]);
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (in_range && sub == 0) {
    const float l = i < seqlen_q ? lse[bh * seqlen_q + i] : -CUDART_INF_F;
    delta[w] = sum;
    lse2[w] = l == -CUDART_INF_F ? CUDART_INF_F : l * 1.4426950408889634f;
  }
}

// The learnable sink's gradient, dsink[h] = -sum over batch and rows of exp(sink[h] - lse) * delta
// (the sink's value is 0, so the row term delta is all of its softmax gradient), in two passes with
// a fixed order, so the result is bitwise repeatable: bwd_sink_partial_kernel sums chunks of
// kSinkChunkRows (batch, row) pairs of a head into partial[h, chunk] (grid: chunks x heads), then
// bwd_sink_grad_kernel adds each head's chunks (one CTA per head). A row with lse -inf saw nothing
// (no sink in its lse) and adds 0.
constexpr int kSinkRowsPerThread = 8;
constexpr int kSinkChunkRows = 256 * kSinkRowsPerThread;

// Tree sum of one value per thread of a 256-thread CTA, valid in thread 0.
__device__ __forceinline__ float cta_sum_256(float x) {
  __shared__ float part[256];
  part[threadIdx.x] = x;
  __syncthreads();
#pragma unroll
  for (int n = 128; n > 0; n >>= 1) {
    if (threadIdx.x < n) part[threadIdx.x] += part[threadIdx.x + n];
    __syncthreads();
  }
  return part[0];
}

__global__ void __launch_bounds__(256)
    bwd_sink_partial_kernel(const float* __restrict__ lse, const float* __restrict__ delta,
                            const float* __restrict__ sink, float* __restrict__ partial, int num_heads,
                            int seqlen_q, int lse_stride, int64_t rows_per_head) {
  const int h = blockIdx.y;
  const float s = sink[h];
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kSinkRowsPerThread; ++j) {  // independent loads, all in flight at once
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kSinkChunkRows + j * 256 + threadIdx.x;  // b * S_q + i
    if (r < rows_per_head) {
      const int64_t b = r / seqlen_q, i = r % seqlen_q, bh = b * num_heads + h;
      const float l = lse[bh * seqlen_q + i];
      const float t = expf(s - l) * delta[bh * lse_stride + i];
      sum += l == -CUDART_INF_F ? 0.f : t;
    }
  }
  const float total = cta_sum_256(sum);
  if (threadIdx.x == 0) partial[static_cast<int64_t>(h) * gridDim.x + blockIdx.x] = total;
}

__global__ void __launch_bounds__(256)
    bwd_sink_grad_kernel(const float* __restrict__ partial, float* __restrict__ dsink, int n_chunks) {
  const int h = blockIdx.x;
  float sum = 0.f;
  for (int c = threadIdx.x; c < n_chunks; c += 256) sum += partial[static_cast<int64_t>(h) * n_chunks + c];
  const float total = cta_sum_256(sum);
  if (threadIdx.x == 0) dsink[h] = -total;
}

// dq[b, i, h, :] = scale * dq_accum cast to T, from the row-major accumulator
// [batch, num_heads, acc_rows, head_dim] (the mma.sync kernel's); 8 elements per thread.
template <typename T, int kHeadDim>
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
  const float* row = acc + (bh * acc_rows + i) * kHeadDim + c * 8;
  const float4 x0 = *reinterpret_cast<const float4*>(row);
  const float4 x1 = *reinterpret_cast<const float4*>(row + 4);
  uint4 o;
  o.x = Mma<T>::pack(x0.x * scale, x0.y * scale);
  o.y = Mma<T>::pack(x0.z * scale, x0.w * scale);
  o.z = Mma<T>::pack(x1.x * scale, x1.y * scale);
  o.w = Mma<T>::pack(x1.z * scale, x1.w * scale);
  *reinterpret_cast<uint4*>(dq + b * q_bs + static_cast<int64_t>(i) * q_rs + h * q_hs + c * 8) = o;
}

// The same from the tile-blocked accumulator (dq_tile_offset; the WGMMA kernel's, rows of kTileDim
// floats of which the first kHeadDim are dQ's columns), acc_rows a multiple of 64. Each thread
// converts 8 columns of rows ql and ql + 8 of a 64-row tile, which the tile order keeps side by side
// (a float4 holds 2 columns of both rows): four 16-byte loads of one contiguous 64 bytes.
// n_threads = batch * num_heads * acc_rows / 2 * (kHeadDim / 8).
template <typename T, int kTileDim, int kHeadDim>
__global__ void __launch_bounds__(256)
    bwd_convert_dq_tiled_kernel(const float* __restrict__ acc, T* __restrict__ dq, int64_t q_bs, int64_t q_rs,
                                int64_t q_hs, int num_heads, int seqlen_q, int acc_rows, float scale,
                                int64_t n_threads) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_threads) return;
  constexpr int kChunks = kHeadDim / 8;
  const int c = static_cast<int>(idx % kChunks);
  const int64_t pr = idx / kChunks;  // (b, h, row pair)
  const int pairs = acc_rows / 2;
  const int p = static_cast<int>(pr % pairs);
  const int64_t bh = pr / pairs;
  const int tile = p / 32, ql = (p % 32) / 8 * 16 + p % 8;  // rows ql and ql + 8 of the tile
  const int i = tile * 64 + ql;
  if (i >= seqlen_q) return;
  const float* src = acc + (bh * acc_rows + tile * 64) * kTileDim + dq_tile_offset(ql, c * 8);
  float4 v[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) v[t] = *reinterpret_cast<const float4*>(src + 4 * t);  // columns 2t, 2t + 1
  uint4 lo, hi;  // rows ql and ql + 8
  lo.x = Mma<T>::pack(v[0].x * scale, v[0].y * scale);
  lo.y = Mma<T>::pack(v[1].x * scale, v[1].y * scale);
  lo.z = Mma<T>::pack(v[2].x * scale, v[2].y * scale);
  lo.w = Mma<T>::pack(v[3].x * scale, v[3].y * scale);
  hi.x = Mma<T>::pack(v[0].z * scale, v[0].w * scale);
  hi.y = Mma<T>::pack(v[1].z * scale, v[1].w * scale);
  hi.z = Mma<T>::pack(v[2].z * scale, v[2].w * scale);
  hi.w = Mma<T>::pack(v[3].z * scale, v[3].w * scale);
  const int h = static_cast<int>(bh % num_heads), b = static_cast<int>(bh / num_heads);
  T* dst = dq + b * q_bs + static_cast<int64_t>(i) * q_rs + h * q_hs + c * 8;
  *reinterpret_cast<uint4*>(dst) = lo;
  if (i + 8 < seqlen_q) *reinterpret_cast<uint4*>(dst + 8 * q_rs) = hi;
}

}  // namespace fm3::hopper::bwd
