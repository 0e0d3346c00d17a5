// Backward WGMMA kernel (bwd/kernel.cuh): the dQ writer, lane 0 of warp 1 of warpgroup 0 (in
// deterministic mode also of warp 2). Per query tile the consumers store their dQ parts to shared
// memory in accumulator order (bwd::dq_tile_offset) and arrive on dq_full[tile % 2]; the writer
// adds each warpgroup's part to the tile-blocked fp32 workspace with one bulk reduction
// (cp.reduce.async.bulk .add.f32) and hands the buffer back on dq_empty once the reductions have
// read it. A workspace offset of -1 ends the stream. Deterministic mode (a.dq_semaphore): every tile's sum is formed in key-block order. Before
// adding a tile, the writer waits until the previous key block that contributes to that tile (the
// largest nb' < nb the producer of nb' would not skip, bwd::classify_pair; the search stops at the
// tile's first contributing key block, dq_chain_start_kernel) has added its part, and once its own
// reductions have landed it passes the tile on. The consumers wait for the writer only to hand back
// the buffer. Where the writers read their tiles from the Q / dO ring (Tr::kRingTileAhead), two of
// them take turns (even and odd tiles, Tr::kDetWriters): while one adds its tile, the other waits for
// its last one's reductions to land, passes it on, finds its next tile and waits for that tile's
// predecessor, so only the bulk reductions' read of the buffer is between two tiles' hand-offs. The
// chain only ever waits on blocks launched earlier (lower linear block index, see launch_wgmma), so it
// cannot deadlock.
#pragma once
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"
#include "bwd/common.cuh"  // adds_to_tile, mask_head
#include "fm3/mask.h"       // BlockEntry
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

// Adds the dQ tile in shared memory to the workspace at `off` (both warpgroups' parts, in order when
// they overlap and `ordered`) and waits until the bulk reductions have read the buffer.
// Only a part's groups of head-dim columns are added (Tr::dq_real_groups): where a part ends in zero
// padding, one reduction per 16-row warp slice ([wq][group][lane][4], 64 columns: its first groups).
template <class Tr>
__device__ __forceinline__ void dq_add_tile(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm, int64_t off, bool ordered) {
#pragma unroll
  for (int part = 0; part < Tr::kConsumerWGs; ++part) {
    float* const dst = a.dq_accum + off + (Tr::kDqOwnPart ? part * Tr::kDqWgFloats : 0);
    const uint32_t src = sm.sdQ + part * Tr::kDqWgFloats * 4;
    constexpr int kGroups = Tr::kDqCols / 8;
    const int groups = Tr::dq_real_groups(part);
    if (groups == kGroups) {
      bulk_reduce_add_f32(dst, src, Tr::kDqWgFloats * 4);
    } else if (groups > 0) {
      static_assert(Tr::kSplitD || Tr::kDqCols == 64, "a padded part: 4 warp slices of 8 column groups");
#pragma unroll
      for (int wq = 0; wq < 4; ++wq)
        bulk_reduce_add_f32(dst + wq * kGroups * 128, src + wq * kGroups * 512, groups * 512);
    }
    if constexpr (!Tr::kDqOwnPart) {  // both parts add to the same elements
      if (ordered && part + 1 < Tr::kConsumerWGs) {
        bulk_commit();
        bulk_wait<0>();
      }
    }
  }
  bulk_commit();
  bulk_wait_read<0>();
}

// Waits until the consumers have handed over dQ tile k (bwd/consumer_ring.cuh: tile k on dq_full[k % 2]).
template <class Tr>
__device__ __forceinline__ void wait_dq_full(const BwdSmem<Tr>& sm, int k) {
  mbar_wait(sm.bar_dq_full + 8 * (k & 1), (k >> 1) & 1);
}

// Deterministic mode (a.dq_semaphore set): the writer of tiles first, first + Tr::kDetWriters, ...
template <class Tr>
__device__ __forceinline__ void bwd_dq_writer_ordered(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm,
                                                      const BwdBlock& blk, int first) {
  int32_t* sem = nullptr;  // the next tile's semaphore (null at the end) and predecessor (-1: none)
  int prev = -1;
  auto chain_of = [&](int h, int m0) {
    const int64_t bh = static_cast<int64_t>(blk.b) * a.num_heads + h;
    sem = a.dq_semaphore + bh * (a.lse_stride / Tr::kTileM) + m0 / Tr::kTileM;
    const int64_t bhm = static_cast<int64_t>(blk.b) * a.mask_heads + bwd::mask_head(a, h);
    const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
    const int first = a.dq_chain_start[bhm * blk.n_mtiles + m0 / Tr::kTileM];  // <= blk.nb
    for (prev = blk.nb - 1; prev >= first; --prev)
      if (bwd::adds_to_tile(a, bhm, bm, m0, Tr::kTileM, prev, Tr::kTileN, blk.n_kblocks, blk.causal_offset)) break;
    if (prev < first) prev = -1;
  };
  // kRingTileAhead: the k-th tile of this CTA from the ring's entry (one stage per tile, in order).
  // The ring's empty barriers count one writer in this mode (bwd/kernel.cuh): the producer
  // refills the stage only after this read. (Tile 0's dQ hand-off waits for nothing, so the
  // consumers' release alone could let the producer overwrite the entry first.) The producer ends
  // the stream with one -1 entry per writer.
  auto find_tile = [&](int k) {
    const int stage = k % Tr::kNumStages;
    mbar_wait(sm.bar_full + 8 * stage, (k / Tr::kNumStages) & 1);
    const int entry = sm.entry[stage], h = sm.head[stage];
    sem = nullptr;
    if (entry < 0) return;
    mbar_arrive(sm.bar_empty + 8 * stage);
    chain_of(h, BlockEntry::block(entry) * Tr::kTileM);
  };
  auto wait_predecessor = [&]() {
    if (sem == nullptr) return;
    if (prev >= 0)
      while (ld_acquire_gpu(sem) != prev + 1) __nanosleep(64);
    fence_proxy_async_global();  // the reductions come after the predecessor's
  };
  constexpr bool kAhead = Tr::kRingTileAhead;
  constexpr int kStep = Tr::kDetWriters;  // 2 where the writers read the ring
  if constexpr (kAhead) find_tile(first);
  for (int k = first;; k += kStep) {
    if constexpr (kAhead) wait_predecessor();
    wait_dq_full(sm, k);
    const int64_t off = *sm.dq_off;
    if (off < 0) break;
    if constexpr (!kAhead) {  // the tile from its workspace offset: (head_off + m0) * head_dim
      const int64_t row = off / Tr::kDim;
      chain_of(static_cast<int>((row / a.lse_stride) % a.num_heads), static_cast<int>(row % a.lse_stride));
      wait_predecessor();
    }
    dq_add_tile<Tr>(a, sm, off, true);
    int32_t* const done = sem;
    mbar_arrive(sm.bar_dq_empty);  // the buffer is read: the consumers may store the next tile
    bulk_wait<0>();                // the reductions have landed in global memory
    fence_proxy_async_global();    // ... before the tile is passed on
    st_release_gpu(done, blk.nb + 1);
    // This writer's next tile, which may still be loading: meanwhile the other writer has the buffer.
    if constexpr (kAhead) find_tile(k + kStep);
  }
}

// first: 0, or 1 for the second deterministic writer (Tr::kDetWriters).
template <class Tr>
__device__ __forceinline__ void bwd_dq_writer(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm, const BwdBlock& blk,
                                              int first) {
  if (a.dq_semaphore != nullptr) {
    bwd_dq_writer_ordered<Tr>(a, sm, blk, first);
  } else {
    for (int k = 0;; ++k) {
      wait_dq_full(sm, k);
      const int64_t off = *sm.dq_off;
      if (off < 0) break;
      dq_add_tile<Tr>(a, sm, off, false);
      mbar_arrive(sm.bar_dq_empty);  // the buffer is read: the consumers may store the next tile
    }
  }
  bulk_wait<0>();  // every reduction has landed before the CTA exits
}

// Deterministic mode, before the main kernel: per (batch, mask head, query tile), the first key block
// whose producer does not skip the tile (n_kblocks if none). The writer's search for a tile's
// predecessor stops there instead of walking back over every earlier key block (a document's first
// block would otherwise read the summaries of all the documents before it, per tile).
template <int kTileM, int kTileN>
__global__ void __launch_bounds__(128)
    dq_chain_start_kernel(const __grid_constant__ bwd::BwdArgs a, int n_mtiles, int n_kblocks, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 128 + threadIdx.x;
  if (i >= n) return;
  const int64_t bhm = i / n_mtiles;
  const int m0 = static_cast<int>(i % n_mtiles) * kTileM;
  const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
  int nb = 0;
  for (; nb < n_kblocks; ++nb)
    if (bwd::adds_to_tile(a, bhm, bm, m0, kTileM, nb, kTileN, n_kblocks,
                          causal_offset_of(a.seqlen_q, a.seqlen_k)))
      break;
  a.dq_chain_start[i] = nb;
}

}  // namespace fm3::hopper::sm90
