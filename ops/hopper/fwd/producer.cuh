// Forward WGMMA kernel (fwd/kernel.cuh): the producer, warpgroup 0. Per tile its four warps
// run the mask scheduler (mask_scheduler.cuh, on named barrier 1), which publishes the compacted
// list of surviving key blocks a window of 128 blocks at a time; all four warps walk that list
// and, per block, wait for a free stage of the K/V ring; when the block is partial each thread
// turns one key column's bounds and block_mask into visibility bits for the tile's rows
// (fm3::visible_bits and TileMask::block_mask_bits, one 32-bit word per 32 rows); thread 0 writes
// the block's entry (index + partial tag) beside the stage and issues the TMA loads of K and V
// (cp.async.bulk.tensor, 128-byte swizzle) completing on the stage's "full" mbarrier. Q is loaded
// per tile into one of kQBuffers buffers on its own mbarrier, once the consumers hand that buffer
// back (q_empty). After a tile's blocks it posts the tile boundary (tile_scheduler.cuh) and runs
// ahead into the next tile while the consumers finish this one.
#pragma once
#include <cuda.h>
#include <stdint.h>

#include "attn_args.h"  // FwdArgs
#include "fm3/mask.h"   // ColumnBounds, column_bounds, visible_bits
#include "fwd/tile_scheduler.cuh"
#include "fwd/traits.cuh"
#include "mask_scheduler.cuh"
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages, bool kOverlap>
__device__ __forceinline__ void fwd_producer(const FwdArgs& a, const FwdSmem<FwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>>& sm,
                                             const FwdTileScheduler<kBlockM>& sched, const CUtensorMap* tmap_q,
                                             const CUtensorMap* tmap_k, const CUtensorMap* tmap_v, int tid, int lane,
                                             int n_blocks, int causal_offset) {
  using Tr = FwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>;
  const int warp = tid / 32;  // from tid here, not passed in: the machine code of the one-piece kernel
  if (warp == 0 && lane == 0) {
    tma_prefetch_desc(tmap_q);
    tma_prefetch_desc(tmap_k);
    tma_prefetch_desc(tmap_v);
  }
  RingCursor<kStages> ring, vring;  // vring (overlapped consumers): thread 0 only
  // Overlapped consumers: V of a block is loaded after the next block's K (FlashAttention-4's
  // order), so K runs a block ahead of V: the consumers wait for K_{i+1} in the middle of block i,
  // for V_i only at block i + 1. Thread 0 keeps the key offset of the block whose V is pending.
  int pending_v = -1;
  auto load_v = [&](int n0, const FwdTile& x) {
    const uint32_t v_full = sm.bar_v_full + 8 * vring.stage;
    mbar_wait(sm.bar_v_empty + 8 * vring.stage, vring.phase ^ 1);
    mbar_arrive_expect_tx(v_full, Tr::kVBytes);
#pragma unroll
    for (int c = 0; c < Tr::kChunksV; ++c)
      tma_load_4d(sm.sV + vring.stage * Tr::kVBytes + c * kBlockN * 128, tmap_v, v_full, c * 64, n0, x.hk, x.b);
    vring.advance();
  };
  int tile = blockIdx.x;
  post_tile_boundary(sm, ring, tid, tile);
  for (int k = 0; tile < a.num_tiles; ++k) {
    const FwdTile x = sched.tile_at(a, tile);
    const TileMask tm = TileMask::of(a, x.bhm, x.m0, x.m1, kBlockN, n_blocks, causal_offset);
    const int32_t* sri = a.sri ? a.sri + x.bhm * a.seqlen_k * a.mask_cols : nullptr;
    int next = 0;
    if (tid == 0) {
      next = claim_next_tile(a);  // used at the end of the tile: latency hidden
      // Q buffer k % kQBuffers, free once the consumers are done with tile k - kQBuffers.
      const int qb = k % Tr::kQBuffers;
      if (k >= Tr::kQBuffers) mbar_wait(sm.bar_q_empty + 8 * qb, (k / Tr::kQBuffers - 1) & 1);
      mbar_arrive_expect_tx(sm.bar_q + 8 * qb, Tr::kQBytes);
#pragma unroll
      for (int c = 0; c < Tr::kChunksQK; ++c)
        tma_load_4d(sm.sQ + qb * Tr::kQBytes + c * kBlockM * 128, tmap_q, sm.bar_q + 8 * qb, c * 64, x.m0, x.h, x.b);
    }
    for (int first = 0; first < n_blocks; first += Tr::kProducerThreads) {
      const int count = schedule_window<Tr::kProducerThreads, 1>(tm, first, sm.list, sm.warp_counts);
      for (int i = 0; i < count; ++i) {
        const int entry = sm.list[i];
        const int n0 = BlockEntry::block(entry) * kBlockN;
        mbar_wait(sm.bar_empty + 8 * ring.stage, ring.phase ^ 1);
        if (BlockEntry::partial(entry) && tid < kBlockN) {  // this thread's key column as visibility bits
          const ColumnBounds cb =
              column_bounds(sri, n0 + tid, a.seqlen_q, a.seqlen_k, a.mask_cols, a.causal, causal_offset);
          uint32_t* dst = sm.mask + ring.stage * Tr::kMaskStageInts + tid * Tr::kMaskWords;
#pragma unroll
          for (int w = 0; w < Tr::kMaskWords; ++w)
            dst[w] = visible_bits(cb, x.m0 + 32 * w) & tm.block_mask_bits(x.m0 + 32 * w, n0 + tid);
        }
        // Every producer thread arrives on "full" after its own stores (release); thread 0 also
        // arms the transaction count and issues the TMA loads.
        const uint32_t full = sm.bar_full + 8 * ring.stage;
        if (tid == 0) {
          sm.entry[ring.stage] = entry;
          if constexpr (kOverlap) {
            mbar_arrive_expect_tx(full, Tr::kKBytes);
#pragma unroll
            for (int c = 0; c < Tr::kChunksQK; ++c)
              tma_load_4d(sm.sK + ring.stage * Tr::kKBytes + c * kBlockN * 128, tmap_k, full, c * 64, n0, x.hk, x.b);
            // V on its own ring: the consumers hand its stage back after the block's product, which
            // completes during the next block.
            if (pending_v >= 0) load_v(pending_v, x);
            pending_v = n0;
          } else {
            mbar_arrive_expect_tx(full, Tr::kKBytes + Tr::kVBytes);
#pragma unroll
            for (int c = 0; c < Tr::kChunksQK; ++c)
              tma_load_4d(sm.sK + ring.stage * Tr::kKBytes + c * kBlockN * 128, tmap_k, full, c * 64, n0, x.hk, x.b);
#pragma unroll
            for (int c = 0; c < Tr::kChunksV; ++c)
              tma_load_4d(sm.sV + ring.stage * Tr::kVBytes + c * kBlockN * 128, tmap_v, full, c * 64, n0, x.hk, x.b);
          }
        } else {
          mbar_arrive(full);
        }
        ring.advance();
      }
    }
    if (kOverlap && tid == 0 && pending_v >= 0) {  // the tile's last V
      load_v(pending_v, x);
      pending_v = -1;
    }
    tile = share_next_tile(sm, tid, k, next);
    post_tile_boundary(sm, ring, tid, tile);
  }
}

}  // namespace fm3::hopper::sm90
