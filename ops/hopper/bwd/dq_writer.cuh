// Backward WGMMA kernel (flash_bwd_wgmma.cuh): the dQ writer, lane 0 of warp 1 of warpgroup 0 (only
// when dQ is accumulated atomically; deterministic mode leaves dQ to the row-parallel pass). Per
// query tile the consumers store their dQ parts to shared memory in accumulator order
// (bwd::dq_tile_offset) and arrive on dq_full; the writer adds each warpgroup's part to the
// tile-blocked fp32 workspace with one bulk reduction (cp.reduce.async.bulk .add.f32) and hands the
// buffer back on dq_empty once the reductions have read it. A workspace offset of -1 ends the
// stream.
#pragma once
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <class Tr>
__device__ __forceinline__ void bwd_dq_writer(const bwd::BwdArgs& a, const BwdSmem<Tr>& sm) {
  for (int k = 0;; ++k) {
    mbar_wait(sm.bar_dq_full, k & 1);
    const int64_t off = *sm.dq_off;
    if (off < 0) break;
#pragma unroll
    for (int part = 0; part < Tr::kConsumerWGs; ++part)
      bulk_reduce_add_f32(a.dq_accum + off + (Tr::kDqOwnPart ? part * Tr::kDqChunkFloats : 0),
                          sm.sdQ + part * Tr::kDqChunkFloats * 4, Tr::kDqChunkFloats * 4);
    bulk_commit();
    bulk_wait_read<0>();
    mbar_arrive(sm.bar_dq_empty);
  }
  bulk_wait<0>();  // every reduction has landed before the CTA exits
}

}  // namespace fm3::hopper::sm90
