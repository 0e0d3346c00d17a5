// FlashMask forward on Hopper: persistent, warp-specialized TMA + WGMMA
// (docs/design.md, "Kernels"), built for sm_90a. This file composes the roles:
//   fwd/traits.cuh          tile sizes, register budgets, shared-memory layout, the K/V ring cursor
//   fwd/tile_scheduler.cuh  global tile counter, heaviest-first order, tile boundaries in the ring
//   fwd/producer.cuh        warpgroup 0: mask scheduling, visibility bits, TMA loads of Q, K, V
//   fwd/mainloop.cuh        consumer warpgroups: S = Q K^T, mask, online softmax, O += P V per tile
//   fwd/epilogue.cuh        O and lse of a finished tile
//
// Persistent: one CTA per SM, 128 * (1 + kConsumerWGs) threads, takes query tiles (batch, head,
// kBlockM = 64 * kConsumerWGs rows) one after another. Warpgroup 0, the producer (setmaxnreg down
// to kProducerRegs), fills a kStages-deep shared-memory ring of K/V blocks on mbarriers;
// warpgroups 1..kConsumerWGs, the consumers (setmaxnreg up to kConsumerRegs), 64 query rows each,
// drain it.
// The producer runs ahead into the next tile while the consumers finish the current one (Q
// reloaded once they release it), so per-tile set-up and the epilogue are hidden.
//
// The roles are __forceinline__ functions, and nvcc optimizes a function before inlining it: what
// a role is passed and what it computes itself can change the machine code. Check a change to
// their boundaries with tools/compare_sass.py against the build before it.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn_args.h"  // FwdArgs
#include "fwd/epilogue.cuh"
#include "fwd/mainloop.cuh"
#include "fwd/producer.cuh"
#include "fwd/tile_scheduler.cuh"
#include "fwd/traits.cuh"
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages, bool kOverlap>
__global__ void __launch_bounds__(FwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>::kThreads, 1)
    flash_fwd_wgmma_kernel(const __grid_constant__ FwdArgs a, const __grid_constant__ CUtensorMap tmap_q,
                           const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                           const __grid_constant__ CUtensorMap tmap_o) {
  using Tr = FwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const FwdSmem<Tr> sm(smem_raw);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // broadcast: the compiler sees it warp-uniform
  const int n_mtiles = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_blocks = (a.seqlen_k + kBlockN - 1) / kBlockN;
  const int causal_offset = causal_offset_of(a.seqlen_q, a.seqlen_k);
  const int group = a.num_heads / a.num_heads_k;
  const FwdTileScheduler<kBlockM> sched{n_mtiles, group};

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(sm.bar_full + 8 * s, Tr::kProducerThreads);       // every producer thread
      mbar_init(sm.bar_empty + 8 * s, Tr::kConsumerWarps * 32);  // every consumer thread
      if constexpr (kOverlap) {
        mbar_init(sm.bar_v_full + 8 * s, 1);                        // producer thread 0 (+ transaction bytes)
        mbar_init(sm.bar_v_empty + 8 * s, Tr::kConsumerWarps * 32);
      }
    }
    for (int qb = 0; qb < 2; ++qb) {
      mbar_init(sm.bar_q + 8 * qb, 1);
      mbar_init(sm.bar_q_empty + 8 * qb, Tr::kConsumerWarps * 32);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    reg_dealloc<Tr::kProducerRegs>();
    fwd_producer<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>(a, sm, sched, &tmap_q, &tmap_k, &tmap_v, tid, lane, n_blocks,
                                                         causal_offset);
    return;
  }
  reg_alloc<Tr::kConsumerRegs>();
  fwd_consumer<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>(a, sm, sched, &tmap_o, wg, warp, lane);
}

}  // namespace fm3::hopper::sm90
