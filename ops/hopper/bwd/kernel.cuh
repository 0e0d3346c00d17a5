// FlashMask backward on Hopper: warp-specialized TMA + WGMMA
// (the FlashAttention-3 backward structure, Shah et al. 2024, made
// mask-aware as FlashMask, arXiv:2410.01359), built for sm_90a. This file composes the roles:
//   bwd/traits.cuh     tile sizes, register budgets, the dQ split, shared-memory layout (BwdSmem),
//                      the CTA's key block (BwdBlock)
//   bwd/producer.cuh   warp 0: K/V once; per query head the query-tile scheduler and the loads of
//                      Q, dO, lse2, delta into the ring
//   bwd/dq_writer.cuh  warp 1 (and 2): bulk fp32 reductions of each finished dQ tile into the workspace
//   bwd/mainloop.cuh   consumer warpgroups: S^T, dP^T, P^T / dS^T, dV, dQ, dK per query tile
//   bwd/mainloop_split_d.cuh  the same at head dims 192 and 256: two warpgroups sharing the keys,
//                      splitting the queries of S^T and the columns of dK, dV, dQ
//   bwd/mainloop_swap_dkv.cuh  192 and 192 / 128 on 64 x 96 tiles: S, dP with the queries on M,
//                      dK^T, dV^T with the head dim on M (and their epilogue)
//   bwd/epilogue.cuh   dK and dV, staged in shared memory, written with 16-byte stores
//   bwd/tile_scheduler.cuh  the key block of each CTA and the launch grid (default / deterministic order)
//
// One CTA = one (key block of kBlockN = 128 columns (64 at 192 and 256, 96 at 192 / 128), kv head,
// batch); 384 threads. Warpgroup 0, the producer (setmaxnreg down): warp 0 streams the surviving query tiles
// of every query head of the GQA group into a kStages-deep ring on mbarriers; warp 1 is the dQ
// writer (in deterministic mode warp 2 a second one, taking the odd tiles); the other warps exit.
// Warpgroups 1..2, the consumers (setmaxnreg up), 64 keys each (at 192 and 256 the same 64 keys,
// half the columns each; at 192 / 128 48 of the 96), drain the ring, keep dK and dV in registers over the whole GQA group and
// hand each tile's dQ to the writer.
// Measurements and the variants tried: BENCHMARKS.md (Hopper backward).
//
// The roles are __forceinline__ functions, and nvcc optimizes a function before inlining it: what
// a role is passed and what it computes itself can change the machine code. Check a change to
// their boundaries with tools/compare_sass.py against the build before it.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/dq_writer.cuh"
#include "bwd/mainloop.cuh"
#include "bwd/mainloop_split_d.cuh"
#include "bwd/mainloop_swap_dkv.cuh"
#include "bwd/producer.cuh"
#include "bwd/trace.cuh"
#include "bwd/tile_scheduler.cuh"
#include "bwd/traits.cuh"
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__global__ void __launch_bounds__(BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>::kThreads, 1)
    flash_bwd_wgmma_kernel(const __grid_constant__ bwd::BwdArgs a, const __grid_constant__ CUtensorMap tmap_q,
                           const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                           const __grid_constant__ CUtensorMap tmap_do) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const BwdSmem<Tr> sm(smem_raw);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // broadcast: the compiler sees it warp-uniform
  const BwdBlock blk = BwdTileScheduler<kBlockM, kBlockN>::block(a);
  bwd_trace(kTraceStart, tid == 0);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // lane 0 of producer warp 0 (+ transaction bytes); kSwapDkv: every lane, after its visibility bits
      mbar_init(sm.bar_full + 8 * s, Tr::kSwapDkv ? 32 : 1);
      // every consumer thread, and the deterministic dQ writer of the tile where it reads the ring (bwd/dq_writer.cuh)
      const bool writer_reads = Tr::kRingTileAhead && a.dq_semaphore != nullptr;
      mbar_init(sm.bar_empty + 8 * s, 128 * Tr::kConsumerWGs + (writer_reads ? 1 : 0));
    }
    mbar_init(sm.bar_kv, 1);
    mbar_init(sm.bar_dq_full, 128 * Tr::kConsumerWGs);
    mbar_init(sm.bar_dq_full + 8, 128 * Tr::kConsumerWGs);
    mbar_init(sm.bar_dq_empty, 1);
    for (int s = 0; Tr::kOwnDoRing && s < Tr::kStagesdO; ++s) {
      mbar_init(sm.bar_do_full + 8 * s, 1);                         // lane 0 of producer warp 0 (+ transaction bytes)
      mbar_init(sm.bar_do_empty + 8 * s, 128 * Tr::kConsumerWGs);  // every consumer thread
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    reg_dealloc<Tr::kProducerRegs>();
    const int writers = Tr::dq_writers(a.dq_semaphore != nullptr);
    if (lane == 0 && warp >= 1 && warp <= writers) {
      bwd_dq_writer(a, sm, blk, warp - 1);
      bwd_trace(kTraceWriterDone, warp == 1);
    }
    if (warp != 0) return;  // warp 0 schedules and loads
    bwd_producer<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>(a, sm, &tmap_q, &tmap_k, &tmap_v, &tmap_do, blk, lane);
    return;
  }
  reg_alloc<Tr::kConsumerRegs>();
  if constexpr (Tr::kSwapDkv)
    bwd_consumer_swap_dkv<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>(a, sm, blk, tid, warp, lane, wg);
  else if constexpr (Tr::kSplitD)
    bwd_consumer_split_d<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>(a, sm, blk, tid, warp, lane, wg);
  else
    bwd_consumer<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>(a, sm, blk, tid, warp, lane, wg);
}

}  // namespace fm3::hopper::sm90
