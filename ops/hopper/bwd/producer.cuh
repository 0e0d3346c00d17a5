// Backward WGMMA kernel (bwd/kernel.cuh): the producer, warp 0 of warpgroup 0. Its lane 0
// TMA-loads K and V of the key block once; then, for every query head of the GQA group, the warp
// runs the query-tile scheduler (compact_window over fm3::classify_tile / apply_block_mask of the
// key block's summary, 32 tiles per window) and lane 0 streams the surviving query tiles -- Q and
// dO (TMA, 128-byte swizzle), lse2 and delta (1-D bulk copies) -- into a kStages-deep ring on
// mbarriers, with the tile's entry (index + partial tag) and head beside each stage. A fully
// masked tile is never loaded. An entry of -1 ends the stream.
// block_mask: a tile lies inside one 128 x 128 block, so apply_block_mask decides it whole and no
// per-element block_mask lookup is needed; except on 64 x 96 tiles (BwdWgmmaTraits::kSwapDkv), whose
// partial tiles get per-element visibility bits from the producer, block_mask in them.
#pragma once
#include <cuda.h>
#include <stdint.h>

#include "attn_args.h"     // BwdArgs
#include "bwd/traits.cuh"
#include "bwd/common.cuh"  // classify_pair, mask_head
#include "fm3/mask.h"      // BlockEntry
#include "bwd/trace.cuh"
#include "mask_scheduler.cuh"
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__device__ __forceinline__ void bwd_producer(const bwd::BwdArgs& a,
                                             const BwdSmem<BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>>& sm,
                                             const CUtensorMap* tmap_q, const CUtensorMap* tmap_k,
                                             const CUtensorMap* tmap_v, const CUtensorMap* tmap_do, const BwdBlock& blk,
                                             int lane) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>;
  const int nb = blk.nb, hk = blk.hk, b = blk.b, n0 = blk.n0, group = blk.group;
  const int n_mtiles = blk.n_mtiles, n_kblocks = blk.n_kblocks, causal_offset = blk.causal_offset;
  if (lane == 0) {
    tma_prefetch_desc(tmap_q);
    tma_prefetch_desc(tmap_do);
    mbar_arrive_expect_tx(sm.bar_kv, Tr::kKBytes + Tr::kVBytes);
#pragma unroll
    for (int c = 0; c < Tr::kDChunks; ++c) {
      tma_load_4d(sm.sK + c * kBlockN * 128, tmap_k, sm.bar_kv, c * 64, n0, hk, b);
      if (c < Tr::kDChunksV) tma_load_4d(sm.sV + c * kBlockN * 128, tmap_v, sm.bar_kv, c * 64, n0, hk, b);
    }
  }
  RingCursor<kStages> ring;                // the Q / dO / lse2 / delta ring
  RingCursor<Tr::kStagesdO> do_ring;       // Tr::kOwnDoRing
  bool first_load = true;  // bwd/trace.cuh
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t bhm = static_cast<int64_t>(b) * a.mask_heads + bwd::mask_head(a, h);
    const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
    const BlockSummary summ = a.summary ? a.summary[bhm * n_kblocks + nb] : no_mask_summary(a.seqlen_q);
    bwd_trace(kTraceSummary, lane == 0 && first_load && summ.lts_min != summ.ute_max - 1);  // waits for the load
    const int64_t bh = static_cast<int64_t>(b) * a.num_heads + h;
    const float* lse2 = a.lse2 + bh * a.lse_stride;
    const float* delta = a.delta + bh * a.lse_stride;
    auto classify = [&](int mt) {
      return bwd::classify_pair(summ, bm, a.bm_cols, mt * kBlockM, kBlockM, n0, kBlockN, a.seqlen_q, a.seqlen_k,
                                a.causal, causal_offset);
    };
    // The query tiles are walked from the last: on causal and document masks the key blocks of a
    // head then reach a tile in the same step, so in deterministic mode each waits for its
    // predecessor's dQ part by about one write, not by the diagonal's offset of two tiles per key
    // block. Both modes walk the same way, so dK and dV are bitwise equal between them.
    for (int first = (n_mtiles - 1) / 32 * 32; first >= 0; first -= 32) {
      const int count = compact_window<32, 1>(classify, first, n_mtiles, sm.list, sm.warp_counts);
      bwd_trace(kTraceScheduled, lane == 0 && first_load && count > 0);
      for (int i = count - 1; i >= 0; --i) {
        if constexpr (Tr::kSwapDkv) {
          // Every lane: on a partial tile, the visibility bits of key columns lane, lane + 32, ... for
          // the tile's rows (32 per word; block_mask too, as a 96-key block may straddle two of its
          // blocks), then its arrival (lane 0's below, with the transaction bytes).
          const int entry = sm.list[i];
          mbar_wait(sm.bar_empty + 8 * ring.stage, ring.phase ^ 1);
          if (BlockEntry::partial(entry)) {
            const int m0 = BlockEntry::block(entry) * kBlockM;
            const int32_t* sri = a.sri ? a.sri + bhm * a.seqlen_k * a.mask_cols : nullptr;
            uint32_t* dst = sm.mask + ring.stage * Tr::kMaskStageInts;
#pragma unroll
            for (int kc = lane; kc < kBlockN; kc += 32) {
              const int col = n0 + kc;
              const ColumnBounds cb = column_bounds(sri, col, a.seqlen_q, a.seqlen_k, a.mask_cols, a.causal,
                                                    causal_offset);
#pragma unroll
              for (int w = 0; w < Tr::kMaskWords; ++w) {
                const int r0 = m0 + 32 * w;
                const bool dropped = bm != nullptr && col < a.seqlen_k && !block_kept(bm, a.bm_cols, r0, col);
                dst[kc * Tr::kMaskWords + w] = dropped ? 0u : visible_bits(cb, r0);
              }
            }
          }
          if (lane != 0) mbar_arrive(sm.bar_full + 8 * ring.stage);
        }
        if (lane == 0) {
          const int entry = sm.list[i];
          const int m0 = BlockEntry::block(entry) * kBlockM;
          if constexpr (!Tr::kSwapDkv) mbar_wait(sm.bar_empty + 8 * ring.stage, ring.phase ^ 1);
          const int stage = ring.stage;
          sm.entry[stage] = entry;
          sm.head[stage] = h;
          const uint32_t full = sm.bar_full + 8 * stage;
          mbar_arrive_expect_tx(full, Tr::kQBytes + (Tr::kOwnDoRing ? 0 : Tr::kdOBytes) + 2 * kBlockM * 4);
#pragma unroll
          for (int c = 0; c < Tr::kDChunks; ++c) {
            tma_load_4d(sm.sQ + stage * Tr::kQBytes + c * kBlockM * 128, tmap_q, full, c * 64, m0, h, b);
            if (!Tr::kOwnDoRing && c < Tr::kDChunksV)
              tma_load_4d(sm.sdO + stage * Tr::kdOBytes + c * kBlockM * 128, tmap_do, full, c * 64, m0, h, b);
          }
          bulk_load_1d(sm.sLse + stage * kBlockM * 4, lse2 + m0, kBlockM * 4, full);
          bulk_load_1d(sm.sDelta + stage * kBlockM * 4, delta + m0, kBlockM * 4, full);
          if constexpr (Tr::kOwnDoRing) {  // dO on its own ring, after Q (S does not wait for it)
            mbar_wait(sm.bar_do_empty + 8 * do_ring.stage, do_ring.phase ^ 1);
            const uint32_t do_full = sm.bar_do_full + 8 * do_ring.stage;
            mbar_arrive_expect_tx(do_full, Tr::kdOBytes);
#pragma unroll
            for (int c = 0; c < Tr::kDChunksV; ++c)
              tma_load_4d(sm.sdO + do_ring.stage * Tr::kdOBytes + c * kBlockM * 128, tmap_do, do_full, c * 64, m0, h, b);
            do_ring.advance();
          }
          bwd_trace(kTraceFirstLoad, first_load);
          first_load = false;
        }
        ring.advance();
      }
      __syncwarp();
    }
  }
  if (lane == 0) {  // end of stream, once for each deterministic writer reading the ring
    const int ends = Tr::dq_writers(a.dq_semaphore != nullptr);
    for (int e = 0; e < ends; ++e) {
      mbar_wait(sm.bar_empty + 8 * ring.stage, ring.phase ^ 1);
      sm.entry[ring.stage] = -1;
      mbar_arrive(sm.bar_full + 8 * ring.stage, Tr::kSwapDkv ? 32 : 1);
      ring.advance();
    }
  }
}

}  // namespace fm3::hopper::sm90
