// Backward WGMMA kernel (bwd/kernel.cuh): the key block, kv head and batch of each CTA (one CTA
// per key block of kBlockN keys), and the grid that launches them.
// - Default: the key blocks of a (batch, kv head) side by side (blockIdx.x), so the CTAs resident
//   at once share that head's Q and dO in L2.
// - Deterministic (dQ added in key-block order, bwd/dq_writer.cuh): each key block adds its dQ parts
//   after the previous one of its head. With all key blocks of a head side by side the k-th
//   resident one runs k write latencies behind the first; with (batch, kv head) varying fastest,
//   dQ's fp32 sums no longer meet in L2. Groups of kDetKeyGroup key blocks per (batch, kv head), with
//   the query tiles walked from the last (bwd/producer.cuh), keep most of both (BENCHMARKS.md,
//   deterministic mode).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"  // BwdBlock

namespace fm3::hopper::sm90 {

constexpr int kDetKeyGroup = 8;

template <int kBlockM, int kBlockN>
struct BwdTileScheduler {
  __host__ __device__ static int key_blocks(const bwd::BwdArgs& a) { return (a.seqlen_k + kBlockN - 1) / kBlockN; }

  // Host: the grid of the main kernel (deterministic: a.dq_semaphore set).
  static dim3 grid(const bwd::BwdArgs& a) {
    if (a.dq_semaphore == nullptr) return dim3(key_blocks(a), a.num_heads_k, a.batch);
    return dim3(static_cast<unsigned>(static_cast<int64_t>(key_blocks(a)) * a.num_heads_k * a.batch));
  }

  // Device: this CTA's key block and the sizes every role derives from the arguments.
  __device__ __forceinline__ static BwdBlock block(const bwd::BwdArgs& a) {
    BwdBlock blk;
    if (a.dq_semaphore == nullptr) {
      blk.nb = blockIdx.x;
      blk.hk = blockIdx.y;
      blk.b = blockIdx.z;
    } else {  // groups of kDetKeyGroup key blocks, then (batch, kv head)
      const int bh_count = a.num_heads_k * a.batch, n_kblocks = key_blocks(a);
      constexpr int g = kDetKeyGroup;
      const int64_t linear = blockIdx.x;
      const int nb_base = static_cast<int>(min(linear / (static_cast<int64_t>(g) * bh_count),
                                               static_cast<int64_t>((n_kblocks - 1) / g))) * g;
      const int gs = min(g, n_kblocks - nb_base);  // the last group may be short
      const int r = static_cast<int>(linear - static_cast<int64_t>(nb_base) * bh_count);
      const int bh = r / gs;
      blk.nb = nb_base + r % gs;
      blk.hk = bh % a.num_heads_k;
      blk.b = bh / a.num_heads_k;
    }
    blk.n0 = blk.nb * kBlockN;
    blk.group = a.num_heads / a.num_heads_k;
    blk.n_mtiles = (a.seqlen_q + kBlockM - 1) / kBlockM;
    blk.n_kblocks = key_blocks(a);
    blk.causal_offset = causal_offset_of(a.seqlen_q, a.seqlen_k);
    return blk;
  }
};

}  // namespace fm3::hopper::sm90
