// FlashMask backward on mma.sync tensor cores (HMMA m16n8k16): the fallback of the WGMMA
// kernel (bwd/kernel.cuh) for the configs it does not cover, layouts TMA cannot describe
// and FM3_BWD_KERNEL=mma_sync. A mask-aware FlashAttention-2-style backward (Dao 2023, Alg. 2) with
// cp.async double buffering, built for sm_90a. The preprocess and dQ conversion kernels and the
// helpers shared with the WGMMA backward are in bwd/common.cuh.
//
// Kernels (all launched by flash_bwd_launch.cu):
//   flash_bwd_mma_sync_kernel     column-parallel: one CTA per (key block of kBlockN columns, kv
//                                 head, batch). Its block summary (mask min/max, block_summary.cuh)
//                                 sits in registers; a query-tile scheduler classifies every query
//                                 tile of the column with fm3::classify_tile/apply_block_mask
//                                 (mask.h) and compacts the survivors, so a fully masked tile is
//                                 never loaded; partial tiles get the per-element mask
//                                 (fm3::visible), unmasked ones none. dK and dV accumulate in
//                                 registers over every query head of the GQA group and every
//                                 surviving tile; dQ is added in fp32 with atomics into a workspace
//                                 (kAtomicDq) or left to the row-parallel pass.
//   flash_bwd_dq_mma_sync_kernel  deterministic dQ: row-parallel, one CTA per query tile, walking
//                                 its surviving key blocks in ascending order and accumulating dQ in
//                                 registers (no atomics, bitwise repeatable; recomputes S and dP).
//
// Per (query tile, key block) of kBlockM x kBlockN, with 8 warps:
//   S = Q K^T and dP = dO V^T     warps 4 (rows) x 2 (columns)
//   P = exp2(S * scale * log2e - lse2), dS = P * (dP - delta)  -> shared (T)
//   dV += P^T dO, dK += dS^T Q    warps over (keys, head dim), A from P/dS^T
//   dQ  = dS K                    warps 4 (rows) x 2 (head dim)
// softmax_scale is applied once to dK (epilogue) and dQ (conversion).
#pragma once
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"
#include "bwd/common.cuh"  // BwdArgs, classify_pair, mask_head
#include "fm3/mask.h"
#include "fm3_generated_config.h"  // kSm90SmemLimit
#include "mask_scheduler.cuh"  // compact_window
#include "mma_sync/tile_load.cuh"  // swz, load_tile
#include "warp_primitives.cuh"

namespace fm3::hopper::mma_sync {

template <typename T, int kHeadDim_, int kBlockM_, int kBlockN_>
struct BwdMmaSyncTraits {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kBlockM == 64, "the warp layouts below assume 64 query rows (4 warp rows of 16)");
  static_assert(kHeadDim % 64 == 0 && kBlockN % 64 == 0, "swizzled rows need >= 8 16-byte chunks");
  // S / dP: 4 warp rows x kAWarpsN warp columns.
  static constexpr int kAWarpsN = kWarps / (kBlockM / 16);
  static constexpr int kACols = kBlockN / kAWarpsN;
  static constexpr int kATiles = kACols / 8;
  // dK / dV: kCWarpsN warps over keys (16 each) x kCWarpsD over the head dim.
  static constexpr int kCWarpsN = kBlockN / 16;
  static constexpr int kCWarpsD = kWarps / kCWarpsN;
  static constexpr int kCCols = kHeadDim / kCWarpsD;
  static constexpr int kCTiles = kCCols / 8;
  // dQ: 4 warp rows x kDWarpsD over the head dim.
  static constexpr int kDWarpsD = kWarps / (kBlockM / 16);
  static constexpr int kDCols = kHeadDim / kDWarpsD;
  static constexpr int kDTiles = kDCols / 8;
  static_assert(kATiles % 2 == 0 && kCTiles % 2 == 0 && kDTiles % 2 == 0, "ldmatrix.x4 pairs of n8 tiles");
  static_assert(kCWarpsN * kCWarpsD == kWarps, "dK/dV warp grid");

  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKElems = kBlockN * kHeadDim;
  static constexpr int kPElems = kBlockM * kBlockN;
  // Integer area: normalized column bounds (int4 per key column), scheduler list and warp counts.
  static constexpr size_t kIntBytes = sizeof(int32_t) * (4 * kBlockN + kThreads + 32);
  // Column-parallel kernel: K, V, 2 stages of Q and dO, P, dS.
  static constexpr size_t kColTileBytes = sizeof(T) * (2 * kKElems + 4 * kQElems + 2 * kPElems);
  static constexpr size_t kColSmem = kColTileBytes + kIntBytes;
  // Row-parallel dQ kernel: Q, dO, 2 stages of K and V, dS.
  static constexpr size_t kRowTileBytes = sizeof(T) * (2 * kQElems + 4 * kKElems + kPElems);
  static constexpr size_t kRowSmem = kRowTileBytes + kIntBytes;
  static_assert(kColSmem <= kSm90SmemLimit && kRowSmem <= kSm90SmemLimit,
                "tile config exceeds the shared memory per block");
};

// Normalized bounds of key columns [n0, n0 + kBlockN) into sCB (int4 each);
// columns past seqlen_k or without a mask get the empty interval pair.
template <int kBlockN, int kThreads>
__device__ __forceinline__ void stage_columns(int4* sCB, const int32_t* sri, int n0, const bwd::BwdArgs& a,
                                              int causal_offset) {
  for (int c = threadIdx.x; c < kBlockN; c += kThreads) {
    const int col = n0 + c;
    ColumnBounds cb{a.seqlen_q, a.seqlen_q, 0, 0};
    if (sri != nullptr && col < a.seqlen_k)
      cb = load_column(sri + static_cast<int64_t>(col) * a.mask_cols, col, a.mask_cols, a.causal, a.seqlen_q,
                       causal_offset);
    sCB[c] = make_int4(cb.lts, cb.lte, cb.uts, cb.ute);
  }
}

// ---------------------------------------------------------------------------
// Tile math shared by the column- and row-parallel kernels.

// S = Q K^T and dP = dO V^T for this warp's 16 rows x kACols columns.
template <class Tr, typename T>
__device__ __forceinline__ void compute_s_dp(const T* sQ, const T* sdO, const T* sK, const T* sV,
                                             float (&s)[Tr::kATiles][4], float (&dp)[Tr::kATiles][4]) {
  constexpr int D = Tr::kHeadDim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % (Tr::kBlockM / 16), wn = warp / (Tr::kBlockM / 16);
#pragma unroll
  for (int j = 0; j < Tr::kATiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll 1  // k steps rolled: keeps the fragments of one step live, not all
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t aq[4], ado[4];
    const int arow = wm * 16 + (lane % 8) + ((lane / 8) % 2) * 8, achunk = ks * 2 + lane / 16;
    ldmatrix_x4(aq, smem_u32(sQ + swz<D>(arow, achunk)));
    ldmatrix_x4(ado, smem_u32(sdO + swz<D>(arow, achunk)));
#pragma unroll
    for (int j = 0; j < Tr::kATiles; j += 2) {
      const int brow = wn * Tr::kACols + j * 8 + (lane % 8) + (lane / 16) * 8, bchunk = ks * 2 + (lane / 8) % 2;
      uint32_t bk[4], bv[4];
      ldmatrix_x4(bk, smem_u32(sK + swz<D>(brow, bchunk)));
      ldmatrix_x4(bv, smem_u32(sV + swz<D>(brow, bchunk)));
      Mma<T>::run(s[j], aq, bk[0], bk[1]);
      Mma<T>::run(s[j + 1], aq, bk[2], bk[3]);
      Mma<T>::run(dp[j], ado, bv[0], bv[1]);
      Mma<T>::run(dp[j + 1], ado, bv[2], bv[3]);
    }
  }
}

// P and dS of this warp's fragment, written to shared memory as T ([kBlockM][kBlockN],
// swizzled). Masked elements (partial tiles only) get P = 0. lse2 = +inf rows
// (fully masked or past seqlen_q) get P = 0 as well.
template <class Tr, typename T, bool kWriteP>
__device__ __forceinline__ void compute_p_ds(float (&s)[Tr::kATiles][4], const float (&dp)[Tr::kATiles][4],
                                             T* sP, T* sdS, const int4* sCB, const bwd::BwdArgs& a, const float* lse2,
                                             const float* delta, int m0, int n0, bool partial, const int32_t* bm,
                                             int causal_offset) {
  constexpr int N = Tr::kBlockN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = warp % (Tr::kBlockM / 16), wn = warp / (Tr::kBlockM / 16);
  float l2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + wm * 16 + g + r * 8;
    const bool ok = row < a.seqlen_q;
    l2[r] = ok ? lse2[row] : CUDART_INF_F;
    dl[r] = ok ? delta[row] : 0.f;
  }
  if (partial) {
#pragma unroll
    for (int j = 0; j < Tr::kATiles; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int cl = wn * Tr::kACols + j * 8 + 2 * t + c, col = n0 + cl;
        const int4 b4 = sCB[cl];
        const ColumnBounds cb{b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = m0 + wm * 16 + g + r * 8;
          if (col >= a.seqlen_k || !visible(cb, row, col, a.causal, causal_offset, bm, a.bm_cols))
            s[j][2 * r + c] = -CUDART_INF_F;
        }
      }
  }
#pragma unroll
  for (int j = 0; j < Tr::kATiles; ++j) {
    const int chunk = (wn * Tr::kACols) / 8 + j;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int rl = wm * 16 + g + r * 8;
      const float p0 = fast_exp2(s[j][2 * r] * a.scale_log2 - l2[r]);
      const float p1 = fast_exp2(s[j][2 * r + 1] * a.scale_log2 - l2[r]);
      const float ds0 = p0 * (dp[j][2 * r] - dl[r]);
      const float ds1 = p1 * (dp[j][2 * r + 1] - dl[r]);
      const int off = swz<N>(rl, chunk) + 2 * t;
      if constexpr (kWriteP) *reinterpret_cast<uint32_t*>(sP + off) = Mma<T>::pack(p0, p1);
      *reinterpret_cast<uint32_t*>(sdS + off) = Mma<T>::pack(ds0, ds1);
    }
  }
}

// dV += P^T dO and dK += dS^T Q for this warp's 16 keys x kCCols head-dim columns.
template <class Tr, typename T>
__device__ __forceinline__ void update_dk_dv(const T* sP, const T* sdS, const T* sQ, const T* sdO,
                                             float (&dk)[Tr::kCTiles][4], float (&dv)[Tr::kCTiles][4]) {
  constexpr int D = Tr::kHeadDim, N = Tr::kBlockN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wn = warp % Tr::kCWarpsN, wd = warp / Tr::kCWarpsN;
#pragma unroll 1  // k steps rolled: keeps the fragments of one step live, not all
  for (int ks = 0; ks < Tr::kBlockM / 16; ++ks) {
    // A = P^T (keys x queries) read transposed from P [queries][keys]
    uint32_t ap[4], ads[4];
    const int arow = ks * 16 + (lane % 8) + (lane / 16) * 8, achunk = wn * 2 + (lane / 8) % 2;
    ldmatrix_x4_trans(ap, smem_u32(sP + swz<N>(arow, achunk)));
    ldmatrix_x4_trans(ads, smem_u32(sdS + swz<N>(arow, achunk)));
#pragma unroll
    for (int d = 0; d < Tr::kCTiles; d += 2) {
      // B = dO / Q [queries][head dim], k = queries
      const int brow = ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8, bchunk = wd * (Tr::kCCols / 8) + d + lane / 16;
      uint32_t bdo[4], bq[4];
      ldmatrix_x4_trans(bdo, smem_u32(sdO + swz<D>(brow, bchunk)));
      ldmatrix_x4_trans(bq, smem_u32(sQ + swz<D>(brow, bchunk)));
      Mma<T>::run(dv[d], ap, bdo[0], bdo[1]);
      Mma<T>::run(dv[d + 1], ap, bdo[2], bdo[3]);
      Mma<T>::run(dk[d], ads, bq[0], bq[1]);
      Mma<T>::run(dk[d + 1], ads, bq[2], bq[3]);
    }
  }
}

// acc += dS K for this warp's 16 query rows x kDCols head-dim columns.
template <class Tr, typename T>
__device__ __forceinline__ void accumulate_dq(const T* sdS, const T* sK, float (&acc)[Tr::kDTiles][4]) {
  constexpr int D = Tr::kHeadDim, N = Tr::kBlockN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % (Tr::kBlockM / 16), wd = warp / (Tr::kBlockM / 16);
#pragma unroll 1  // k steps rolled: keeps the fragments of one step live, not all
  for (int ks = 0; ks < N / 16; ++ks) {
    uint32_t a4[4];
    const int arow = wm * 16 + (lane % 8) + ((lane / 8) % 2) * 8, achunk = ks * 2 + lane / 16;
    ldmatrix_x4(a4, smem_u32(sdS + swz<N>(arow, achunk)));
#pragma unroll
    for (int d = 0; d < Tr::kDTiles; d += 2) {
      const int brow = ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8, bchunk = wd * (Tr::kDCols / 8) + d + lane / 16;
      uint32_t b4[4];
      ldmatrix_x4_trans(b4, smem_u32(sK + swz<D>(brow, bchunk)));
      Mma<T>::run(acc[d], a4, b4[0], b4[1]);
      Mma<T>::run(acc[d + 1], a4, b4[2], b4[3]);
    }
  }
}

// ---------------------------------------------------------------------------
// Column-parallel main kernel: grid (n_kblocks, num_heads_k, batch).
template <typename T, int kHeadDim, int kBlockM, int kBlockN, bool kAtomicDq>
__global__ void __launch_bounds__(BwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>::kThreads, 1)
    flash_bwd_mma_sync_kernel(const __grid_constant__ bwd::BwdArgs a) {
  using Tr = BwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>;
  constexpr int kThreads = Tr::kThreads, D = kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Tr::kKElems;
  T* sQ = sV + Tr::kKElems;      // 2 stages
  T* sdO = sQ + 2 * Tr::kQElems;  // 2 stages
  T* sP = sdO + 2 * Tr::kQElems;
  T* sdS = sP + Tr::kPElems;
  int4* sCB = reinterpret_cast<int4*>(smem_raw + Tr::kColTileBytes);
  int* sList = reinterpret_cast<int*>(sCB + kBlockN);
  int* sWarpCounts = sList + kThreads;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int n0 = nb * kBlockN;
  const int group = a.num_heads / a.num_heads_k;
  const int n_mtiles = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_kblocks = (a.seqlen_k + kBlockN - 1) / kBlockN;
  const int causal_offset = causal_offset_of(a.seqlen_q, a.seqlen_k);

  const T* kg = static_cast<const T*>(a.k) + b * a.k_bs + hk * a.k_hs;
  const T* vg = static_cast<const T*>(a.v) + b * a.v_bs + hk * a.v_hs;
  load_tile<T, D, kBlockN, kThreads>(sK, kg, a.k_rs, n0, a.seqlen_k - n0);
  load_tile<T, D, kBlockN, kThreads>(sV, vg, a.v_rs, n0, a.seqlen_k - n0);
  cp_async_commit();

  float dk[Tr::kCTiles][4], dv[Tr::kCTiles][4];
#pragma unroll
  for (int i = 0; i < Tr::kCTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  int staged_hm = -1;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const int hm = bwd::mask_head(a, h);
    const int64_t bhm = static_cast<int64_t>(b) * a.mask_heads + hm;
    const int32_t* sri = a.sri ? a.sri + bhm * a.seqlen_k * a.mask_cols : nullptr;
    const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
    const BlockSummary summ = a.summary ? a.summary[bhm * n_kblocks + nb] : no_mask_summary(a.seqlen_q);
    if (hm != staged_hm) {  // the previous head's last tile ended with __syncthreads
      stage_columns<kBlockN, kThreads>(sCB, sri, n0, a, causal_offset);
      staged_hm = hm;  // visible after the scheduler's barriers
    }
    const T* qg = static_cast<const T*>(a.q) + b * a.q_bs + h * a.q_hs;
    const T* dog = static_cast<const T*>(a.dout) + b * a.o_bs + h * a.o_hs;
    const int64_t bh = static_cast<int64_t>(b) * a.num_heads + h;
    const float* lse2 = a.lse2 + bh * a.lse_stride;
    const float* delta = a.delta + bh * a.lse_stride;
    auto classify = [&](int mt) {
      return bwd::classify_pair(summ, bm, a.bm_cols, mt * kBlockM, kBlockM, n0, kBlockN, a.seqlen_q, a.seqlen_k,
                           a.causal, causal_offset);
    };
    auto load_q = [&](int entry, int stage) {
      const int m0 = BlockEntry::block(entry) * kBlockM;
      load_tile<T, D, kBlockM, kThreads>(sQ + stage * Tr::kQElems, qg, a.q_rs, m0, a.seqlen_q - m0);
      load_tile<T, D, kBlockM, kThreads>(sdO + stage * Tr::kQElems, dog, a.o_rs, m0, a.seqlen_q - m0);
      cp_async_commit();
    };
    for (int first = 0; first < n_mtiles; first += kThreads) {
      const int count = compact_window<kThreads>(classify, first, n_mtiles, sList, sWarpCounts);
      if (count == 0) continue;
      load_q(sList[0], 0);
      for (int i = 0; i < count; ++i) {
        const int entry = sList[i], stage = i & 1;
        const int m0 = BlockEntry::block(entry) * kBlockM;
        const bool partial = BlockEntry::partial(entry);
        load_next_wait_current(sList, i, count, stage, load_q);
        __syncthreads();
        const T* sQs = sQ + stage * Tr::kQElems;
        const T* sdOs = sdO + stage * Tr::kQElems;
        {
          float s[Tr::kATiles][4], dp[Tr::kATiles][4];
          compute_s_dp<Tr, T>(sQs, sdOs, sK, sV, s, dp);
          compute_p_ds<Tr, T, true>(s, dp, sP, sdS, sCB, a, lse2, delta, m0, n0, partial, bm, causal_offset);
        }
        __syncthreads();
        update_dk_dv<Tr, T>(sP, sdS, sQs, sdOs, dk, dv);
        if constexpr (kAtomicDq) {
          float acc[Tr::kDTiles][4];
#pragma unroll
          for (int i2 = 0; i2 < Tr::kDTiles; ++i2)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i2][e] = 0.f;
          accumulate_dq<Tr, T>(sdS, sK, acc);
          const int wm = warp % (kBlockM / 16), wd = warp / (kBlockM / 16);
          float* dqa = a.dq_accum + bh * a.seqlen_q * D;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = m0 + wm * 16 + g + r * 8;
            if (row < a.seqlen_q) {
              float* dst = dqa + static_cast<int64_t>(row) * D + wd * Tr::kDCols + 2 * t;
#pragma unroll
              for (int d = 0; d < Tr::kDTiles; ++d)
                atomicAdd(reinterpret_cast<float2*>(dst + d * 8), make_float2(acc[d][2 * r], acc[d][2 * r + 1]));
            }
          }
        }
        __syncthreads();  // stage, sP and sdS may be refilled next iteration
      }
    }
  }
  cp_async_wait<0>();  // a CTA with no surviving tile still waits for its K/V copy

  // Epilogue: dK * softmax_scale and dV, 4-byte stores of this warp's 16 keys.
  const int wn = warp % Tr::kCWarpsN, wd = warp / Tr::kCWarpsN;
  T* dkg = static_cast<T*>(a.dk) + b * a.k_bs + hk * a.k_hs;
  T* dvg = static_cast<T*>(a.dv) + b * a.v_bs + hk * a.v_hs;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = n0 + wn * 16 + g + r * 8;
    if (row < a.seqlen_k) {
#pragma unroll
      for (int d = 0; d < Tr::kCTiles; ++d) {
        const int col = wd * Tr::kCCols + d * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(dkg + static_cast<int64_t>(row) * a.k_rs + col) =
            Mma<T>::pack(dk[d][2 * r] * a.scale, dk[d][2 * r + 1] * a.scale);
        *reinterpret_cast<uint32_t*>(dvg + static_cast<int64_t>(row) * a.v_rs + col) =
            Mma<T>::pack(dv[d][2 * r], dv[d][2 * r + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Deterministic dQ, row-parallel: grid (n_mtiles, num_heads, batch).
template <typename T, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(BwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>::kThreads, 1)
    flash_bwd_dq_mma_sync_kernel(const __grid_constant__ bwd::BwdArgs a) {
  using Tr = BwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>;
  constexpr int kThreads = Tr::kThreads, D = kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + Tr::kQElems;
  T* sK = sdO + Tr::kQElems;      // 2 stages
  T* sV = sK + 2 * Tr::kKElems;   // 2 stages
  T* sdS = sV + 2 * Tr::kKElems;
  int4* sCB = reinterpret_cast<int4*>(smem_raw + Tr::kRowTileBytes);
  int* sList = reinterpret_cast<int*>(sCB + kBlockN);
  int* sWarpCounts = sList + kThreads;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = mt * kBlockM;
  const int hk = h / (a.num_heads / a.num_heads_k);
  const int n_kblocks = (a.seqlen_k + kBlockN - 1) / kBlockN;
  const int causal_offset = causal_offset_of(a.seqlen_q, a.seqlen_k);
  const int hm = bwd::mask_head(a, h);
  const int64_t bhm = static_cast<int64_t>(b) * a.mask_heads + hm;
  const int32_t* sri = a.sri ? a.sri + bhm * a.seqlen_k * a.mask_cols : nullptr;
  const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
  const BlockSummary* summ = a.summary ? a.summary + bhm * n_kblocks : nullptr;
  const int64_t bh = static_cast<int64_t>(b) * a.num_heads + h;
  const float* lse2 = a.lse2 + bh * a.lse_stride;
  const float* delta = a.delta + bh * a.lse_stride;

  const T* qg = static_cast<const T*>(a.q) + b * a.q_bs + h * a.q_hs;
  const T* dog = static_cast<const T*>(a.dout) + b * a.o_bs + h * a.o_hs;
  const T* kg = static_cast<const T*>(a.k) + b * a.k_bs + hk * a.k_hs;
  const T* vg = static_cast<const T*>(a.v) + b * a.v_bs + hk * a.v_hs;
  load_tile<T, D, kBlockM, kThreads>(sQ, qg, a.q_rs, m0, a.seqlen_q - m0);
  load_tile<T, D, kBlockM, kThreads>(sdO, dog, a.o_rs, m0, a.seqlen_q - m0);
  cp_async_commit();

  float acc[Tr::kDTiles][4];
#pragma unroll
  for (int i = 0; i < Tr::kDTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;

  auto classify = [&](int nb) {
    const BlockSummary s = summ ? summ[nb] : no_mask_summary(a.seqlen_q);
    return bwd::classify_pair(s, bm, a.bm_cols, m0, kBlockM, nb * kBlockN, kBlockN, a.seqlen_q, a.seqlen_k, a.causal,
                         causal_offset);
  };
  auto load_kv = [&](int entry, int stage) {
    const int n0 = BlockEntry::block(entry) * kBlockN;
    load_tile<T, D, kBlockN, kThreads>(sK + stage * Tr::kKElems, kg, a.k_rs, n0, a.seqlen_k - n0);
    load_tile<T, D, kBlockN, kThreads>(sV + stage * Tr::kKElems, vg, a.v_rs, n0, a.seqlen_k - n0);
    cp_async_commit();
  };
  for (int first = 0; first < n_kblocks; first += kThreads) {
    const int count = compact_window<kThreads>(classify, first, n_kblocks, sList, sWarpCounts);
    if (count == 0) continue;
    load_kv(sList[0], 0);
    for (int i = 0; i < count; ++i) {
      const int entry = sList[i], stage = i & 1;
      const int n0 = BlockEntry::block(entry) * kBlockN;
      const bool partial = BlockEntry::partial(entry);
      if (partial) stage_columns<kBlockN, kThreads>(sCB, sri, n0, a, causal_offset);
      load_next_wait_current(sList, i, count, stage, load_kv);
      __syncthreads();
      const T* sKs = sK + stage * Tr::kKElems;
      const T* sVs = sV + stage * Tr::kKElems;
      {
        float s[Tr::kATiles][4], dp[Tr::kATiles][4];
        compute_s_dp<Tr, T>(sQ, sdO, sKs, sVs, s, dp);
        compute_p_ds<Tr, T, false>(s, dp, nullptr, sdS, sCB, a, lse2, delta, m0, n0, partial, bm, causal_offset);
      }
      __syncthreads();
      accumulate_dq<Tr, T>(sdS, sKs, acc);
      __syncthreads();  // stage, sdS and sCB may be refilled next iteration
    }
  }
  cp_async_wait<0>();

  const int wm = warp % (kBlockM / 16), wd = warp / (kBlockM / 16);
  T* dqg = static_cast<T*>(a.dq) + b * a.q_bs + h * a.q_hs;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + wm * 16 + g + r * 8;
    if (row < a.seqlen_q) {
#pragma unroll
      for (int d = 0; d < Tr::kDTiles; ++d) {
        const int col = wd * Tr::kDCols + d * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(dqg + static_cast<int64_t>(row) * a.q_rs + col) =
            Mma<T>::pack(acc[d][2 * r] * a.scale, acc[d][2 * r + 1] * a.scale);
      }
    }
  }
}

}  // namespace fm3::hopper::mma_sync
