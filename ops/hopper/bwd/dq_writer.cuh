// Backward WGMMA kernel (flash_bwd_wgmma.cuh): the dQ writer, lane 0 of warp 1 of warpgroup 0. Per
// query tile the consumers store their dQ parts to shared memory in accumulator order
// (bwd::dq_tile_offset) and arrive on dq_full; the writer adds each warpgroup's part to the
// tile-blocked fp32 workspace with one bulk reduction (cp.reduce.async.bulk .add.f32) and hands the
// buffer back on dq_empty once the reductions have read it. A workspace offset of -1 ends the
// stream. Deterministic mode (a.dq_semaphore): before adding a tile, the writer waits until the
// previous key block that contributes to that tile (the largest nb' < nb the producer of nb' would
// not skip, bwd::classify_pair) has added its part, and after its own reductions have landed it
// passes the tile on -- so every tile's sum is formed in key-block order. The chain only ever
// waits on blocks with a lower blockIdx.x, launched earlier, so it cannot deadlock.
#pragma once
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"
#include "bwd_common.cuh"  // classify_pair, mask_head, no_mask_summary (mask_scheduler.cuh)
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <class Tr>
__device__ __forceinline__ void bwd_dq_writer(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm, const BwdBlock& blk) {
  for (int k = 0;; ++k) {
    mbar_wait(sm.bar_dq_full, k & 1);
    const int64_t off = *sm.dq_off;
    if (off < 0) break;
    int32_t* sem = nullptr;
    if (a.dq_semaphore != nullptr) {
      // The tile from its workspace offset: (head_off + m0) * head_dim, head_off = (b * H + h) * lse_stride.
      const int64_t row = off / Tr::kDim;
      const int64_t bh = row / a.lse_stride;
      const int m0 = static_cast<int>(row % a.lse_stride);
      const int h = static_cast<int>(bh % a.num_heads);
      sem = a.dq_semaphore + bh * (a.lse_stride / Tr::kTileM) + m0 / Tr::kTileM;
      const int64_t bhm = static_cast<int64_t>(blk.b) * a.mask_heads + bwd::mask_head(a, h);
      const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
      int prev = blk.nb - 1;
      for (; prev >= 0; --prev) {
        const BlockSummary summ =
            a.summary ? a.summary[bhm * blk.n_kblocks + prev] : no_mask_summary(a.seqlen_q);
        if (bwd::classify_pair(summ, bm, a.bm_cols, m0, Tr::kTileM, prev * Tr::kTileN, Tr::kTileN, a.seqlen_q,
                               a.seqlen_k, a.causal, blk.causal_offset) != kFullyMasked)
          break;
      }
      if (prev >= 0)
        while (ld_acquire_gpu(sem) != prev + 1) __nanosleep(64);
      fence_proxy_async_global();  // the reductions below come after the predecessor's
    }
#pragma unroll
    for (int part = 0; part < Tr::kConsumerWGs; ++part) {
      bulk_reduce_add_f32(a.dq_accum + off + (Tr::kDqOwnPart ? part * Tr::kDqChunkFloats : 0),
                          sm.sdQ + part * Tr::kDqChunkFloats * 4, Tr::kDqChunkFloats * 4);
      if constexpr (!Tr::kDqOwnPart) {  // both parts add to the same elements: in order when deterministic
        if (sem != nullptr && part + 1 < Tr::kConsumerWGs) {
          bulk_commit();
          bulk_wait<0>();
        }
      }
    }
    bulk_commit();
    if (sem != nullptr) {
      bulk_wait<0>();              // the reductions have landed in global memory
      fence_proxy_async_global();  // ... before the tile is passed on
      st_release_gpu(sem, blk.nb + 1);
    } else {
      bulk_wait_read<0>();
    }
    mbar_arrive(sm.bar_dq_empty);
  }
  bulk_wait<0>();  // every reduction has landed before the CTA exits
}

}  // namespace fm3::hopper::sm90
