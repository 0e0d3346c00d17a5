// Backward WGMMA kernel (bwd/kernel.cuh): the consumers' epilogue, once per CTA. dK *
// softmax_scale and dV, in registers over the whole GQA group, are staged in shared memory (the Q /
// dO / dS^T ring, free once both warpgroups are past their last tile) in key rows padded to a
// conflict-free pitch, then written with 16-byte coalesced stores, each warpgroup its own 64 keys
// (or, on the split-D path, its own half of the columns of all 64). Columns past the real head dims (a
// padded tile head dim, kernel_rules.py) are not written: dK's past a.head_dim, dV's past a.head_dim_v.
#pragma once
#include <stdint.h>

#include "attn_args.h"  // BwdArgs
#include "bwd/traits.cuh"
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack

namespace fm3::hopper::sm90 {

// dk, dv: the mainloop's accumulators (bwd/mainloop.cuh, bwd/mainloop_split_d.cuh), this warpgroup's
// kDkCols / kDvCols columns of rows key_local and key_local + 8 in the order of BwdWgmmaTraits::acc_col;
// tid: this thread; cw: the consumer warpgroup; t: lane % 4.
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
__device__ __forceinline__ void bwd_epilogue(const bwd::BwdArgs& a,
                                             const BwdSmem<BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>>& sm,
                                             const float (&dk)[BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>::kDkRegs],
                                             const float (&dv)[BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>::kDvRegs],
                                             const BwdBlock& blk, int tid, int key_local, int cw, int t) {
  using Tr = BwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages>;
  const int hk = blk.hk, b = blk.b, n0 = blk.n0;
  const int row0 = Tr::kSplitD ? 0 : cw * 64;              // this warpgroup's key rows ...
  const int col0 = Tr::kSplitD ? cw * Tr::kDkCols : 0;    // ... and columns of dK
  const int col0_v = Tr::kSplitD ? cw * Tr::kDvCols : 0;  // ... and of dV
  named_barrier_sync(6, 128 * Tr::kConsumerWGs);
  unsigned char* stage_k = sm.base + Tr::kOffQ;
  unsigned char* stage_v = stage_k + kBlockN * Tr::kEpiPitch;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key_local + 8 * r;
#pragma unroll
    for (int j = 0; j < Tr::kDkCols / 8; ++j) {
      const int off = row * Tr::kEpiPitch + (Tr::acc_col(Tr::kDkCols, cw, j) + 2 * t) * 2;
      *reinterpret_cast<uint32_t*>(stage_k + off) = Mma<T>::pack(dk[j * 4 + 2 * r] * a.scale, dk[j * 4 + 2 * r + 1] * a.scale);
      if (j < Tr::kDvCols / 8) {
        const int off_v = row * Tr::kEpiPitch + (Tr::acc_col(Tr::kDvCols, cw, j) + 2 * t) * 2;
        *reinterpret_cast<uint32_t*>(stage_v + off_v) = Mma<T>::pack(dv[j * 4 + 2 * r], dv[j * 4 + 2 * r + 1]);
      }
    }
  }
  named_barrier_sync(4 + cw, 128);  // this warpgroup's rows are staged
  T* dkg = static_cast<T*>(a.dk) + b * a.k_bs + hk * a.k_hs;
  T* dvg = static_cast<T*>(a.dv) + b * a.v_bs + hk * a.v_hs;
  // this warpgroup's 16-byte chunks of dK per key row; dV's are the first kDvCols / 8 of as many
  // (kDvCols <= kDkCols: BwdWgmmaTraits' head-dim assert)
  constexpr int kRowChunks = Tr::kDkCols / 8;
#pragma unroll
  for (int i = tid % 128; i < 64 * kRowChunks; i += 128) {
    const int row = row0 + i / kRowChunks, c = i % kRowChunks;
    const int chunk = col0 / 8 + c, chunk_v = col0_v / 8 + c;  // of dK, of dV
    const int key = n0 + row;
    if (key < a.seqlen_k) {
      const int off = row * Tr::kEpiPitch + chunk * 16, off_v = row * Tr::kEpiPitch + chunk_v * 16;
      if (chunk * 8 < a.head_dim)
        *reinterpret_cast<uint4*>(dkg + static_cast<int64_t>(key) * a.k_rs + chunk * 8) =
            *reinterpret_cast<const uint4*>(stage_k + off);
      // (the first term folds the chunk test away where the widths agree: the same code as one width)
      if ((Tr::kDvCols == Tr::kDkCols || c < Tr::kDvCols / 8) && chunk_v * 8 < a.head_dim_v)
        *reinterpret_cast<uint4*>(dvg + static_cast<int64_t>(key) * a.v_rs + chunk_v * 8) =
            *reinterpret_cast<const uint4*>(stage_v + off_v);
    }
  }
}

}  // namespace fm3::hopper::sm90
