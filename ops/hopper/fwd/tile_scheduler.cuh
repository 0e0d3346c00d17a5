// Forward WGMMA kernel (fwd/kernel.cuh): the persistent tile scheduler. CTAs take query tiles
// (batch, head, kBlockM rows) one after another from a global counter (dynamic: a CTA that drew
// light tiles takes more). The order is heaviest first within each (batch, head): bottom tiles
// first, as they see the most keys under causal-like masks; heads stay contiguous so CTAs working
// at the same time share K/V in L2.
// Tile boundaries travel through the K/V ring: the producer posts an entry -1 - t that ends a
// tile's block list and names the next tile t (the first entry names the CTA's first tile,
// blockIdx.x); t >= num_tiles ends the CTA.
#pragma once
#include <stdint.h>

#include "attn_args.h"  // FwdArgs
#include "fwd/traits.cuh"
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

struct FwdTile {
  int m0, m1, h, hk, b;
  int64_t bhm;  // (batch, mask head) row of the mask tensors
};

template <int kBlockM>
struct FwdTileScheduler {
  int n_mtiles;  // query tiles per (batch, head)
  int group;     // query heads per kv head

  // Tile t: (batch, head) = t / n_mtiles, query tile counted from the bottom.
  __device__ __forceinline__ FwdTile tile_at(const FwdArgs& a, int t) const {
    FwdTile x;
    const int bh = t / n_mtiles;
    x.m0 = (n_mtiles - 1 - t % n_mtiles) * kBlockM;
    x.m1 = min(x.m0 + kBlockM, a.seqlen_q);
    x.h = bh % a.num_heads;
    x.b = bh / a.num_heads;
    x.hk = x.h / group;
    const int hm = mask_head_of(x.h, x.hk, a.num_heads, a.mask_heads);
    x.bhm = static_cast<int64_t>(x.b) * a.mask_heads + hm;
    return x;
  }
};

// One producer thread claims the tile after those already taken.
__device__ __forceinline__ int claim_next_tile(const FwdArgs& a) { return gridDim.x + atomicAdd(a.tile_counter, 1); }

// The claimed tile `next` (valid in thread 0) to every producer thread, on named barrier 1; by tile
// parity k & 1, so a slow reader of a slot is never overwritten.
template <class Tr>
__device__ __forceinline__ int share_next_tile(const FwdSmem<Tr>& sm, int tid, int k, int next) {
  if (tid == 0) sm.tile[k & 1] = next;
  named_barrier_sync(1, Tr::kProducerThreads);
  return sm.tile[k & 1];
}

// Producer: a tile boundary naming next_tile in the next stage; every producer thread arrives
// (the "full" barrier counts all of them).
template <class Tr>
__device__ __forceinline__ void post_tile_boundary(const FwdSmem<Tr>& sm, RingCursor<Tr::kNumStages>& ring, int tid,
                                                   int next_tile) {
  mbar_wait(sm.bar_empty + 8 * ring.stage, ring.phase ^ 1);
  if (tid == 0) sm.entry[ring.stage] = -1 - next_tile;
  mbar_arrive(sm.bar_full + 8 * ring.stage);
  ring.advance();
}

// Consumers: an entry is a tile boundary when negative; the tile it names.
__device__ __forceinline__ bool is_tile_boundary(int entry) { return entry < 0; }
__device__ __forceinline__ int boundary_tile(int entry) { return -1 - entry; }

// Consumers: the CTA's first tile, from the boundary that opens the ring.
template <class Tr>
__device__ __forceinline__ int first_tile(const FwdSmem<Tr>& sm, RingCursor<Tr::kNumStages>& ring) {
  mbar_wait(sm.bar_full + 8 * ring.stage, ring.phase);
  const int tile = boundary_tile(sm.entry[ring.stage]);
  mbar_arrive(sm.bar_empty + 8 * ring.stage);
  ring.advance();
  return tile;
}

}  // namespace fm3::hopper::sm90
