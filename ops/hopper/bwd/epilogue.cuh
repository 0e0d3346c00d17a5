// Backward WGMMA kernel (bwd/kernel.cuh): the consumers' epilogue, once per CTA. dK *
// softmax_scale and dV, in registers over the whole GQA group, are staged in shared memory (the Q /
// dO / dS^T ring, free once both warpgroups are past their last tile) in key rows padded to a
// conflict-free pitch, then written with 16-byte coalesced stores, each warpgroup its own 64 keys
// (or, at head dim 256, its own half of the columns of all 64). Columns past the real head dims (a
// padded tile head dim, kernel_rules.py) are not written: dK's past a.head_dim, dV's past a.head_dim_v.
#pragma once
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack

namespace fm3::hopper::sm90 {

// dk, dv: the mainloop's accumulators (bwd/mainloop.cuh, bwd/mainloop_split_d.cuh), columns
// [col0, col0 + kDkCols) of rows key_local and key_local + 8 in the order of BwdWgmmaTraits::acc_col;
// tid: this thread; cw: the consumer warpgroup; t: lane % 4.
template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kStages>
__device__ __forceinline__ void bwd_epilogue(const bwd::BwdArgs& a,
                                             const BwdSmem<BwdWgmmaTraits<T, kHeadDim, kBlockM, kBlockN, kStages>>& sm,
                                             const float (&dk)[BwdWgmmaTraits<T, kHeadDim, kBlockM, kBlockN, kStages>::kDkRegs],
                                             const float (&dv)[BwdWgmmaTraits<T, kHeadDim, kBlockM, kBlockN, kStages>::kDkRegs],
                                             const BwdBlock& blk, int tid, int key_local, int cw, int t) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kBlockM, kBlockN, kStages>;
  const int hk = blk.hk, b = blk.b, n0 = blk.n0;
  const int row0 = Tr::kSplitD ? 0 : cw * 64;           // this warpgroup's key rows ...
  const int col0 = Tr::kSplitD ? cw * Tr::kDkCols : 0;  // ... and columns
  named_barrier_sync(6, 128 * Tr::kConsumerWGs);
  unsigned char* stage_k = sm.base + Tr::kOffQ;
  unsigned char* stage_v = stage_k + kBlockN * Tr::kEpiPitch;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key_local + 8 * r;
#pragma unroll
    for (int j = 0; j < Tr::kDkCols / 8; ++j) {
      const int off = row * Tr::kEpiPitch + (Tr::acc_col(cw, j) + 2 * t) * 2;
      *reinterpret_cast<uint32_t*>(stage_k + off) = Mma<T>::pack(dk[j * 4 + 2 * r] * a.scale, dk[j * 4 + 2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(stage_v + off) = Mma<T>::pack(dv[j * 4 + 2 * r], dv[j * 4 + 2 * r + 1]);
    }
  }
  named_barrier_sync(4 + cw, 128);  // this warpgroup's rows are staged
  T* dkg = static_cast<T*>(a.dk) + b * a.k_bs + hk * a.k_hs;
  T* dvg = static_cast<T*>(a.dv) + b * a.v_bs + hk * a.v_hs;
  constexpr int kRowChunks = Tr::kDkCols / 8;  // this warpgroup's 16-byte chunks per key row
#pragma unroll
  for (int i = tid % 128; i < 64 * kRowChunks; i += 128) {
    const int row = row0 + i / kRowChunks, chunk = col0 / 8 + i % kRowChunks;
    const int key = n0 + row;
    if (key < a.seqlen_k) {
      const int off = row * Tr::kEpiPitch + chunk * 16;
      if (chunk * 8 < a.head_dim)
        *reinterpret_cast<uint4*>(dkg + static_cast<int64_t>(key) * a.k_rs + chunk * 8) =
            *reinterpret_cast<const uint4*>(stage_k + off);
      if (chunk * 8 < a.head_dim_v)
        *reinterpret_cast<uint4*>(dvg + static_cast<int64_t>(key) * a.v_rs + chunk * 8) =
            *reinterpret_cast<const uint4*>(stage_v + off);
    }
  }
}

}  // namespace fm3::hopper::sm90
