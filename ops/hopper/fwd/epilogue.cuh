// Forward WGMMA kernel (fwd/kernel.cuh): the consumers' epilogue of a tile: normalize, write O and
// lse (RowEnd: the learnable sink joins here). Two ways to write O:
// - staged (where TMA describes out and D_v <= D): each consumer warpgroup writes its 64
//   rows into the tile's Q buffer, which its products no longer read, in the TMA box layout; one
//   thread stores them with TMA and hands the buffer back (q_empty) once the store has read it.
// - direct: pairs of elements per thread straight to global memory (the Q buffer was handed back
//   before the epilogue, so the next tile's Q loads meanwhile).
#pragma once
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"             // FwdArgs
#include "fwd/tile_scheduler.cuh"  // FwdTile
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"     // Mma<T>::pack, RowEnd

namespace fm3::hopper::sm90 {

// o, row_max, row_sum: the mainloop's result (fwd/mainloop.cuh); row_base: this thread's tile-local
// rows row_base and row_base + 8; t: lane % 4. Calls put(r, d, packed pair) for O's columns
// d * 8 + 2t, + 1 of row row_base + 8r (Put::kAllRows: also rows past seqlen_q) and writes lse.
template <int kHeadDimV, typename Put>
__device__ __forceinline__ void fwd_epilogue_rows(const FwdArgs& a, const FwdTile& x, const float (&o)[kHeadDimV / 2],
                                                  const float (&row_max)[2], const float (&row_sum)[2], int row_base,
                                                  int t, Put put) {
  using T = typename Put::T;
  float* lse = a.lse + (static_cast<int64_t>(x.b) * a.num_heads + x.h) * a.seqlen_q;
  const float sink = sink_log2(a.learnable_sink, x.h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const RowEnd e(row_sum[r], row_max[r], sink);
    const int row = x.m0 + row_base + r * 8;
    if (Put::kAllRows || row < a.seqlen_q) {
#pragma unroll
      for (int d = 0; d < kHeadDimV / 8; ++d)
        put(r, d, Mma<T>::pack(o[d * 4 + 2 * r] * e.o_scale, o[d * 4 + 2 * r + 1] * e.o_scale));
    }
    if (t == 0 && row < a.seqlen_q) lse[row] = e.lse;
  }
}

template <typename T_>
struct PutGlobal {  // direct: row-major out
  using T = T_;
  static constexpr bool kAllRows = false;
  T* dst;  // this thread's first element (row row_base, column 2t)
  int64_t rs;
  __device__ __forceinline__ void operator()(int r, int d, uint32_t v) const {
    *reinterpret_cast<uint32_t*>(dst + r * 8 * rs + d * 8) = v;
  }
};

template <typename T_, int kBlockM>
struct PutShared {  // staged: 64-column sub-tiles of kBlockM rows x 128 bytes (swizzle128; each row's part once)
  using T = T_;
  static constexpr bool kAllRows = true;  // rows past the end are clipped by the TMA store
  uint32_t row_addr[2];  // the Q buffer + this thread's rows' offsets + 4t
  int g;                 // row % 8 (lane / 4): the rows' swizzle
  __device__ __forceinline__ void operator()(int r, int d, uint32_t v) const {
    const uint32_t addr = row_addr[r] + (d / 8) * (kBlockM * 128) + (((d % 8) ^ g) * 16);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
  }
};

template <typename T, int kHeadDimV>
__device__ __forceinline__ void fwd_epilogue(const FwdArgs& a, const FwdTile& x, const float (&o)[kHeadDimV / 2],
                                             const float (&row_max)[2], const float (&row_sum)[2], int row_base,
                                             int t) {
  T* og = static_cast<T*>(a.out) + x.b * a.o_bs + x.h * a.o_hs;
  const PutGlobal<T> put{og + static_cast<int64_t>(x.m0 + row_base) * a.o_rs + 2 * t, a.o_rs};
  fwd_epilogue_rows<kHeadDimV>(a, x, o, row_max, row_sum, row_base, t, put);
}

// Staged: sq is the tile's Q buffer; cw, wq, lane: consumer warpgroup, warp within it, lane.
template <typename T, int kHeadDimV, int kBlockM>
__device__ __forceinline__ void fwd_epilogue_staged(const FwdArgs& a, const FwdTile& x, const float (&o)[kHeadDimV / 2],
                                                    const float (&row_max)[2], const float (&row_sum)[2],
                                                    int row_base, int t, uint32_t sq, const CUtensorMap* tmap_o,
                                                    uint32_t bar_q_empty, int cw, int wq, int lane) {
  const PutShared<T, kBlockM> put{{sq + row_base * 128 + 4 * t, sq + (row_base + 8) * 128 + 4 * t}, lane / 4};
  fwd_epilogue_rows<kHeadDimV>(a, x, o, row_max, row_sum, row_base, t, put);
  fence_proxy_async();                    // the writes, visible to the TMA store
  named_barrier_sync(2 + cw, 128);        // the warpgroup's 64 rows are written
  if (wq == 0 && lane == 0) {
#pragma unroll
    for (int j = 0; j < (kHeadDimV + 63) / 64; ++j)
      tma_store_4d(tmap_o, sq + j * (kBlockM * 128) + cw * 64 * 128, j * 64, x.m0 + cw * 64, x.h, x.b);
    bulk_commit();
    bulk_wait_read<0>();
    mbar_arrive(bar_q_empty, 128);  // for the warpgroup: the store has read the buffer
  }
}

}  // namespace fm3::hopper::sm90
