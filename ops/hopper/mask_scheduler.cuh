// Mask scheduler: classifies the key blocks of one query tile from the block
// summary (fm3::classify_tile + fm3::apply_block_mask, mask.h) and publishes a
// compacted list of the surviving blocks in shared memory, each tagged partial
// (per-element mask needed) or unmasked. A fully masked block never appears in
// the list: it is never loaded and never computed.
//
// The list is built a window of kThreads key blocks at a time (one block per
// thread, warp ballots + a shared prefix over warps), so shared memory stays
// O(kThreads) for any seqlen_k.
#pragma once
#include <stdint.h>

#include "fm3/mask.h"

namespace fm3::hopper {

// One entry of the compacted list: key block index and its tag.
struct BlockEntry {
  static __device__ __forceinline__ int pack(int block, bool partial) { return block * 2 + (partial ? 1 : 0); }
  static __device__ __forceinline__ int block(int e) { return e >> 1; }
  static __device__ __forceinline__ bool partial(int e) { return e & 1; }
};

// The summary of the empty mask (no startend_row_indices): [S_q, S_q) and [0, 0).
__device__ __forceinline__ BlockSummary no_mask_summary(int seqlen_q) {
  return BlockSummary{seqlen_q, seqlen_q, seqlen_q, seqlen_q, 0, 0, 0, 0};
}

// Class of (query rows [m0, m1), key block [n0, n0 + block_n), n1 = min(n0 + block_n, seqlen_k))
// from the block's summary s and the block_mask bm (or nullptr); a key block running past seqlen_k
// is partial (its tail columns are masked per element). The forward's and the backward's schedulers
// both decide with this.
__device__ __forceinline__ TileClass classify_block(const BlockSummary& s, const int32_t* bm, int bm_cols, int m0,
                                                    int m1, int n0, int n1, int block_n, int seqlen_k, bool causal,
                                                    int causal_offset) {
  TileClass c = classify_tile(s, m0, m1, n0, n1, causal, causal_offset);
  c = apply_block_mask(c, bm, bm_cols, m0, m1, n0, n1);
  if (c == kUnmasked && n0 + block_n > seqlen_k) c = kPartial;
  return c;
}

// What the scheduler needs to know about one (batch, head, query tile).
struct TileMask {
  const BlockSummary* summary;  // [n_blocks] of this (batch, mask head); nullptr = no mask
  const int32_t* block_mask;    // [bm_rows, bm_cols] or nullptr
  int bm_cols;
  int seqlen_q, seqlen_k, block_n, n_blocks, causal_offset;
  bool causal;
  int m0, m1;

  // The key blocks of rows [m0, m1) of (batch, mask head) bhm, blocks of block_n keys.
  template <class Args>
  static __device__ __forceinline__ TileMask of(const Args& a, int64_t bhm, int m0, int m1, int block_n,
                                                int n_blocks, int causal_offset) {
    TileMask tm;
    tm.summary = a.summary ? a.summary + bhm * n_blocks : nullptr;
    tm.block_mask = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
    tm.bm_cols = a.bm_cols;
    tm.seqlen_q = a.seqlen_q;
    tm.seqlen_k = a.seqlen_k;
    tm.block_n = block_n;
    tm.n_blocks = n_blocks;
    tm.causal_offset = causal_offset;
    tm.causal = a.causal;
    tm.m0 = m0;
    tm.m1 = m1;
    return tm;
  }

  // block_mask as a visibility word: rows [r0, r0 + 32) (inside one 128-row block) of key column col
  // all 0 where its block is dropped, else all 1 (the key column's bounds decide).
  __device__ __forceinline__ uint32_t block_mask_bits(int r0, int col) const {
    if (block_mask == nullptr || r0 >= seqlen_q || col >= seqlen_k) return ~0u;
    return block_kept(block_mask, bm_cols, r0, col) ? ~0u : 0u;
  }

  // The class of key block nb for rows [m0, m1).
  __device__ __forceinline__ TileClass classify(int nb) const {
    const int n0 = nb * block_n, n1 = min(n0 + block_n, seqlen_k);
    BlockSummary s;
    if (summary != nullptr) {
      s = summary[nb];
    } else {
      s = no_mask_summary(seqlen_q);
    }
    return classify_block(s, block_mask, bm_cols, m0, m1, n0, n1, block_n, seqlen_k, causal, causal_offset);
  }
};

template <int kThreads, int kBarrier>
__device__ __forceinline__ void sync_scheduler() {
  if constexpr (kBarrier == 0) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kBarrier), "n"(kThreads) : "memory");
  }
}

// Classify items [first, first + kThreads) of [0, n_items) with classify(item)
// (key blocks of a query tile in the forward, query tiles of a key block in the
// backward) and write the survivors, ascending, to list[0, count) as
// BlockEntry::pack(item, partial). All kThreads threads must call it; it ends
// with a barrier (see kBarrier), after which list and the return value are
// valid in every thread. warp_counts: shared int[kThreads / 32].
// kBarrier = 0 synchronizes with __syncthreads (all threads of the CTA take
// part); kBarrier > 0 uses that named barrier, and only threads
// [0, kThreads) of the CTA call it (the producer warpgroup of the
// warp-specialized kernels).
template <int kThreads, int kBarrier = 0, class Classify>
__device__ __forceinline__ int compact_window(const Classify& classify, int first, int n_items, int* list,
                                              int* warp_counts) {
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int item = first + tid;
  TileClass c = kFullyMasked;
  if (item < n_items) c = classify(item);
  const bool keep = c != kFullyMasked;
  const unsigned ballot = __ballot_sync(0xffffffffu, keep);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  sync_scheduler<kThreads, kBarrier>();
  int offset = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int n = warp_counts[w];
    offset += w < warp ? n : 0;
    total += n;
  }
  if (keep) list[offset + __popc(ballot & ((1u << lane) - 1u))] = BlockEntry::pack(item, c == kPartial);
  sync_scheduler<kThreads, kBarrier>();
  return total;
}

// The forward's window: key blocks of one query tile.
template <int kThreads, int kBarrier = 0>
__device__ __forceinline__ int schedule_window(const TileMask& tm, int first, int* list, int* warp_counts) {
  return compact_window<kThreads, kBarrier>([&](int nb) { return tm.classify(nb); }, first, tm.n_blocks, list,
                                            warp_counts);
}

}  // namespace fm3::hopper
