// Backward WGMMA kernel (bwd/kernel.cuh): the consumers, warpgroups 1..kConsumerWGs, 64 keys
// each. Per query tile of the ring (kBlockM queries), with WGMMA:
//   S^T = K Q^T, dP^T = V dO^T              (A, B from shared memory; P^T is computed while dP^T is
//                                            in flight)
//   P^T = exp2(S^T * scale * log2e - lse2), dS^T = P^T (dP^T - delta)
//     per-element mask only on partial tiles: the thread's two key columns' row intervals sit in
//     registers for the whole CTA
//   dV += P^T dO                              (A = P^T from registers)
//   both warpgroups' dS^T in shared memory (2 buffers, one named barrier)
//   dQ = dS K                                 (A = dS^T, MN-major, from shared memory; split between
//     the warpgroups along the queries (128-query tiles) or the head dim (D=128), else the keys),
//     then dK += dS^T Q (A = dS^T from registers): dQ is stored to shared memory in accumulator
//     order while dK runs and handed to the dQ writer warp (bwd/dq_writer.cuh), which adds it to
//     the workspace (in key-block order when deterministic).
// dK, dV stay in registers over the whole GQA group; bwd/epilogue.cuh writes them.
// Operand descriptors are built once per CTA (SmemDesc) and moved by constant offsets, with the
// warpgroup index broadcast so the compiler keeps them in uniform registers.
#pragma once
#include <stdint.h>

#include "attn_args.h"     // BwdArgs
#include "bwd/consumer_ring.cuh"
#include "bwd/epilogue.cuh"
#include "bwd/pointwise.cuh"
#include "bwd/trace.cuh"
#include "bwd/traits.cuh"
#include "fm3/mask.h"      // ColumnBounds
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack, fast_exp2

namespace fm3::hopper::sm90 {

// The dK / dV accumulators live in this function across the tile loop and go to the epilogue at the
// end. tid, warp, lane: this thread; wg: its warpgroup, broadcast from lane 0 so the compiler sees it
// warp-uniform.
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__device__ __forceinline__ void bwd_consumer(const bwd::BwdArgs& a,
                                             const BwdSmem<BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>>& sm,
                                             const BwdBlock& blk, int tid, int warp, int lane, int wg) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>;
  const int cw = wg - 1;   // consumer warpgroup: keys [cw * 64, cw * 64 + 64) of the block
  const int wq = warp % 4;  // warp within the warpgroup: 16 keys (S^T rows) / 16 queries (dQ rows)
  const int g = lane / 4, t = lane % 4;
  const int key_local = cw * 64 + wq * 16 + g;  // this thread's keys: key_local and key_local + 8
  float dk[Tr::kDkRegs], dv[Tr::kDvRegs];  // m64 x kHeadDim each (kHeadDimV == kHeadDim here)
#pragma unroll
  for (int i = 0; i < Tr::kDkRegs; ++i) dk[i] = dv[i] = 0.f;
  BwdConsumerRing<Tr> ring;
  // Operand descriptors, built once; a tile's operands are these moved by constant byte offsets.
  const SmemDesc dsc_k = smem_desc(sm.sK + cw * 64 * 128, 16, 1024);  // this warpgroup's keys (S^T A operand)
  const SmemDesc dsc_v = smem_desc(sm.sV + cw * 64 * 128, 16, 1024);
  const SmemDesc dsc_q = smem_desc(sm.sQ, 16, 1024), dsc_do = smem_desc(sm.sdO, 16, 1024);  // K-major B of S^T, dP^T
  const SmemDesc dsc_q_mn = smem_desc(sm.sQ, kBlockM * 128, 1024);                       // MN-major B of dK, dV
  const SmemDesc dsc_do_mn = smem_desc(sm.sdO, kBlockM * 128, 1024);
  const SmemDesc dsc_ds = smem_desc(sm.sdS, 16, 1024);                                   // MN-major A of dQ
  const SmemDesc dsc_kd = smem_desc(sm.sK + (Tr::kDqSplitD ? cw * kBlockN * 128 : 0), kBlockN * 128, 1024);
  constexpr int kS = kBlockM / 2;   // S^T / dP^T accumulators per thread (64 keys x kBlockM queries)
  constexpr int kKs = kBlockM / 16;  // k16 steps of dV / dK (queries)

  // dQ (64 queries x kDqN head-dim columns) = dS K over kDqKeys keys, from dS^T buffer `buf`:
  // A = dS^T [keys][queries] and B = K [keys][head dim], both MN-major (k16 step = 16 key rows).
  // At 80 and 96 the first warpgroup computes all of it (N = 80 / 96, Tr::kDqOneWg); the second
  // commits no group (an empty one becomes a dummy HGMMA that both warpgroups pass, and the first's
  // wait for dV then waits for dQ too) and waits for dV with a count of 0 instead of 1.
  auto issue_dq = [&](int buf, float (&dq)[Tr::kDqN / 2]) {
    const uint32_t key0 = Tr::kDqOwnPart ? 0 : cw * 64 * 128;
    const uint32_t qsub = Tr::kDqSplitM ? cw * kBlockN * 128 : 0;  // this warpgroup's 64 queries
    if (!Tr::kDqOneWg || cw == 0) {
      gmma_fence();
#pragma unroll
      for (int ks = 0; ks < Tr::kDqKeys / 16; ++ks)
        gmma_ss_mn<T, Tr::kDqN>(dsc_ds.at(buf * Tr::kDsBytes + qsub + key0 + ks * 2048), dsc_kd.at(key0 + ks * 2048),
                                dq, ks > 0);
      gmma_commit();
    }
  };
  // This warpgroup's part of the dQ tile at workspace offset `off` to shared memory in accumulator
  // order (bwd::dq_tile_offset; accumulator group j, 8 columns, goes to part j / 8), once the writer
  // has read the previous tile's; the writer warp adds it to the workspace. With kDqOneWg the second
  // warpgroup stores nothing but still waits for each tile's read: its parity wait on dq_empty at
  // the end of the stream must not be two phases behind (it would pass early, and its end-of-stream
  // arrival would complete the last tile's dq_full phase in place of the first warpgroup's).
  auto write_dq = [&](const float (&dq)[Tr::kDqN / 2], int64_t off) {
    ring.wait_dq_buffer(sm);
    if (!Tr::kDqOneWg || cw == 0) {
      float* dst = reinterpret_cast<float*>(sm.base + Tr::kOffdQ) + cw * Tr::kDqWgFloats + wq * 8 * 128 + lane * 4;
#pragma unroll
      for (int j = 0; j < Tr::kDqN / 8; ++j)  // the padding past the head dim is neither computed nor stored
        *reinterpret_cast<float4*>(dst + (j / 8) * Tr::kDqWgFloats + (j % 8) * 128) =
            make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      fence_proxy_async();  // read by the bulk reduction (async proxy)
    }
    ring.hand_dq(sm, off, cw == 0 && wq == 0 && lane == 0);
  };

  mbar_wait(sm.bar_kv, 0);
  const bool tracer = tid == 128;  // bwd/trace.cuh, with -DFM3_BWD_TRACE
  bwd_trace(kTraceKvReady, tracer);
  for (int iter = 0;; ++iter) {
    int m0;
    bool partial;
    if (!ring.next(a, sm, blk, key_local, m0, partial)) break;
    bwd_trace(kTraceFirstTile, tracer && iter == 0);
    const int stage = ring.q.stage;
    const ColumnBounds* cb = ring.cb;
    const uint32_t qoff = stage * Tr::kQBytes;  // this stage's Q and dO

    // 64-query tiles: this thread's queries' lse2 is read before S^T is issued (issued behind the
    // HGMMAs, the loads completed only with S^T: ncu, 7% of the samples on the first use), and delta
    // while dP^T is in flight (query pairs 2t, 2t + 1 are adjacent); 128-query tiles have no registers
    // to spare for them.
    constexpr bool kStatsInRegs = kBlockM == 64;
    const float* lse_t = sm.lse + stage * kBlockM;
    const float* delta_t = sm.delta + stage * kBlockM;
    float2 l2[kBlockM / 8], dlt[kBlockM / 8];
    if constexpr (kStatsInRegs) {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) l2[j] = *reinterpret_cast<const float2*>(lse_t + j * 8 + 2 * t);
    }
    // S^T = K Q^T and dP^T = V dO^T: 64 keys x kBlockM queries each.
    float s[kS], dp[kS];
    gmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;  // k16 step within the 128-byte row
      gmma_ss<T, kBlockM>(dsc_k.at((ks / 4) * kBlockN * 128 + off), dsc_q.at(qoff + (ks / 4) * kBlockM * 128 + off),
                          s, ks > 0);
    }
    gmma_commit();  // S^T first: P^T is computed while dP^T is in flight
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;
      gmma_ss<T, kBlockM>(dsc_v.at((ks / 4) * kBlockN * 128 + off), dsc_do.at(qoff + (ks / 4) * kBlockM * 128 + off),
                          dp, ks > 0);
    }
    gmma_commit();
    // P^T and dS^T (fp32, in place; masked per element on partial tiles), packed as the register
    // A operands of dV and dK.
    gmma_wait<1>();
    fence_regs(s);
    auto lse2_of = [&](int j) {
      if constexpr (kStatsInRegs) return l2[j];
      else return *reinterpret_cast<const float2*>(lse_t + j * 8 + 2 * t);
    };
    if (partial)
      bwd_p_from_s<kBlockM, true>(s, lse2_of, a.scale_log2, cb, m0, t);
    else
      bwd_p_from_s<kBlockM, false>(s, lse2_of, a.scale_log2, cb, m0, t);
    if constexpr (kStatsInRegs) {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) dlt[j] = *reinterpret_cast<const float2*>(delta_t + j * 8 + 2 * t);
    }
    gmma_wait<0>();
    fence_regs(dp);
    bwd_ds_from_dp<kBlockM>(dp, s, [&](int j) {
      if constexpr (kStatsInRegs) return dlt[j];
      else return *reinterpret_cast<const float2*>(delta_t + j * 8 + 2 * t);
    }, t);
    uint32_t pp[kKs][4], pds[kKs][4];
#pragma unroll
    for (int ps = 0; ps < kKs; ++ps)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pp[ps][e] = Mma<T>::pack(s[8 * ps + 2 * e], s[8 * ps + 2 * e + 1]);
        pds[ps][e] = Mma<T>::pack(dp[8 * ps + 2 * e], dp[8 * ps + 2 * e + 1]);
      }
    const int dsb = iter % Tr::kDsBuffers;
    // dS^T to shared memory, [keys][queries] as kQSub sub-tiles of 64 queries, 128-byte rows,
    // 16-byte chunks XOR-swizzled by (key % 8) as TMA would write it. Two buffers: both warpgroups'
    // dQ of tile iter - 2 completed before either passed the dS barrier of tile iter - 1.
    if constexpr (Tr::kStmatrixDs) {
      // One stmatrix per 16 queries: pds[ps][e] is 8 x 8 matrix e of keys [16 wq, 16 wq + 16) x
      // queries [16 ps, 16 ps + 16) (e % 2: the lower 8 keys, e / 2: the upper 8 queries); lane i
      // addresses row i % 8 of matrix i / 8.
      const uint32_t ds_buf = sm.sdS + dsb * Tr::kDsBytes;
      const int ds_row = cw * 64 + wq * 16 + ((lane / 8) % 2) * 8 + lane % 8;
#pragma unroll
      for (int ps = 0; ps < kKs; ++ps) {
        const int chunk = (2 * ps + lane / 16) % 8, sub = ps / 4;
        stmatrix_x4(ds_buf + sub * kBlockN * 128 + swizzle128(ds_row, chunk), pds[ps]);
      }
    } else {
      // pds[ps][e]: key row key_local + 8 * (e % 2), queries 8 * (2 * ps + e / 2) + 2t, +1.
      unsigned char* dst = sm.base + Tr::kOffdS + dsb * Tr::kDsBytes;
#pragma unroll
      for (int ps = 0; ps < kKs; ++ps)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = key_local + 8 * (e % 2), chunk = (2 * ps + e / 2) % 8, sub = ps / 4;
          *reinterpret_cast<uint32_t*>(dst + sub * kBlockN * 128 + swizzle128(row, chunk) + 4 * t) =
              pds[ps][e];
        }
    }
    // dV += P^T dO (B = dO [queries][head dim], MN-major, k16 step = 16 query rows), issued before
    // the proxy fence (it reads no dS^T), so the tensor cores run it while the stores drain; then,
    // once both warpgroups' dS^T is in shared memory, dQ = dS K, and dK += dS^T Q while dQ goes to
    // the writer.
    gmma_fence();
#pragma unroll
    for (int ps = 0; ps < kKs; ++ps) gmma_rs<T, kHeadDim>(pp[ps], dsc_do_mn.at(qoff + ps * 2048), dv);
    gmma_commit();
    fence_proxy_async();  // the dS^T stores above are read by dQ's WGMMA (async proxy)
    named_barrier_sync(6, 128 * Tr::kConsumerWGs);  // both halves of dS^T written
    float dq[Tr::kDqN / 2];
    issue_dq(dsb, dq);
    if (!Tr::kDqOneWg || cw == 0)
      gmma_wait<1>();  // dV done
    else
      gmma_wait<0>();  // dV done (this warpgroup committed no dQ group)
    fence_regs(dv);
    fence_regs(pp);
#pragma unroll
    for (int ps = 0; ps < kKs; ++ps) gmma_rs<T, kHeadDim>(pds[ps], dsc_q_mn.at(qoff + ps * 2048), dk);
    gmma_commit();
    gmma_wait<1>();  // dQ done; dK runs while dQ is stored
    fence_regs(dq);
    write_dq(dq, (ring.head_off + m0) * Tr::kTileDim);
    gmma_wait<0>();
    fence_regs(dk);
    fence_regs(dv);
    fence_regs(pp);
    fence_regs(pds);
    // Q, dO, lse2, delta of this stage are no longer read. Released after write_dq, so that the
    // deterministic dQ writer, counted on this barrier (Tr::kRingTileAhead), has read the stage's
    // entry by then on every tile but the first.
    ring.release(sm);
  }

  bwd_trace(kTraceLoopEnd, tracer);
  bwd_trace_tiles(ring.dq_count, tracer);
  ring.wait_dq_buffer(sm);  // the end of the dQ stream
  ring.hand_dq(sm, -1, cw == 0 && wq == 0 && lane == 0);

  bwd_epilogue<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>(a, sm, dk, dv, blk, tid, key_local, cw, t);
  bwd_trace(kTraceEpilogueDone, tracer);
}

}  // namespace fm3::hopper::sm90
