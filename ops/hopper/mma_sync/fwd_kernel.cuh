// FlashMask forward on mma.sync tensor cores: the fallback of the WGMMA kernel
// (fwd/kernel.cuh) for the configs it does not cover, layouts TMA cannot
// describe and FM3_FWD_KERNEL=mma_sync. A mask-aware FlashAttention-2-style
// kernel (Dao 2023, Alg. 1) with a two-stage cp.async K/V pipeline, built for sm_90a.
//
// One CTA = one (batch, head, query tile of kBlockM rows); kWarps warps, 16
// query rows each. The mask scheduler (mask_scheduler.cuh) turns the block
// summary into a compacted list of surviving key blocks; the main loop walks
// only that list: fully masked blocks cost nothing, unmasked blocks no mask
// work, partial blocks a per-element mask (fm3::visible, mask.h) over column
// bounds staged in shared memory. Online softmax in fp32 with exp2 and the
// scale folded in (scores in log2 units). A row that sees no key writes out 0
// and lse -inf.
//
// Query tiles are launched heaviest-first for the usual masks (the bottom
// tiles of causal-like masks see the most keys).
#pragma once
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"
#include "fm3/mask.h"
#include "fm3_generated_config.h"  // kSm90SmemLimit
#include "mask_scheduler.cuh"
#include "mma_sync/tile_load.cuh"  // swz, load_tile
#include "warp_primitives.cuh"

namespace fm3::hopper::mma_sync {

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
struct FwdMmaSyncTraits {
  static constexpr int kWarps = kBlockM / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks per row
  static constexpr int kSTiles = kBlockN / 8;     // n8 tiles of S per warp
  static constexpr int kOTiles = kHeadDim / 8;    // n8 tiles of O per warp
  static constexpr int kQKSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kPVSteps = kBlockN / 16;   // k16 steps of P V
  static constexpr bool kQInRegs = kHeadDim <= 128;
  static constexpr int kMinBlocks = 1;
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0 && kHeadDim % 16 == 0, "tile shape");
  // swz XORs a chunk index with row % 8: a permutation of each row's chunks only when the row
  // holds whole groups of 8 chunks (head_dim % 64 == 0); else chunks land past the row's end.
  static_assert(kChunks % 8 == 0, "the XOR swizzle needs head_dim % 64 == 0");
  // Shared memory: Q, two stages of K and of V, the block list, warp counts,
  // two stages of raw mask columns (startend_row_indices rows of partial blocks).
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKVElems = kBlockN * kHeadDim;
  static constexpr size_t kSmemTiles = sizeof(T) * (kQElems + 4 * kKVElems);
  static constexpr size_t kSmemBytes =
      kSmemTiles + sizeof(int) * (kThreads + 32) + sizeof(int32_t) * 2 * 4 * kBlockN;
  static_assert(kSmemBytes <= kSm90SmemLimit, "tile config exceeds the shared memory per block");
};

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(FwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>::kThreads,
                                  FwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>::kMinBlocks)
    flash_fwd_mma_sync_kernel(const __grid_constant__ FwdArgs a) {
  using Tr = FwdMmaSyncTraits<T, kHeadDim, kBlockM, kBlockN>;
  constexpr int kThreads = Tr::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Tr::kQElems;        // 2 stages
  T* sV = sK + 2 * Tr::kKVElems;   // 2 stages
  int* sList = reinterpret_cast<int*>(smem_raw + Tr::kSmemTiles);
  int* sWarpCounts = sList + kThreads;
  int32_t* sMask = sWarpCounts + 32;  // 2 stages of [kBlockN][mask_cols]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n_mtiles = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int mt = n_mtiles - 1 - static_cast<int>(blockIdx.x);  // heavy (bottom) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int group = a.num_heads / a.num_heads_k, hk = h / group;
  const int hm = mask_head_of(h, hk, a.num_heads, a.mask_heads);
  const int m0 = mt * kBlockM, m1 = min(m0 + kBlockM, a.seqlen_q);
  const int n_blocks = (a.seqlen_k + kBlockN - 1) / kBlockN;
  const int causal_offset = causal_offset_of(a.seqlen_q, a.seqlen_k);
  const int64_t bhm = static_cast<int64_t>(b) * a.mask_heads + hm;

  const T* qg = static_cast<const T*>(a.q) + b * a.q_bs + h * a.q_hs;
  const T* kg = static_cast<const T*>(a.k) + b * a.k_bs + hk * a.k_hs;
  const T* vg = static_cast<const T*>(a.v) + b * a.v_bs + hk * a.v_hs;
  const int32_t* sri = a.sri ? a.sri + bhm * a.seqlen_k * a.mask_cols : nullptr;
  const TileMask tm = TileMask::of(a, bhm, m0, m1, kBlockN, n_blocks, causal_offset);

  load_tile<T, kHeadDim, kBlockM, kThreads>(sQ, qg, a.q_rs, m0, m1 - m0);
  cp_async_commit();

  float o[Tr::kOTiles][4];
#pragma unroll
  for (int i = 0; i < Tr::kOTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};  // log2 units
  float row_sum[2] = {0.f, 0.f};                      // this thread's columns only
  uint32_t qf[Tr::kQInRegs ? Tr::kQKSteps : 1][4];
  bool q_ready = false;
  const int warp_row = warp * 16;

  auto load_kv = [&](int entry, int stage) {
    const int n0 = BlockEntry::block(entry) * kBlockN;
    load_tile<T, kHeadDim, kBlockN, kThreads>(sK + stage * Tr::kKVElems, kg, a.k_rs, n0, a.seqlen_k - n0);
    load_tile<T, kHeadDim, kBlockN, kThreads>(sV + stage * Tr::kKVElems, vg, a.v_rs, n0, a.seqlen_k - n0);
    if (BlockEntry::partial(entry) && sri != nullptr) {  // the block's mask columns ride along
      const int n = kBlockN * a.mask_cols, valid = (a.seqlen_k - n0) * a.mask_cols;
      const int32_t* src = sri + static_cast<int64_t>(n0) * a.mask_cols;
      for (int i = tid; i < n; i += kThreads)
        cp_async_4(smem_u32(sMask + stage * 4 * kBlockN + i), i < valid ? src + i : src, i < valid ? 4 : 0);
    }
    cp_async_commit();
  };
  auto q_frag = [&](uint32_t (&r)[4], int ks) {
    const int row = warp_row + (lane % 8) + ((lane / 8) % 2) * 8;
    ldmatrix_x4(r, smem_u32(sQ + swz<kHeadDim>(row, ks * 2 + lane / 16)));
  };

  for (int first = 0; first < n_blocks; first += kThreads) {
    const int count = schedule_window<kThreads>(tm, first, sList, sWarpCounts);
    if (count == 0) continue;
    load_kv(sList[0], 0);
    for (int i = 0; i < count; ++i) {
      const int entry = sList[i], stage = i & 1;
      const int n0 = BlockEntry::block(entry) * kBlockN;
      const bool partial = BlockEntry::partial(entry);
      load_next_wait_current(sList, i, count, stage, load_kv);
      __syncthreads();
      if constexpr (Tr::kQInRegs) {
        if (!q_ready) {
#pragma unroll
          for (int ks = 0; ks < Tr::kQKSteps; ++ks) q_frag(qf[ks], ks);
          q_ready = true;
        }
      }
      const T* sKs = sK + stage * Tr::kKVElems;
      const T* sVs = sV + stage * Tr::kKVElems;

      // S = Q K^T
      float s[Tr::kSTiles][4];
#pragma unroll
      for (int j = 0; j < Tr::kSTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < Tr::kQKSteps; ++ks) {
        uint32_t af[4];
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) af[r] = qf[ks][r];
        } else {
          q_frag(af, ks);
        }
#pragma unroll
        for (int j = 0; j < Tr::kSTiles; j += 2) {
          uint32_t bf[4];
          const int row = j * 8 + (lane % 8) + (lane / 16) * 8;
          ldmatrix_x4(bf, smem_u32(sKs + swz<kHeadDim>(row, ks * 2 + (lane / 8) % 2)));
          Mma<T>::run(s[j], af, bf[0], bf[1]);
          Mma<T>::run(s[j + 1], af, bf[2], bf[3]);
        }
      }

      // scale into log2 units; per-element mask on partial blocks only
#pragma unroll
      for (int j = 0; j < Tr::kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= a.scale_log2;
      if (partial) {
        const int32_t* raw = sMask + stage * 4 * kBlockN;
#pragma unroll
        for (int j = 0; j < Tr::kSTiles; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int cl = j * 8 + 2 * t + c, col = n0 + cl;
            const ColumnBounds cb = sri != nullptr
                ? load_column(raw + cl * a.mask_cols, col, a.mask_cols, a.causal, a.seqlen_q, causal_offset)
                : ColumnBounds{a.seqlen_q, a.seqlen_q, 0, 0};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int row = m0 + warp_row + g + r * 8;
              if (col >= a.seqlen_k || !visible(cb, row, col, a.causal, causal_offset, tm.block_mask, a.bm_cols))
                s[j][2 * r + c] = -CUDART_INF_F;
            }
          }
      }

      // online softmax (two rows per thread: g and g + 8)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[r];
#pragma unroll
        for (int j = 0; j < Tr::kSTiles; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -CUDART_INF_F ? 0.f : mx;  // nothing visible yet: keep p = 0
        const float alpha = fast_exp2(row_max[r] - base);
        row_max[r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < Tr::kSTiles; ++j) {
          s[j][2 * r] = fast_exp2(s[j][2 * r] - base);
          s[j][2 * r + 1] = fast_exp2(s[j][2 * r + 1] - base);
          sum += s[j][2 * r] + s[j][2 * r + 1];
        }
        row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
        for (int d = 0; d < Tr::kOTiles; ++d) {
          o[d][2 * r] *= alpha;
          o[d][2 * r + 1] *= alpha;
        }
      }

      // O += P V (P from the S accumulators, re-packed as A fragments)
#pragma unroll
      for (int ps = 0; ps < Tr::kPVSteps; ++ps) {
        uint32_t pf[4];
        pf[0] = Mma<T>::pack(s[2 * ps][0], s[2 * ps][1]);
        pf[1] = Mma<T>::pack(s[2 * ps][2], s[2 * ps][3]);
        pf[2] = Mma<T>::pack(s[2 * ps + 1][0], s[2 * ps + 1][1]);
        pf[3] = Mma<T>::pack(s[2 * ps + 1][2], s[2 * ps + 1][3]);
#pragma unroll
        for (int d = 0; d < Tr::kOTiles; d += 2) {
          uint32_t bf[4];
          const int row = ps * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
          ldmatrix_x4_trans(bf, smem_u32(sVs + swz<kHeadDim>(row, d + lane / 16)));
          Mma<T>::run(o[d], pf, bf[0], bf[1]);
          Mma<T>::run(o[d + 1], pf, bf[2], bf[3]);
        }
      }
      __syncthreads();  // this stage may be refilled next iteration
    }
  }

  // Epilogue: normalize, stage O through this warp's rows of sQ, 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();
  float* lse = a.lse + (static_cast<int64_t>(b) * a.num_heads + h) * a.seqlen_q;
  const float sink = sink_log2(a.learnable_sink, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const RowEnd e(row_sum[r], row_max[r], sink);
    const float inv = e.o_scale;
    const int row_local = warp_row + g + r * 8;
#pragma unroll
    for (int d = 0; d < Tr::kOTiles; ++d) {
      T* dst = sQ + swz<kHeadDim>(row_local, d) + 2 * t;
      *reinterpret_cast<uint32_t*>(dst) = Mma<T>::pack(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    }
    const int row = m0 + row_local;
    if (t == 0 && row < a.seqlen_q) lse[row] = e.lse;
  }
  __syncwarp();
  T* og = static_cast<T*>(a.out) + b * a.o_bs + h * a.o_hs;
#pragma unroll
  for (int i = lane; i < 16 * Tr::kChunks; i += 32) {
    const int row_local = warp_row + i / Tr::kChunks, c = i % Tr::kChunks, row = m0 + row_local;
    if (row < a.seqlen_q)
      *reinterpret_cast<uint4*>(og + static_cast<int64_t>(row) * a.o_rs + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + swz<kHeadDim>(row_local, c));
  }
}

}  // namespace fm3::hopper::mma_sync
