// Backward WGMMA kernel (bwd/kernel.cuh): the consumers at head dims 192 and 256
// (BwdWgmmaTraits::kSplitD), two warpgroups on 64 x 64 tiles that share the key block's 64 keys and
// split the rest (the FlashAttention-3 shape at 256: a warpgroup's dK and dV over all the columns
// would take 192 / 256 registers per thread). Per query tile of the ring, warpgroup cw:
//   S^T, dP^T for its 32 queries [32 cw, 32 cw + 32): 64 keys x 32 queries, K = the head dim
//     (D for S^T, D_v for dP^T)
//   P^T, dS^T (fp32, masked per element on partial tiles) into shared memory as bf16/fp16 halves of
//     the [keys][queries] tiles (both warpgroups' halves behind a named barrier)
//   dV += P^T dO for its C_v = D_v / 2 columns [C_v cw, C_v cw + C_v), dK += dS^T Q for its
//     C = D / 2 columns [C cw, C cw + C) (A from shared memory: P^T / dS^T, K-major; B = dO / Q,
//     MN-major)
//   dQ = dS K for its C columns (A = dS^T, MN-major; B = K, MN-major), handed to the dQ writer
// The Q / dO stage is handed back once dV and dK have read it, while dQ runs. One dS^T / P^T buffer
// (the 227 KiB hold no second one at this head dim): a second named barrier keeps a tile's stores
// behind both warpgroups' reads of the previous tile.
#pragma once
#include <stdint.h>

#include <type_traits>  // std::integral_constant

#include "attn_args.h"  // BwdArgs
#include "bwd/consumer_ring.cuh"
#include "bwd/epilogue.cuh"
#include "bwd/pointwise.cuh"
#include "bwd/trace.cuh"
#include "bwd/traits.cuh"
#include "fm3/mask.h"      // ColumnBounds
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack, fast_exp2

namespace fm3::hopper::sm90 {

// Calls gemm(n, off, byte_offset) for the pieces of warpgroup kCw's kCols columns of a
// 128-byte-swizzled MN-major operand (B of dV, dK, dQ) whose 64-column sub-tiles lie kSubBytes apart,
// in the order of its accumulators (BwdWgmmaTraits::acc_col): a WGMMA of N = n columns at
// byte_offset into the operand, on the accumulators [off, off + n / 2). A WGMMA that starts at a
// sub-tile's first column may run on into the next ones (the descriptor's leading byte offset); one
// that starts inside a sub-tile (warpgroup 1's first 32 columns at 192) must end with it, or its
// rows would run into the next row.
template <class Tr, int kCols, int kCw, uint32_t kSubBytes, class F>
__device__ __forceinline__ void for_col_pieces(F&& gemm) {
  using std::integral_constant;
  constexpr int kWhole = Tr::split_whole_cols(kCols, kCw), kHalf = kCols - kWhole;
  constexpr int kWholeCol = Tr::split_whole_col(kCols, kCw), kHalfCol = Tr::split_half_col(kCols, kCw);
  static_assert(kWhole % 64 == 0 && kHalf % 32 == 0 && kHalf < 64, "whole sub-tiles, then a half");
  if constexpr (kWhole > 0)
    gemm(integral_constant<int, kWhole>{}, integral_constant<int, 0>{}, (kWholeCol / 64) * kSubBytes);
  if constexpr (kHalf > 0)
    gemm(integral_constant<int, kHalf>{}, integral_constant<int, kWhole / 2>{},
         (kHalfCol / 64) * kSubBytes + (kHalfCol % 64) * 2);
}

// Warpgroup kCw's kCols dQ columns (dq in the order of BwdWgmmaTraits::acc_col) to the dQ tile in
// shared memory in the workspace's accumulator order (bwd::dq_tile_offset: 8-column group G of the
// tile in 64-column part G / 8), moved by `sub0` parts; wq: the warp in the warpgroup.
template <class Tr, int kCols, int kCw, int N>
__device__ __forceinline__ void store_dq_split(const BwdSmem<Tr>& sm, const float (&dq)[N], int sub0, int wq, int lane) {
  float* dst = reinterpret_cast<float*>(sm.base + Tr::kOffdQ) + sub0 * 4096 + wq * 8 * 128 + lane * 4;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const int group = Tr::acc_col(kCols, kCw, j) / 8;
    *reinterpret_cast<float4*>(dst + (group / 8) * 4096 + (group % 8) * 128) =
        make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
  }
}

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__device__ __forceinline__ void bwd_consumer_split_d(const bwd::BwdArgs& a,
                                                     const BwdSmem<BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>>& sm,
                                                     const BwdBlock& blk, int tid, int warp, int lane, int wg) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>;
  static_assert(Tr::kSplitD && kBlockM == 64 && kBlockN == 64 && Tr::kConsumerWGs == 2, "the split-D consumers");
  constexpr int kQw = kBlockM / 2;   // S^T / dP^T queries per warpgroup
  constexpr int kS = kQw / 2;        // S^T / dP^T accumulators per thread (64 x 32)
  constexpr int kCols = Tr::kDkCols;    // dK / dQ columns per warpgroup (96, 128)
  constexpr int kColsV = Tr::kDvCols;   // dV columns per warpgroup (64 at MLA's 192 / 128)
  constexpr int kPtOff = kBlockN * kBlockM * 2;  // P^T after dS^T in the buffer
  const int cw = wg - 1;
  const int wq = warp % 4;  // warp within the warpgroup: 16 keys (S^T rows) / 16 queries (dQ rows)
  const int g = lane / 4, t = lane % 4;
  const int key_local = wq * 16 + g;  // this thread's keys: key_local and key_local + 8
  BwdConsumerRing<Tr> ring;
  // Operand descriptors, built once; a tile's operands are these moved by constant byte offsets.
  const SmemDesc dsc_k = smem_desc(sm.sK, 16, 1024);  // A of S^T: K [keys][head dim], K-major
  const SmemDesc dsc_v = smem_desc(sm.sV, 16, 1024);
  const SmemDesc dsc_q = smem_desc(sm.sQ + cw * kQw * 128, 16, 1024);  // B of S^T: this warpgroup's queries
  const SmemDesc dsc_do = smem_desc(sm.sdO + cw * kQw * 128, 16, 1024);
  const SmemDesc dsc_ds = smem_desc(sm.sdS, 16, 1024);  // dS^T / P^T [keys][queries]: A of dK, dV (K-major), dQ (MN-major)
  float dk[Tr::kDkRegs], dv[Tr::kDvRegs];
#pragma unroll
  for (int i = 0; i < Tr::kDkRegs; ++i) dk[i] = 0.f;
#pragma unroll
  for (int i = 0; i < Tr::kDvRegs; ++i) dv[i] = 0.f;

  // Where both warpgroups lay out their dK and dV columns alike (256), one code with this
  // warpgroup's first sub-tile at run time (sub0, sub0v); else (192, 192/128) each its own, kCw (the products below take the warpgroup as
  // First / Second; one dispatch helper for the three made ptxas spill more, so each is spelled out).
  constexpr bool kSameLayout = kCols % 64 == 0 && kColsV % 64 == 0;
  const int sub0 = kSameLayout ? cw * (kCols / 64) : 0, sub0v = kSameLayout ? cw * (kColsV / 64) : 0;
  const SmemDesc dsc_q_mn = smem_desc(sm.sQ + sub0 * kBlockM * 128, kBlockM * 128, 1024);  // B of dK (dO: dV, K: dQ)
  const SmemDesc dsc_do_mn = smem_desc(sm.sdO + sub0v * kBlockM * 128, kBlockM * 128, 1024);
  const SmemDesc dsc_k_mn = smem_desc(sm.sK + sub0 * kBlockN * 128, kBlockN * 128, 1024);
  // Warpgroup kCw's columns (for_col_pieces), moved by sub0 (sub0v) sub-tiles: dV += P^T dO and dK += dS^T Q
  // (k16 step = 16 queries: 32 bytes along the rows of P^T / dS^T, 16 rows of dO / Q); dQ = dS K
  // (k16 step = 16 keys: 16 rows of dS^T and K); the dQ part to shared memory for the writer warp
  // (store_dq_split).
  auto dkdv_products = [&](auto cw_c, uint32_t qoff, uint32_t dooff) {
    constexpr int kCw = decltype(cw_c)::value;
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks)
      for_col_pieces<Tr, kColsV, kCw, kBlockM * 128>([&](auto n, auto off, uint32_t col) {
        gmma_ss_kmn<T, decltype(n)::value, decltype(off)::value>(
            dsc_ds.at(kPtOff + ks * 32), dsc_do_mn.at(dooff + ks * 2048 + col), dv, true);
      });
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks)
      for_col_pieces<Tr, kCols, kCw, kBlockM * 128>([&](auto n, auto off, uint32_t col) {
        gmma_ss_kmn<T, decltype(n)::value, decltype(off)::value>(
            dsc_ds.at(ks * 32), dsc_q_mn.at(qoff + ks * 2048 + col), dk, true);
      });
  };
  auto dq_product = [&](auto cw_c, auto& dq) {
    constexpr int kCw = decltype(cw_c)::value;
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks)
      for_col_pieces<Tr, kCols, kCw, kBlockN * 128>([&](auto n, auto off, uint32_t col) {
        gmma_ss_mn<T, decltype(n)::value, decltype(off)::value>(
            dsc_ds.at(ks * 2048), dsc_k_mn.at(ks * 2048 + col), dq, ks > 0);
      });
  };
  using First = std::integral_constant<int, 0>;
  using Second = std::integral_constant<int, 1>;

  mbar_wait(sm.bar_kv, 0);
  const bool tracer = tid == 128;  // bwd/trace.cuh, with -DFM3_BWD_TRACE
  bwd_trace(kTraceKvReady, tracer);
  for (;;) {
    int m0;
    bool partial;
    if (!ring.next(a, sm, blk, key_local, m0, partial)) break;
    bwd_trace(kTraceFirstTile, tracer && ring.dq_count == 0);
    const int stage = ring.q.stage;
    const ColumnBounds* cb = ring.cb;
    const uint32_t qoff = stage * Tr::kQBytes, dooff = stage * Tr::kdOBytes;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 32 queries.
    float s[kS], dp[kS];
    gmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;  // k16 step within the 128-byte row
      gmma_ss<T, kQw>(dsc_k.at((ks / 4) * kBlockN * 128 + off), dsc_q.at(qoff + (ks / 4) * kBlockM * 128 + off), s,
                      ks > 0);
    }
    gmma_commit();
#pragma unroll
    for (int ks = 0; ks < kHeadDimV / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;
      gmma_ss<T, kQw>(dsc_v.at((ks / 4) * kBlockN * 128 + off), dsc_do.at(dooff + (ks / 4) * kBlockM * 128 + off), dp,
                      ks > 0);
    }
    gmma_commit();
    // This thread's queries: ql = 32 cw + 8 j + 2t + c (accumulator s[4 j + 2 r + c], key key_local + 8 r).
    const float* lse_t = sm.lse + stage * kBlockM + cw * kQw;
    const float* delta_t = sm.delta + stage * kBlockM + cw * kQw;
    float2 l2[kQw / 8], dlt[kQw / 8];
#pragma unroll
    for (int j = 0; j < kQw / 8; ++j) l2[j] = *reinterpret_cast<const float2*>(lse_t + j * 8 + 2 * t);
    gmma_wait<1>();
    fence_regs(s);
    auto lse2_of = [&](int j) { return l2[j]; };
    if (partial)
      bwd_p_from_s<kQw, true>(s, lse2_of, a.scale_log2, cb, m0 + cw * kQw, t);
    else
      bwd_p_from_s<kQw, false>(s, lse2_of, a.scale_log2, cb, m0 + cw * kQw, t);
#pragma unroll
    for (int j = 0; j < kQw / 8; ++j) dlt[j] = *reinterpret_cast<const float2*>(delta_t + j * 8 + 2 * t);
    gmma_wait<0>();
    fence_regs(dp);
    bwd_ds_from_dp<kQw>(dp, s, [&](int j) { return dlt[j]; }, t);
    // Both warpgroups have read the buffer for the previous tile (each waited for its products
    // before coming here); then this warpgroup's halves of dS^T and P^T: rows key_local (+8), 16-byte
    // chunk 4 cw + j of the 128-byte row, XOR-swizzled by (key % 8) as TMA would write it.
    named_barrier_sync(7, 128 * Tr::kConsumerWGs);
    unsigned char* ds_dst = sm.base + Tr::kOffdS;
#pragma unroll
    for (int j = 0; j < kQw / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = key_local + 8 * r, chunk = cw * (kQw / 8) + j;
        const int off = swizzle128(row, chunk) + 4 * t;
        *reinterpret_cast<uint32_t*>(ds_dst + off) = Mma<T>::pack(dp[j * 4 + 2 * r], dp[j * 4 + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(ds_dst + kPtOff + off) = Mma<T>::pack(s[j * 4 + 2 * r], s[j * 4 + 2 * r + 1]);
      }
    fence_proxy_async();                                   // the stores above are read by WGMMA (async proxy)
    named_barrier_sync(6, 128 * Tr::kConsumerWGs);  // both halves written

    // dV, dK, then dQ over this warpgroup's columns.
    gmma_fence();
    if (kSameLayout || cw == 0)
      dkdv_products(First{}, qoff, dooff);
    else
      dkdv_products(Second{}, qoff, dooff);
    gmma_commit();
    float dq[kCols / 2];
    if (kSameLayout || cw == 0)
      dq_product(First{}, dq);
    else
      dq_product(Second{}, dq);
    gmma_commit();
    gmma_wait<1>();  // dV, dK done: Q, dO, lse2, delta of this stage are no longer read
    fence_regs(dk);
    fence_regs(dv);
    ring.release(sm);
    gmma_wait<0>();
    fence_regs(dq);
    ring.wait_dq_buffer(sm);
    if (kSameLayout || cw == 0)
      store_dq_split<Tr, kCols, 0>(sm, dq, sub0, wq, lane);
    else
      store_dq_split<Tr, kCols, 1>(sm, dq, sub0, wq, lane);
    fence_proxy_async();  // read by the bulk reduction (async proxy)
    ring.hand_dq(sm, (ring.head_off + m0) * Tr::kTileDim, cw == 0 && wq == 0 && lane == 0);
  }

  bwd_trace(kTraceLoopEnd, tracer);
  bwd_trace_tiles(ring.dq_count, tracer);
  ring.wait_dq_buffer(sm);  // the end of the dQ stream
  ring.hand_dq(sm, -1, cw == 0 && wq == 0 && lane == 0);

  bwd_epilogue<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>(a, sm, dk, dv, blk, tid, key_local, cw, t);
  bwd_trace(kTraceEpilogueDone, tracer);
}

}  // namespace fm3::hopper::sm90
