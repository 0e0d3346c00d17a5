// FlashMask forward on Hopper: persistent, warp-specialized TMA + WGMMA
// (docs/design.md, "Kernels"), built for sm_90a.
//
// Persistent: one CTA per SM, 128 * (1 + kConsumerWGs) threads, takes query
// tiles (batch, head, kBlockM = 64 * kConsumerWGs rows) one after another from
// a global counter (dynamic: a CTA that drew light tiles takes more). The
// order is heaviest first within each (batch, head): bottom tiles first, as
// they see the most keys under causal-like masks; heads stay contiguous so
// CTAs working at the same time share K/V in L2. The producer runs ahead into
// the next tile while the consumers finish the current one (Q reloaded once
// they release it), so per-tile set-up and the epilogue are hidden.
//   warpgroup 0, the producer (setmaxnreg down to 40 registers): its four warps
//     run the mask scheduler (mask_scheduler.cuh, on named barrier 1), which
//     publishes the compacted list of surviving key blocks a window of 128
//     blocks at a time; all four warps walk that list and, per block, wait for
//     a free stage of the kStages-deep shared-memory ring; when the block is
//     partial each thread turns one key column's bounds into visibility bits
//     for the tile's rows (fm3::visible_bits, one 32-bit word per 32 rows);
//     lane 0 of warp 0 writes the block's entry (index + partial tag) beside
//     the stage and issues the TMA loads of K and V (cp.async.bulk.tensor,
//     128-byte swizzle) completing on the stage's "full" mbarrier. A negative
//     entry, -1 - next tile, is a tile boundary: it ends a tile's list and
//     names the next tile (the first entry names the first one). Q is loaded per tile into one of kQBuffers buffers
//     on its own mbarrier, once the consumers hand that buffer back (q_empty).
//   warpgroups 1..kConsumerWGs, the consumers (setmaxnreg up to 232): 64 query
//     rows each. Per stage: S = Q K^T with wgmma.mma_async (A and B from shared
//     memory, fp32 accumulators), scale into log2 units, per-element mask
//     (one bit test per element) only when the entry is tagged partial, online softmax,
//     P re-packed in registers as the A operand, O += P V with wgmma (A from
//     registers, V from shared memory MN-major), then every consumer thread
//     arrives on the stage's "empty" mbarrier to hand the stage back.
// A row that sees no key writes 0 and lse -inf (as the step-1 kernel).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"  // FwdArgs
#include "fm3/mask.h"
#include "mask_scheduler.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack, fast_exp2, smem_u32
#include "sm90_primitives.cuh"

// Measured and not kept (H200, D=128, S=32K; BENCHMARKS.md): a software-pipelined
// consumer loop (P_{i-1} V_{i-1} in flight during the softmax of S_i) with the two
// warpgroups ping-ponging on named barriers: 306 TFLOP/s full with one K+V barrier
// per stage, 460 with separate K and V barriers, against 536-552 for the plain
// loop below; the tile sizes leave no room for a third stage.

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kStages>
struct WgTraits {
  static constexpr int kConsumerWGs = kBlockM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kProducerThreads = 128;
  static constexpr int kDChunks = kHeadDim / 64;  // 128-byte swizzle sub-tiles along the head dim
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "WGMMA path: head dim 64, 128 or 256");
  static_assert(kBlockN == 64 || kBlockN == 128, "WGMMA path: block_n 64 or 128");
  static_assert(kBlockM % 64 == 0 && kConsumerWGs >= 1 && kConsumerWGs <= 2, "64 rows per consumer warpgroup");
  static_assert(kStages >= 2, "at least two stages");
  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile must lie inside one block_mask block (apply_block_mask then decides it whole)");
  static_assert(kBlockN <= kProducerThreads, "one producer thread per key column");
  // setmaxnreg.inc blocks until the registers are free: the per-role budgets must fit in what the CTA
  // got at launch (the __launch_bounds__(kThreads, 1) cap, 65536 / kThreads rounded down to 8, per thread).
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8 > 255 ? 255 : (65536 / kThreads) / 8 * 8;
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * 128 * kConsumerWGs <= kLaunchRegs * kThreads,
                "register budgets exceed the launch allocation (setmaxnreg.inc would deadlock)");
  // Shared memory, every tile 1024-byte aligned (offsets from a 1024-aligned base).
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kOffQ = 0;
  // Q double-buffered (the next tile's Q loads during this tile) where shared memory allows; at head
  // dim 256 a second 64 KB buffer does not fit beside the K/V ring, so Q loads between tiles.
  static constexpr int kQBuffers = 2 * kQBytes + 2 * kStages * kKVBytes + 8192 <= 227 * 1024 ? 2 : 1;
  static constexpr int kOffK = kOffQ + kQBuffers * kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  static constexpr int kMaskWords = kBlockM / 32;               // visibility words per key column
  static constexpr int kOffMask = kOffV + kStages * kKVBytes;  // kStages x [kBlockN][kMaskWords] uint32
  static constexpr int kMaskStageInts = kMaskWords * kBlockN;
  static constexpr int kOffEntry = kOffMask + kStages * kMaskStageInts * 4;  // kStages int
  static constexpr int kOffList = kOffEntry + 16 * 4;                          // kProducerThreads int
  static constexpr int kOffWarpCounts = kOffList + kProducerThreads * 4;       // 4 int (+pad)
  static constexpr int kOffTile = kOffWarpCounts + 16 * 4;  // 2 int: next tile, by tile parity
  static constexpr int kOffBar = kOffTile + 16;  // full[kStages], empty[kStages], q[2], q_empty[2]
  static constexpr int kEnd = kOffBar + 8 * (2 * kStages + 4);
  static constexpr size_t kSmemBytes = kEnd + 1024;  // + alignment slack
  static_assert(kStages <= 16, "entry slots");
  static_assert(kSmemBytes <= 227 * 1024, "tile config exceeds the 227 KiB of shared memory per block (yaml/kernel_configs.yaml)");
};

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kStages>
__global__ void __launch_bounds__(WgTraits<T, kHeadDim, kBlockM, kBlockN, kStages>::kThreads, 1)
    flash_fwd_wgmma_kernel(const __grid_constant__ FwdArgs a, const __grid_constant__ CUtensorMap tmap_q,
                           const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v) {
  using Tr = WgTraits<T, kHeadDim, kBlockM, kBlockN, kStages>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_u32 = smem_u32(smem_raw);
  const uint32_t base_u32 = (raw_u32 + 1023u) & ~1023u;
  unsigned char* base = smem_raw + (base_u32 - raw_u32);
  const uint32_t sQ = base_u32 + Tr::kOffQ;
  const uint32_t sK = base_u32 + Tr::kOffK;
  const uint32_t sV = base_u32 + Tr::kOffV;
  uint32_t* sMask = reinterpret_cast<uint32_t*>(base + Tr::kOffMask);
  volatile int* sEntry = reinterpret_cast<volatile int*>(base + Tr::kOffEntry);
  int* sList = reinterpret_cast<int*>(base + Tr::kOffList);
  int* sWarpCounts = reinterpret_cast<int*>(base + Tr::kOffWarpCounts);
  const uint32_t bar_full = base_u32 + Tr::kOffBar;
  const uint32_t bar_empty = bar_full + 8 * kStages;
  const uint32_t bar_q = bar_empty + 8 * kStages;

  int* sTile = reinterpret_cast<int*>(base + Tr::kOffTile);
  const uint32_t bar_q_empty = bar_q + 16;  // bar_q[2], then bar_q_empty[2]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // broadcast: the compiler sees it warp-uniform
  const int n_mtiles = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_blocks = (a.seqlen_k + kBlockN - 1) / kBlockN;
  const int causal_offset = a.seqlen_k - a.seqlen_q;
  const int group = a.num_heads / a.num_heads_k;
  // Tile t: (batch, head) = t / n_mtiles, query tile counted from the bottom.
  struct Tile {
    int m0, m1, h, hk, b;
    int64_t bhm;
  };
  auto tile_at = [&](int t) {
    Tile x;
    const int bh = t / n_mtiles;
    x.m0 = (n_mtiles - 1 - t % n_mtiles) * kBlockM;
    x.m1 = min(x.m0 + kBlockM, a.seqlen_q);
    x.h = bh % a.num_heads;
    x.b = bh / a.num_heads;
    x.hk = x.h / group;
    const int hm = a.mask_heads == 1 ? 0 : (a.mask_heads == a.num_heads ? x.h : x.hk);
    x.bhm = static_cast<int64_t>(x.b) * a.mask_heads + hm;
    return x;
  };

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + 8 * s, Tr::kProducerThreads);       // every producer thread
      mbar_init(bar_empty + 8 * s, Tr::kConsumerWarps * 32);  // every consumer thread
    }
    for (int qb = 0; qb < 2; ++qb) {
      mbar_init(bar_q + 8 * qb, 1);
      mbar_init(bar_q_empty + 8 * qb, Tr::kConsumerWarps * 32);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------ producer ------------------------------
    reg_dealloc<Tr::kProducerRegs>();
    if (warp == 0 && lane == 0) {
      tma_prefetch_desc(&tmap_q);
      tma_prefetch_desc(&tmap_k);
      tma_prefetch_desc(&tmap_v);
    }
    int stage = 0, phase = 0;
    // A tile boundary in the ring: every producer thread arrives (the barrier counts all of them).
    auto post_boundary = [&](int next_tile) {
      mbar_wait(bar_empty + 8 * stage, phase ^ 1);
      if (tid == 0) sEntry[stage] = -1 - next_tile;
      mbar_arrive(bar_full + 8 * stage);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    };
    int tile = blockIdx.x;
    post_boundary(tile);
    for (int k = 0; tile < a.num_tiles; ++k) {
      const Tile x = tile_at(tile);
      TileMask tm;
      tm.summary = a.summary ? a.summary + x.bhm * n_blocks : nullptr;
      tm.block_mask = a.block_mask ? a.block_mask + x.bhm * a.bm_rows * a.bm_cols : nullptr;
      tm.bm_cols = a.bm_cols;
      tm.seqlen_q = a.seqlen_q;
      tm.seqlen_k = a.seqlen_k;
      tm.block_n = kBlockN;
      tm.n_blocks = n_blocks;
      tm.causal_offset = causal_offset;
      tm.causal = a.causal;
      tm.m0 = x.m0;
      tm.m1 = x.m1;
      const int32_t* sri = a.sri ? a.sri + x.bhm * a.seqlen_k * a.mask_cols : nullptr;
      int next = 0;
      if (tid == 0) {
        next = gridDim.x + atomicAdd(a.tile_counter, 1);  // used at the end of the tile: latency hidden
        // Q buffer k % kQBuffers, free once the consumers are done with tile k - kQBuffers.
        const int qb = k % Tr::kQBuffers;
        if (k >= Tr::kQBuffers) mbar_wait(bar_q_empty + 8 * qb, (k / Tr::kQBuffers - 1) & 1);
        mbar_arrive_expect_tx(bar_q + 8 * qb, Tr::kQBytes);
#pragma unroll
        for (int c = 0; c < Tr::kDChunks; ++c)
          tma_load_4d(sQ + qb * Tr::kQBytes + c * kBlockM * 128, &tmap_q, bar_q + 8 * qb, c * 64, x.m0, x.h, x.b);
      }
      for (int first = 0; first < n_blocks; first += Tr::kProducerThreads) {
        const int count = schedule_window<Tr::kProducerThreads, 1>(tm, first, sList, sWarpCounts);
        for (int i = 0; i < count; ++i) {
          const int entry = sList[i];
          const int n0 = BlockEntry::block(entry) * kBlockN;
          mbar_wait(bar_empty + 8 * stage, phase ^ 1);
          if (BlockEntry::partial(entry) && tid < kBlockN) {  // this thread's key column as visibility bits
            const ColumnBounds cb =
                column_bounds(sri, n0 + tid, a.seqlen_q, a.seqlen_k, a.mask_cols, a.causal, causal_offset);
            uint32_t* dst = sMask + stage * Tr::kMaskStageInts + tid * Tr::kMaskWords;
#pragma unroll
            for (int w = 0; w < Tr::kMaskWords; ++w) dst[w] = visible_bits(cb, x.m0 + 32 * w);
          }
          // Every producer thread arrives on "full" after its own stores (release); thread 0 also
          // arms the transaction count and issues the TMA loads.
          const uint32_t full = bar_full + 8 * stage;
          if (tid == 0) {
            sEntry[stage] = entry;
            mbar_arrive_expect_tx(full, 2 * Tr::kKVBytes);
#pragma unroll
            for (int c = 0; c < Tr::kDChunks; ++c) {
              tma_load_4d(sK + stage * Tr::kKVBytes + c * kBlockN * 128, &tmap_k, full, c * 64, n0, x.hk, x.b);
              tma_load_4d(sV + stage * Tr::kKVBytes + c * kBlockN * 128, &tmap_v, full, c * 64, n0, x.hk, x.b);
            }
          } else {
            mbar_arrive(full);
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
      if (tid == 0) sTile[k & 1] = next;  // by parity: a slow reader of this slot is never overwritten
      named_barrier_sync(1, Tr::kProducerThreads);
      tile = sTile[k & 1];
      post_boundary(tile);
    }
    return;
  }

  // ------------------------------ consumers ------------------------------
  reg_alloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;               // consumer warpgroup: rows [cw * 64, cw * 64 + 64) of the tile
  const int wq = warp % 4;             // warp within the warpgroup: 16 rows
  const int g = lane / 4, t = lane % 4;
  const int row_base = cw * 64 + wq * 16 + g;  // tile-local rows row_base and row_base + 8
  constexpr int kS = kBlockN / 2;      // S accumulators per thread
  constexpr int kO = kHeadDim / 2;     // O accumulators per thread
  float o[kO];
  float row_max[2], row_sum[2];  // log2 units; row_sum over this thread's columns only
  // Operand descriptors, built once; a block's operands are these moved by byte offsets.
  const SmemDesc dsc_q = smem_desc(sQ + cw * 64 * 128, 16, 1024);  // this warpgroup's 64 rows of Q buffer 0
  const SmemDesc dsc_k = smem_desc(sK, 16, 1024), dsc_v = smem_desc(sV, kBlockN * 128, 1024);
  uint32_t qoff = 0;  // the tile's Q buffer (set per tile)

  // S = Q K^T for the block in `stage` (issued, not waited for).
  auto issue_qk = [&](float (&s)[kS], int stage_) {
    const uint32_t kvoff = stage_ * Tr::kKVBytes;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;  // k16 step within the 128-byte row
      gmma_ss<T, kBlockN>(dsc_q.at(qoff + (ks / 4) * kBlockM * 128 + off),
                          dsc_k.at(kvoff + (ks / 4) * kBlockN * 128 + off), s, ks > 0);
    }
    gmma_commit();
  };
  // O += P V for the block in `stage` (issued, not waited for).
  auto issue_pv = [&](const uint32_t (&p)[kBlockN / 16][4], int stage_) {
    const uint32_t kvoff = stage_ * Tr::kKVBytes;
#pragma unroll
    for (int ps = 0; ps < kBlockN / 16; ++ps) gmma_rs<T, kHeadDim>(p[ps], dsc_v.at(kvoff + ps * 2048), o);
    gmma_commit();
  };
  // Scale into log2 units, mask (partial blocks only), online-softmax update of
  // row_max / row_sum; S becomes P (unnormalized, fp32); returns the two rows'
  // rescale factors for O.
  auto softmax = [&](float (&s)[kS], int entry, int stage_, float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < kS; ++i) s[i] *= a.scale_log2;
    if (BlockEntry::partial(entry)) {
      // This thread's rows row_base and row_base + 8 lie in one 32-row word of each column.
      const uint32_t* bits = sMask + stage_ * Tr::kMaskStageInts + row_base / 32;
      const int shift = row_base % 32;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const uint32_t w = bits[(j * 8 + 2 * t + c) * Tr::kMaskWords] >> shift;
#pragma unroll
          for (int r = 0; r < 2; ++r)
            if (!((w >> (8 * r)) & 1u)) s[j * 4 + 2 * r + c] = -CUDART_INF_F;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // two rows per thread: row_base and row_base + 8
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * r], s[j * 4 + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base_m = mx == -CUDART_INF_F ? 0.f : mx;  // nothing visible yet: keep p = 0
      alpha[r] = fast_exp2(row_max[r] - base_m);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        s[j * 4 + 2 * r] = fast_exp2(s[j * 4 + 2 * r] - base_m);
        s[j * 4 + 2 * r + 1] = fast_exp2(s[j * 4 + 2 * r + 1] - base_m);
        sum += s[j * 4 + 2 * r] + s[j * 4 + 2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[d * 4 + 2 * r] *= alpha[r];
        o[d * 4 + 2 * r + 1] *= alpha[r];
      }
  };
  // P (fp32 S accumulators) re-packed as the register A operand of O += P V.
  auto pack_p = [&](const float (&s)[kS], uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
    for (int ps = 0; ps < kBlockN / 16; ++ps) {
      p[ps][0] = Mma<T>::pack(s[8 * ps + 0], s[8 * ps + 1]);
      p[ps][1] = Mma<T>::pack(s[8 * ps + 2], s[8 * ps + 3]);
      p[ps][2] = Mma<T>::pack(s[8 * ps + 4], s[8 * ps + 5]);
      p[ps][3] = Mma<T>::pack(s[8 * ps + 6], s[8 * ps + 7]);
    }
  };

  int stage = 0, phase = 0;
  auto advance = [&] {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  };
  mbar_wait(bar_full + 8 * stage, phase);  // the first entry is a tile boundary naming the first tile
  int tile = -1 - sEntry[stage];
  mbar_arrive(bar_empty + 8 * stage);
  advance();
  constexpr float kLn2 = 0.6931471805599453f;
  for (int k = 0; tile < a.num_tiles; ++k) {
    const Tile x = tile_at(tile);
    const int qb = k % Tr::kQBuffers;
    qoff = qb * Tr::kQBytes;
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = -CUDART_INF_F;
      row_sum[r] = 0.f;
    }
    mbar_wait(bar_q + 8 * qb, (k / Tr::kQBuffers) & 1);
    for (;;) {
      mbar_wait(bar_full + 8 * stage, phase);
      const int entry = sEntry[stage];
      if (entry < 0) {  // end of this tile; the boundary names the next one
        tile = -1 - entry;
        mbar_arrive(bar_empty + 8 * stage);
        advance();
        break;
      }
      float s[kS];
      gmma_fence();
      issue_qk(s, stage);
      gmma_wait<0>();
      fence_regs(s);
      float alpha[2];
      softmax(s, entry, stage, alpha);
      rescale_o(alpha);
      uint32_t p[kBlockN / 16][4];
      pack_p(s, p);
      fence_regs(o);
      gmma_fence();
      issue_pv(p, stage);
      gmma_wait<0>();
      fence_regs(o);
      fence_regs(p);
      mbar_arrive(bar_empty + 8 * stage);  // this thread is done with the stage (its reads happen-before the refill)
      advance();
    }
    mbar_arrive(bar_q_empty + 8 * qb);  // every GEMM reading this Q buffer has completed

    // Epilogue: normalize, write O (pairs of elements per thread) and lse; the producer is already
    // loading the next tile.
    float* lse = a.lse + (static_cast<int64_t>(x.b) * a.num_heads + x.h) * a.seqlen_q;
    T* og = static_cast<T*>(a.out) + x.b * a.o_bs + x.h * a.o_hs;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const bool empty = !(l > 0.f);
      const float inv = empty ? 0.f : 1.f / l;
      const int row = x.m0 + row_base + r * 8;
      if (row < a.seqlen_q) {
        T* dst = og + static_cast<int64_t>(row) * a.o_rs + 2 * t;
#pragma unroll
        for (int d = 0; d < kHeadDim / 8; ++d)
          *reinterpret_cast<uint32_t*>(dst + d * 8) = Mma<T>::pack(o[d * 4 + 2 * r] * inv, o[d * 4 + 2 * r + 1] * inv);
        if (t == 0) lse[row] = empty ? -CUDART_INF_F : (row_max[r] + __log2f(l)) * kLn2;
      }
    }
  }
}

}  // namespace fm3::hopper::sm90
