// Backward WGMMA kernel (bwd/kernel.cuh): the per-element steps between the products, shared by
// both consumer loops (bwd/mainloop.cuh and, at head dim 256, bwd/mainloop_split_d.cuh). A thread's
// S^T / dP^T accumulator i = 4 j + 2 r + c holds key row r (its keys key and key + 8) and query
// q0 + 8 j + 2 t + c of the tile (j < kQ / 8); stats(j) is the float2 of queries 8 j + 2 t, + 1's lse2
// or delta.
#pragma once
#include "fm3/mask.h"           // ColumnBounds, row_masked
#include "warp_primitives.cuh"  // fast_exp2

namespace fm3::hopper::sm90 {

// f(i, r, stat, q) for each accumulator i = 4 j + 2 r + c of this thread: r its key row, stat the
// lse2 or delta of its query, q = 8 j + 2 t + c that query's offset from the thread's first row.
template <int kQ, class Stats, class F>
__device__ __forceinline__ void bwd_for_each_elem(Stats stats_of, int t, F f) {
#pragma unroll
  for (int j = 0; j < kQ / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float2 st = stats_of(j);
      const float stat = c == 0 ? st.x : st.y;
#pragma unroll
      for (int r = 0; r < 2; ++r) f(j * 4 + 2 * r + c, r, stat, j * 8 + 2 * t + c);
    }
}

// P^T = exp2(S^T * scale_log2 - lse2) in place (lse2 = +inf, an empty row or padding, gives 0); with
// kMasked, 0 where the row (first row row0 of this thread's queries) is masked for the column
// (cb[r]). Two instances, so that tiles without masked elements carry no per-element test.
template <int kQ, bool kMasked, class Lse2>
__device__ __forceinline__ void bwd_p_from_s(float (&s)[kQ / 2], Lse2 lse2_of, float scale_log2, const ColumnBounds* cb,
                                             int row0, int t) {
  bwd_for_each_elem<kQ>(lse2_of, t, [&](int i, int r, float lse2, int q) {
    float p = fast_exp2(s[i] * scale_log2 - lse2);
    if constexpr (kMasked) {
      if (row_masked(cb[r], row0 + q)) p = 0.f;
    }
    s[i] = p;
  });
}

// dS^T = P^T (dP^T - delta) in place of dP^T.
template <int kQ, class Delta>
__device__ __forceinline__ void bwd_ds_from_dp(float (&dp)[kQ / 2], const float (&p)[kQ / 2], Delta delta_of, int t) {
  bwd_for_each_elem<kQ>(delta_of, t, [&](int i, int, float dl, int) { dp[i] = p[i] * (dp[i] - dl); });
}

}  // namespace fm3::hopper::sm90
