// Backward WGMMA kernel (bwd/kernel.cuh): the consumers' side of the Q / dO ring and of the dQ
// hand-off to the writer warp, shared by the consumer loops (bwd/mainloop.cuh, bwd/mainloop_split_d.cuh
// at head dim 256, bwd/mainloop_swap_dkv.cuh at 192 and 192/128).
#pragma once
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"
#include "bwd/common.cuh"  // mask_head
#include "fm3/mask.h"      // BlockEntry, ColumnBounds, column_bounds
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <class Tr>
struct BwdConsumerRing {
  RingCursor<Tr::kNumStages> q;  // the Q / dO / lse2 / delta ring
  int cur_h = -1, cur_hm = -1, hm = 0;
  int64_t head_off = 0;  // (b * num_heads + h) * lse_stride: the tile's head in lse2 / delta / the dQ workspace
  ColumnBounds cb[2];    // this thread's two key columns' row intervals (partial tiles)
  int dq_count = 0;      // dQ tiles handed to the writer

  // Waits for the next tile; false at the end of the stream. Per query head its offset (the division
  // stays out of the tile loop), per mask head on a partial tile the bounds of this thread's key
  // columns key and key + 8.
  __device__ __forceinline__ bool next(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm, const BwdBlock& blk, int key,
                                       int& m0, bool& partial) {
    mbar_wait(sm.bar_full + 8 * q.stage, q.phase);
    const int entry = sm.entry[q.stage];
    if (entry < 0) return false;
    const int h = sm.head[q.stage];
    m0 = BlockEntry::block(entry) * Tr::kTileM;
    partial = BlockEntry::partial(entry);
    if (h != cur_h) {
      cur_h = h;
      hm = bwd::mask_head(a, h);
      head_off = (static_cast<int64_t>(blk.b) * a.num_heads + h) * a.lse_stride;
    }
    if (!Tr::kSwapDkv && partial && hm != cur_hm) {  // (kSwapDkv: the producer's visibility bits)
      const int64_t bhm = static_cast<int64_t>(blk.b) * a.mask_heads + hm;
      const int32_t* sri = a.sri ? a.sri + bhm * a.seqlen_k * a.mask_cols : nullptr;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        cb[r] = column_bounds(sri, blk.n0 + key + 8 * r, a.seqlen_q, a.seqlen_k, a.mask_cols, a.causal,
                              blk.causal_offset);
      cur_hm = hm;
    }
    return true;
  }
  // Tr::kOwnDoRing: the tile's dO stage, waited for apart from Q and handed back on its own.
  RingCursor<Tr::kStagesdO> dO;
  __device__ __forceinline__ void wait_do(const BwdSmem<Tr>& sm) const {
    if constexpr (Tr::kOwnDoRing) mbar_wait(sm.bar_do_full + 8 * dO.stage, dO.phase);
  }
  __device__ __forceinline__ void release_do(const BwdSmem<Tr>& sm) {
    if constexpr (Tr::kOwnDoRing) {
      mbar_arrive(sm.bar_do_empty + 8 * dO.stage);
      dO.advance();
    }
  }
  // This thread is done with the stage's Q, dO (without kOwnDoRing), lse2 and delta.
  __device__ __forceinline__ void release(const BwdSmem<Tr>& sm) {
    mbar_arrive(sm.bar_empty + 8 * q.stage);
    q.advance();
  }
  // The dQ buffer: wait until the writer has read the previous tile's; after this thread's stores,
  // hand the tile at workspace offset `off` (-1: the end of the stream) to the writer. Tile k goes
  // on dq_full[k % 2] (a deterministic writer per parity, bwd/dq_writer.cuh); the end on both.
  __device__ __forceinline__ void wait_dq_buffer(const BwdSmem<Tr>& sm) const {
    if (dq_count > 0) mbar_wait(sm.bar_dq_empty, (dq_count - 1) & 1);
  }
  __device__ __forceinline__ void hand_dq(const BwdSmem<Tr>& sm, int64_t off, bool leader) {
    if (leader) *sm.dq_off = off;
    mbar_arrive(sm.bar_dq_full + 8 * (dq_count & 1));
    if (off < 0) mbar_arrive(sm.bar_dq_full + 8 * (~dq_count & 1));
    ++dq_count;
  }
};

}  // namespace fm3::hopper::sm90
