// Forward WGMMA kernel (fwd/kernel.cuh): the consumers' epilogue of a tile: normalize, write O
// (pairs of elements per thread) and lse (RowEnd: the learnable sink joins here).
#pragma once
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"             // FwdArgs
#include "fwd/tile_scheduler.cuh"  // FwdTile
#include "warp_primitives.cuh"     // Mma<T>::pack

namespace fm3::hopper::sm90 {

// o, row_max, row_sum: the mainloop's result (fwd/mainloop.cuh); row_base: this thread's tile-local
// rows row_base and row_base + 8; t: lane % 4.
template <typename T, int kHeadDimV>
__device__ __forceinline__ void fwd_epilogue(const FwdArgs& a, const FwdTile& x, const float (&o)[kHeadDimV / 2],
                                             const float (&row_max)[2], const float (&row_sum)[2], int row_base,
                                             int t) {
  float* lse = a.lse + (static_cast<int64_t>(x.b) * a.num_heads + x.h) * a.seqlen_q;
  T* og = static_cast<T*>(a.out) + x.b * a.o_bs + x.h * a.o_hs;
  const float sink = sink_log2(a.learnable_sink, x.h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const RowEnd e(row_sum[r], row_max[r], sink);
    const float inv = e.o_scale;
    const int row = x.m0 + row_base + r * 8;
    if (row < a.seqlen_q) {
      T* dst = og + static_cast<int64_t>(row) * a.o_rs + 2 * t;
#pragma unroll
      for (int d = 0; d < kHeadDimV / 8; ++d)
        *reinterpret_cast<uint32_t*>(dst + d * 8) = Mma<T>::pack(o[d * 4 + 2 * r] * inv, o[d * 4 + 2 * r + 1] * inv);
      if (t == 0) lse[row] = e.lse;
    }
  }
}

}  // namespace fm3::hopper::sm90
