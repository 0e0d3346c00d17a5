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

// What the scheduler needs to know about one (batch, head, query tile).
struct TileMask {
  const BlockSummary* summary;  // [n_blocks] of this (batch, mask head); nullptr = no mask
  const int32_t* block_mask;    // [bm_rows, bm_cols] or nullptr
  int bm_cols;
  int seqlen_q, seqlen_k, block_n, n_blocks, causal_offset;
  bool causal;
  int m0, m1;

  // The class of key block nb for rows [m0, m1); the last block, which runs
  // past seqlen_k, is always partial (its tail columns are masked per element).
  __device__ __forceinline__ TileClass classify(int nb) const {
    const int n0 = nb * block_n, n1 = min(n0 + block_n, seqlen_k);
    BlockSummary s;
    if (summary != nullptr) {
      s = summary[nb];
    } else {  // no startend_row_indices: an empty mask ([S_q, S_q) and [0, 0))
      s = BlockSummary{seqlen_q, seqlen_q, seqlen_q, seqlen_q, 0, 0, 0, 0};
    }
    TileClass c = classify_tile(s, m0, m1, n0, n1, causal, causal_offset);
    c = apply_block_mask(c, block_mask, bm_cols, m0, m1, n0, n1);
    if (c == kUnmasked && n0 + block_n > seqlen_k) c = kPartial;
    return c;
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
