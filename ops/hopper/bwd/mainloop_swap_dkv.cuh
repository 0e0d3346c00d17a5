// Backward WGMMA kernel (bwd/kernel.cuh): the consumers at head dims 192 and 192 / 128 on 64 x 96
// tiles (BwdWgmmaTraits::kSwapDkv; FlashAttention-4's dKV_swapAB shape there). Two warpgroups, each
// with 48 of the block's 96 keys for S, dP, dK and dV and 96 of the head dim's columns for dQ. Per
// query tile of the ring, warpgroup cw (keys [48 cw, 48 cw + 48), K = the head dims):
//   S = Q K^T, dP = dO V^T                  64 queries x 48 keys (A, B K-major from shared memory;
//                                            P is computed while dP is in flight)
//   P = exp2(S * scale * log2e - lse2), dS = P (dP - delta), masked per element on partial tiles by
//     the producer's visibility bits (bwd/producer.cuh)
//   dS, P to shared memory [queries][keys] in 32-byte-swizzled blocks of 16 keys: the MN-major B of
//     dK^T, dV^T (after the warpgroup's own named barrier) and the K-major A of dQ (after both's)
//   dV^T += dO^T P, dK^T += Q^T dS          the head dim on WGMMA's M (D_v / 64 and D / 64 atoms),
//                                            N = 48 keys, K = 64 queries (A = dO / Q, MN-major)
//   dQ = dS K                               64 queries x 96 columns, K = 96 keys, handed to the dQ
//                                            writer as on the split-D path
// dK^T, dV^T stay in registers over the whole GQA group (72 + 48 per thread at 192 / 128, 72 + 72
// at 192, where 64 keys per warpgroup would need 160 / 192); bwd_epilogue_swap_dkv writes them.
// At 192 dO has its own one-stage ring (BwdWgmmaTraits::kOwnDoRing): waited for before dP, handed
// back once dV^T is done, so the next tile's S runs while its dO loads.
#pragma once
#include <stdint.h>

#include <type_traits>  // std::integral_constant

#include "attn_args.h"  // BwdArgs
#include "bwd/consumer_ring.cuh"
#include "bwd/mainloop_split_d.cuh"  // for_col_pieces, store_dq_split
#include "bwd/trace.cuh"
#include "bwd/traits.cuh"
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack, fast_exp2

namespace fm3::hopper::sm90 {

// dK * softmax_scale and dV of the key block from the transposed accumulators: acc[24 a + 4 j + 2 r + c]
// is head-dim row 64 a + 16 wq + g + 8 r, key 48 cw + 8 j + 2 t + c. Each staged as [key][head dim]
// in shared memory (over the ring, free once both warpgroups are past their last tile), then written
// with 16-byte coalesced stores by both warpgroups.
template <class Tr, class T>
__device__ __forceinline__ void bwd_epilogue_swap_dkv(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm,
                                                      const float (&dk)[Tr::kDkRegs], const float (&dv)[Tr::kDvRegs],
                                                      const BwdBlock& blk, int tid, int cw, int wq, int g, int t) {
  constexpr int kBlockN = Tr::kTileN, kKeys = Tr::kKeysPerWg, kAcc = kKeys / 2;  // accumulators per M atom
  unsigned char* staged = sm.base + Tr::kOffQ;
  // One of dK, dV at a time (at 192 the one-stage ring holds one): staged, then written out.
  auto write = [&](const auto& acc, float scale, T* dst, int64_t row_stride) {
    constexpr int kAtoms = sizeof(acc) / sizeof(float) / kAcc, kChunks = kAtoms * 8;  // 16-byte chunks per key
    named_barrier_sync(6, 128 * Tr::kConsumerWGs);  // the ring (the last tile's operands, the previous pass) is free
#pragma unroll
    for (int ad = 0; ad < kAtoms; ++ad)
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int d = ad * 64 + wq * 16 + g + 8 * r, key = cw * kKeys + 8 * j + 2 * t + c;
            *reinterpret_cast<T*>(staged + key * Tr::kEpiPitch + d * 2) =
                static_cast<T>(acc[ad * kAcc + 4 * j + 2 * r + c] * scale);
          }
    named_barrier_sync(6, 128 * Tr::kConsumerWGs);
    for (int i = tid - 128; i < kBlockN * kChunks; i += 128 * Tr::kConsumerWGs) {
      const int row = i / kChunks, chunk = i % kChunks, key = blk.n0 + row;
      if (key < a.seqlen_k)
        *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(key) * row_stride + chunk * 8) =
            *reinterpret_cast<const uint4*>(staged + row * Tr::kEpiPitch + chunk * 16);
    }
  };
  write(dk, a.scale, static_cast<T*>(a.dk) + blk.b * a.k_bs + blk.hk * a.k_hs, a.k_rs);
  write(dv, 1.f, static_cast<T*>(a.dv) + blk.b * a.v_bs + blk.hk * a.v_hs, a.v_rs);
}

// D[64 kAtoms x N] += A B over kSteps k16 steps, A MN-major (atom A at a_off + A * atom_bytes, step
// ks at + ks * a_step), B MN-major (step ks at b_off + ks * b_step): M atom A on the accumulators
// [A N / 2, (A + 1) N / 2) of d.
template <typename T, int N, int kAtoms, int kSteps, int A = 0, int M>
__device__ __forceinline__ void gmma_mn_atoms(const SmemDesc& da, uint32_t a_off, uint32_t atom_bytes, uint32_t a_step,
                                              const SmemDesc& db, uint32_t b_off, uint32_t b_step, float (&d)[M]) {
  if constexpr (A < kAtoms) {
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
      gmma_ss_mn<T, N, A * N / 2>(da.at(a_off + A * atom_bytes + ks * a_step), db.at(b_off + ks * b_step), d, true);
    gmma_mn_atoms<T, N, kAtoms, kSteps, A + 1>(da, a_off, atom_bytes, a_step, db, b_off, b_step, d);
  }
}

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__device__ __forceinline__ void bwd_consumer_swap_dkv(
    const bwd::BwdArgs& a, const BwdSmem<BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>>& sm,
    const BwdBlock& blk, int tid, int warp, int lane, int wg) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>;
  static_assert(Tr::kSwapDkv && kBlockM == 64 && Tr::kConsumerWGs == 2, "the swapped-dK/dV consumers");
  constexpr int kKeys = Tr::kKeysPerWg;  // 48
  constexpr int kS = kKeys / 2;          // S / dP accumulators per thread (64 x 48); also per M atom of dK^T, dV^T
  constexpr int kCols = Tr::kDkCols;     // dQ columns per warpgroup (96)
  constexpr int kPtOff = kBlockN * kBlockM * 2;  // P after dS in the buffer
  constexpr uint32_t kChunk = Tr::kDsChunkBytes;  // a block of 16 keys of dS / P
  const int cw = wg - 1;
  const int wq = warp % 4;  // warp within the warpgroup: 16 queries of S / dP and dQ, 16 head-dim rows of dK^T / dV^T
  const int g = lane / 4, t = lane % 4;
  const int q_local = wq * 16 + g;  // this thread's queries: q_local and q_local + 8
  BwdConsumerRing<Tr> ring;
  // Operand descriptors, built once; a tile's operands are these moved by constant byte offsets.
  const SmemDesc dsc_q = smem_desc(sm.sQ, 16, 1024);                            // A of S: Q, K-major
  const SmemDesc dsc_do = smem_desc(sm.sdO, 16, 1024);                          // A of dP
  const SmemDesc dsc_k = smem_desc(sm.sK + cw * kKeys * 128, 16, 1024);         // B of S: this warpgroup's keys
  const SmemDesc dsc_v = smem_desc(sm.sV + cw * kKeys * 128, 16, 1024);         // B of dP
  const SmemDesc dsc_q_mn = smem_desc(sm.sQ, kBlockM * 128, 1024);              // A of dK^T: Q^T, MN-major
  const SmemDesc dsc_do_mn = smem_desc(sm.sdO, kBlockM * 128, 1024);            // A of dV^T
  const SmemDesc dsc_ds_mn =                                                    // B of dK^T (dS), dV^T (P): MN-major
      smem_desc(sm.sdS + cw * (kKeys / 16) * kChunk, kChunk, 256, kSwizzle32B);
  const SmemDesc dsc_ds = smem_desc(sm.sdS, 16, 256, kSwizzle32B);             // A of dQ: dS, K-major
  const SmemDesc dsc_k_mn = smem_desc(sm.sK, kBlockN * 128, 1024);             // B of dQ: K, MN-major
  float dk[Tr::kDkRegs], dv[Tr::kDvRegs];
#pragma unroll
  for (int i = 0; i < Tr::kDkRegs; ++i) dk[i] = 0.f;
#pragma unroll
  for (int i = 0; i < Tr::kDvRegs; ++i) dv[i] = 0.f;

  // dQ (64 queries x this warpgroup's kCols columns) = dS K over the 96 keys (k16 step: one 16-key
  // block of dS, 16 rows of K), stored as on the split-D path (store_dq_split).
  auto dq_product = [&](auto cw_c, auto& dq) {
    constexpr int kCw = decltype(cw_c)::value;
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks)
      for_col_pieces<Tr, kCols, kCw, kBlockN * 128>([&](auto n, auto off, uint32_t col) {
        gmma_ss_kmn<T, decltype(n)::value, decltype(off)::value>(dsc_ds.at(ks * kChunk), dsc_k_mn.at(ks * 2048 + col),
                                                                 dq, ks > 0);
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
    if (!ring.next(a, sm, blk, 0, m0, partial)) break;
    bwd_trace(kTraceFirstTile, tracer && ring.dq_count == 0);
    const int stage = ring.q.stage;
    const uint32_t qoff = stage * Tr::kQBytes, dooff = (Tr::kOwnDoRing ? ring.dO.stage : stage) * Tr::kdOBytes;
    const float* lse_t = sm.lse + stage * kBlockM;
    const float* delta_t = sm.delta + stage * kBlockM;
    const float lse2[2] = {lse_t[q_local], lse_t[q_local + 8]};

    // S = Q K^T and dP = dO V^T for this warpgroup's 48 keys.
    float s[kS], dp[kS];
    gmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;  // k16 step within the 128-byte row
      gmma_ss<T, kKeys>(dsc_q.at(qoff + (ks / 4) * kBlockM * 128 + off), dsc_k.at((ks / 4) * kBlockN * 128 + off), s,
                        ks > 0);
    }
    gmma_commit();
    ring.wait_do(sm);
#pragma unroll
    for (int ks = 0; ks < kHeadDimV / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;
      gmma_ss<T, kKeys>(dsc_do.at(dooff + (ks / 4) * kBlockM * 128 + off), dsc_v.at((ks / 4) * kBlockN * 128 + off),
                        dp, ks > 0);
    }
    gmma_commit();
    gmma_wait<1>();
    fence_regs(s);
    // accumulator 4 j + 2 r + c: query q_local + 8 r, key 48 cw + 8 j + 2 t + c of the block
#pragma unroll
    for (int i = 0; i < kS; ++i) s[i] = fast_exp2(s[i] * a.scale_log2 - lse2[(i / 2) % 2]);
    if (partial) {
      // This thread's queries lie in one 32-row word of each key column: bits shift and shift + 8.
      const uint32_t* bits = sm.mask + stage * Tr::kMaskStageInts + (q_local / 32);
      const int shift = q_local % 32;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const uint32_t w = bits[(cw * kKeys + 8 * j + 2 * t + c) * Tr::kMaskWords] >> shift;
#pragma unroll
          for (int r = 0; r < 2; ++r)
            if (!((w >> (8 * r)) & 1u)) s[4 * j + 2 * r + c] = 0.f;
        }
    }
    const float dlt[2] = {delta_t[q_local], delta_t[q_local + 8]};
    gmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int i = 0; i < kS; ++i) dp[i] = s[i] * (dp[i] - dlt[(i / 2) % 2]);
    // Both warpgroups have read the buffer for the previous tile (each waited for its products
    // before coming here); then this warpgroup's 48 keys of dS and P: key 48 cw + 8 j + 2 t (+1) is
    // in 16-key block 3 cw + j / 2, half j % 2.
    named_barrier_sync(7, 128 * Tr::kConsumerWGs);
    unsigned char* ds_dst = sm.base + Tr::kOffdS + cw * (kKeys / 16) * kChunk + 4 * t;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int off = (j / 2) * kChunk + swizzle32(q_local + 8 * r, j % 2);
        *reinterpret_cast<uint32_t*>(ds_dst + off) = Mma<T>::pack(dp[4 * j + 2 * r], dp[4 * j + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(ds_dst + kPtOff + off) = Mma<T>::pack(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
      }
    fence_proxy_async();              // the stores above are read by WGMMA (async proxy)
    named_barrier_sync(4 + cw, 128);  // this warpgroup's keys written: all dV^T and dK^T read

    // dV^T += dO^T P and dK^T += Q^T dS (k16 step: 16 queries, 16 rows of dO / Q and of P / dS),
    // then, once the other warpgroup's dS is written too, dQ.
    gmma_fence();
    gmma_mn_atoms<T, kKeys, kHeadDimV / 64, kBlockM / 16>(dsc_do_mn, dooff, kBlockM * 128, 2048, dsc_ds_mn, kPtOff,
                                                          512, dv);
    gmma_commit();
    gmma_mn_atoms<T, kKeys, kHeadDim / 64, kBlockM / 16>(dsc_q_mn, qoff, kBlockM * 128, 2048, dsc_ds_mn, 0, 512, dk);
    gmma_commit();
    named_barrier_sync(6, 128 * Tr::kConsumerWGs);  // both warpgroups' dS written
    float dq[kCols / 2];
    if (cw == 0)
      dq_product(First{}, dq);
    else
      dq_product(Second{}, dq);
    gmma_commit();
    if constexpr (Tr::kOwnDoRing) {
      gmma_wait<2>();  // dV^T done: dO is no longer read
      fence_regs(dv);
      ring.release_do(sm);
    }
    gmma_wait<1>();  // dV^T, dK^T done: Q, dO, lse2, delta and the mask bits of this stage are no longer read
    fence_regs(dk);
    fence_regs(dv);
    ring.release(sm);
    gmma_wait<0>();
    fence_regs(dq);
    ring.wait_dq_buffer(sm);
    if (cw == 0)
      store_dq_split<Tr, kCols, 0>(sm, dq, 0, wq, lane);
    else
      store_dq_split<Tr, kCols, 1>(sm, dq, 0, wq, lane);
    fence_proxy_async();  // read by the bulk reduction (async proxy)
    ring.hand_dq(sm, (ring.head_off + m0) * Tr::kTileDim, cw == 0 && wq == 0 && lane == 0);
  }

  bwd_trace(kTraceLoopEnd, tracer);
  bwd_trace_tiles(ring.dq_count, tracer);
  ring.wait_dq_buffer(sm);  // the end of the dQ stream
  ring.hand_dq(sm, -1, cw == 0 && wq == 0 && lane == 0);

  bwd_epilogue_swap_dkv<Tr, T>(a, sm, dk, dv, blk, tid, cw, wq, g, t);
  bwd_trace(kTraceEpilogueDone, tracer);
}

}  // namespace fm3::hopper::sm90
