// Backward WGMMA kernel (bwd/kernel.cuh): tile sizes, register budgets, the split of the work
// between the consumer warpgroups, the shared-memory layout (BwdWgmmaTraits) and its addresses in one
// CTA (BwdSmem).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "fm3/mask.h"           // kBlockMaskSize
#include "fm3_generated_config.h"  // kSm90SmemLimit
#include "warp_primitives.cuh"  // smem_u32

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages>
struct BwdWgmmaTraits {
  static constexpr int kNumStages = kStages;
  static constexpr int kDim = kHeadDim, kDimV = kHeadDimV, kTileM = kBlockM, kTileN = kBlockN;  // the parameters, for roles given Tr
  // kHeadDim: the width of the products of Q and K (the larger of the two head dims; on the split-D
  // path the tile head dim, flash_bwd_launch.cu); kHeadDimV: of V and dO (dP^T's reduction, dV's
  // columns): kHeadDim, except on the split-D path, where it is v's head dim rounded up to 64 (MLA's
  // 192 / 128: dP^T and dV at 128). Shared memory holds Q, K (V, dO) in 128-byte-swizzled
  // sub-tiles of 64 columns, kTileDim (kTileDimV) wide (paddle_fm3_build/kernel_rules.py, the dQ
  // accumulator's rows too): the TMA loads fill the columns past the head dims with zeros, S^T /
  // dP^T reduce over kHeadDim / kHeadDimV only and dK, dV take N = kHeadDim / kHeadDimV (a WGMMA
  // may end inside a swizzle atom, as the forward's P V does).
  static constexpr int kTileDim = (kHeadDim + 63) / 64 * 64;
  static constexpr int kTileDimV = (kHeadDimV + 63) / 64 * 64;
  static_assert(kHeadDim % 16 == 0 && (kHeadDim <= 128 || kHeadDim == 192 || kHeadDim == 256),
                "WGMMA backward: head dims that are multiples of 16 up to 128, or the split-D 192 and 256");
  // Head dims 192 and 256 (kSplitD): 64 x 64 tiles and two warpgroups that share the 64 keys and
  // split the head dim (bwd/mainloop_split_d.cuh): a warpgroup's dK and dV over all the columns would
  // take 192 / 256 registers per thread. Otherwise 64 keys per consumer warpgroup (bwd/mainloop.cuh).
  static constexpr bool kSplitD = kHeadDim > 128;
  // 192 and 192 / 128 on 64 x 96 tiles (FlashAttention-4's shape there, bwd/mainloop_swap_dkv.cuh):
  // S and dP with the queries on WGMMA's M, each warpgroup 48 of the 96 keys; dK^T = Q^T dS and
  // dV^T = dO^T P with the head dim on M (72 + 48 accumulators per thread at 192 / 128, where 64
  // keys per warpgroup would need 160); dQ as on the split-D path, 96 columns per warpgroup.
  static constexpr bool kSwapDkv = kSplitD && kBlockN == 96;
  static constexpr int kKeysPerWg = kSwapDkv ? kBlockN / 2 : 64;
  // Stages of dO: kStages, except at 192 on 64 x 96 tiles, where the 227 KiB hold two of Q but one
  // of dO (FlashAttention-4's choice): dO then has its own ring (bar_do_full / bar_do_empty), handed
  // back after dV^T, so that the next tile's S runs while its dO loads.
  static constexpr int kStagesdO = kSwapDkv && kHeadDimV == 192 ? 1 : kStages;
  static constexpr bool kOwnDoRing = kStagesdO != kStages;
  static_assert(kSplitD ? kHeadDimV % 64 == 0 && kHeadDimV <= kHeadDim : kHeadDimV == kHeadDim,
                "WGMMA backward: one head dim, or on the split-D path v's at most q's, a multiple of 64");
  // The deterministic dQ writer reads its next tile from the ring ahead of the dQ (bwd/dq_writer.cuh;
  // the ring's empty barriers then count it) where the consumers release a tile's Q / dO stage only
  // after handing its dQ over (bwd/mainloop.cuh): the writer has read the entry by then (the first
  // tile aside), so it does not hold the producer back. The split-D loop releases the stage first.
  static constexpr bool kRingTileAhead = !kSplitD;
  // Deterministic mode with kRingTileAhead: two writer threads take turns, even and odd tiles, so that
  // one adds its tile while the other passes its own on (bwd/dq_writer.cuh). Each reads every other
  // tile's ring stage, whose phases stay in step only with an even number of stages.
  static constexpr int kDetWriters = kRingTileAhead ? 2 : 1;
  static_assert(kDetWriters == 1 || kStages % 2 == 0, "two dQ writers need an even number of ring stages");
  // The dQ writer threads of a launch (the default mode has one).
  __host__ __device__ static constexpr int dq_writers(bool deterministic) { return deterministic ? kDetWriters : 1; }
  static constexpr int kConsumerWGs = kSplitD ? 2 : kBlockN / 64;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kDChunks = kTileDim / 64;     // 128-byte swizzle sub-tiles along the head dim
  static constexpr int kDChunksV = kTileDimV / 64;   // ... of V and dO
  // FlashAttention-3/4 budgets (measured: BENCHMARKS.md, Hopper backward).
  static constexpr int kConsumerRegs = 240;
  static constexpr int kProducerRegs = 24;
  // dS^T goes to shared memory by stmatrix at head dim 64 (FlashAttention-4): +2-3% there, -0-3% at
  // 128, where it spills more (BENCHMARKS.md).
  static constexpr bool kStmatrixDs = kHeadDim == 64;
  static_assert(kSplitD ? kBlockM == 64 && (kBlockN == 64 || (kBlockN == 96 && kHeadDim == 192))
                        : kBlockN == 128 && (kBlockM == 64 || (kBlockM == 128 && kHeadDim == 64)),
                "WGMMA backward: 64 x 128 tiles, or 128 x 128 at head dim 64 (S^T is 64 keys x kBlockM queries per "
                "warpgroup), 64 x 64 at head dims 192 and 256, 64 x 96 at 192");
  // A 96-key block may straddle two block_mask blocks: the producer's per-element visibility bits
  // (kMaskWords per key column and stage) then carry block_mask too.
  static_assert(kBlockMaskSize % kBlockM == 0 && (kSwapDkv || kBlockMaskSize % kBlockN == 0),
                "a tile must lie inside one block_mask block");
  static constexpr int kMaskWords = kBlockM / 32;
  static_assert(kStages >= 1 && kStages <= 16, "stages");
  static constexpr int kQSub = kBlockM / 64;  // 64-query sub-tiles of dS^T (128-byte rows)
  // dQ = dS K, split between the warpgroups: along the queries when the tile has 64 per warpgroup,
  // else along the head dim when it divides into whole 64-column sub-tiles (one per warpgroup at 128,
  // two at 256) or on the split-D path (96 columns each at 192), else along the keys. In the first
  // two, the warpgroups write disjoint elements of the tile, which the writer adds as kConsumerWGs
  // parts of kDqWgFloats (at 128 and 256 each warpgroup's own, at 192 halves of the tile that both
  // write into; the workspace's 64 x 64 sub-tiles, bwd::dq_tile_offset).
  static constexpr bool kDqSplitM = kQSub == kConsumerWGs;
  static constexpr bool kDqSplitD = !kDqSplitM && (kSplitD || kDChunks % kConsumerWGs == 0);
  static constexpr bool kDqOwnPart = kDqSplitM || kDqSplitD;
  static constexpr int kDqKeys = kDqOwnPart ? kBlockN : 64;
  static constexpr int kDqCols = kDqSplitD ? kTileDim / kConsumerWGs : 64;  // a warpgroup's dQ columns
  static constexpr int kDqWgFloats = 64 * kDqCols;                          // a warpgroup's dQ part
  // At 80 and 96 (split along the head dim, one whole 64-column sub-tile and part of a second) the
  // first warpgroup computes the whole tile, N = kHeadDim, into both parts (FlashAttention-4's
  // dQ_single_wg): N = 64 on the second's zero-filled columns is 1.6 / 1.33x the product's work.
  static constexpr bool kDqOneWg = kDqSplitD && !kSplitD && kHeadDim % 64 != 0;
  static constexpr int kDqN = kDqOneWg ? kHeadDim : 64;  // the columns of a warpgroup's dQ WGMMA
  // 8-column groups of part `part` that hold head-dim columns: past the head dim the tile is zero
  // padding (at 80 and 96 the second part's last 48 / 32 columns), which is neither stored nor added.
  __host__ __device__ static constexpr int dq_real_groups(int part) {
    if (kSplitD) return kDqCols / 8;  // 192, 256: no padding
    const int g = (kHeadDim - (kDqSplitD ? part * kDqCols : 0)) / 8;
    return g < 0 ? 0 : (g > kDqCols / 8 ? kDqCols / 8 : g);
  }
  static_assert(kSplitD || kHeadDim % 64 == 0 || kDqOneWg, "a padded dQ tile is computed by one warpgroup");
  // dK (and dQ) / dV: a warpgroup's rows (keys) and columns, kDkRegs / kDvRegs accumulators per thread.
  // (kSwapDkv: dK^T, dV^T, kHeadDim / kHeadDimV rows of head dim x kKeysPerWg keys; kDkCols is dQ's.)
  static constexpr int kDkCols = kSplitD ? kHeadDim / kConsumerWGs : kHeadDim;
  static constexpr int kDkRegs = kSwapDkv ? kHeadDim * kKeysPerWg / 128 : kDkCols / 2;
  static constexpr int kDvCols = kSplitD ? kHeadDimV / kConsumerWGs : kHeadDimV;
  static constexpr int kDvRegs = kSwapDkv ? kHeadDimV * kKeysPerWg / 128 : kDvCols / 2;
  // A split-D warpgroup's columns [cw cols, (cw + 1) cols) of a product cols wide per warpgroup
  // (kDkCols: dK, dQ; kDvCols: dV) in its accumulators: the whole 64-column sub-tiles first, from
  // split_whole_col, then (at 96 or 32 columns) the half sub-tile from split_half_col. Both
  // warpgroups keep the same register layout (at 96: N = 64 on the first 32 accumulators, N = 32 on
  // the next 16): ptxas serializes the WGMMAs where the two differ.
  __host__ __device__ static constexpr int split_whole_col(int cols, int cw) { return (cw * cols + 63) / 64 * 64; }
  __host__ __device__ static constexpr int split_whole_cols(int cols, int cw) {
    return ((cw + 1) * cols - split_whole_col(cols, cw)) / 64 * 64;  // cols >= 32: not negative
  }
  __host__ __device__ static constexpr int split_half_col(int cols, int cw) {
    return split_whole_col(cols, cw) == cw * cols ? cw * cols + split_whole_cols(cols, cw) : cw * cols;
  }
  // The first column of accumulator group j (8 columns: accumulators 4j .. 4j + 3) of warpgroup cw.
  __host__ __device__ static constexpr int acc_col(int cols, int cw, int j) {
    if (!kSplitD) return 8 * j;
    return 8 * j < split_whole_cols(cols, cw) ? split_whole_col(cols, cw) + 8 * j
                                              : split_half_col(cols, cw) + 8 * j - split_whole_cols(cols, cw);
  }
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8 > 255 ? 255 : (65536 / kThreads) / 8 * 8;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWGs <= kLaunchRegs * kThreads,
                "register budgets exceed the launch allocation (setmaxnreg.inc would deadlock)");
  // Shared memory, every tile 1024-byte aligned (offsets from a 1024-aligned base).
  static constexpr int kKBytes = kBlockN * kTileDim * 2;
  static constexpr int kVBytes = kBlockN * kTileDimV * 2;
  static constexpr int kQBytes = kBlockM * kTileDim * 2;
  static constexpr int kdOBytes = kBlockM * kTileDimV * 2;
  // dS^T [keys][queries]: kQSub sub-tiles of 128-byte rows; on the split-D path followed by P^T (the A
  // operand of dV, from shared memory there). kSwapDkv: dS, then P, [queries][keys] in 32-byte-swizzled
  // blocks of 16 keys (kDsChunkBytes each).
  static constexpr int kDsBytes = (kSplitD ? 2 : 1) * kBlockN * kBlockM * 2;
  static constexpr int kDsChunkBytes = kBlockM * 32;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKBytes;
  static constexpr int kOffQ = kOffV + kVBytes;
  static constexpr int kOffdO = kOffQ + kStages * kQBytes;
  static constexpr int kDsBuffers = kSplitD ? 1 : 2;  // dS^T buffers (tile % 2); one on the split-D path (kSm90SmemLimit)
  static constexpr int kOffdS = kOffdO + kStagesdO * kdOBytes;
  static constexpr int kOffLse = kOffdS + kDsBuffers * kDsBytes;  // kStages x kBlockM fp32
  // Epilogue: dK and dV staged over the Q / dO / dS^T ring, key rows padded by 16 bytes (the
  // 4-byte stores of a warp's 8 keys x 4 columns then fall in 32 different banks).
  static constexpr int kEpiPitch = kTileDim * 2 + 16;
  static_assert((kSwapDkv ? 1 : 2) * kBlockN * kEpiPitch <= kOffLse - kOffQ,  // kSwapDkv: one after the other
                "dK / dV staging exceeds the Q / dO / dS ring");
  static constexpr int kOffDelta = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffMask = kOffDelta + kStages * kBlockM * 4;  // kSwapDkv: visibility bits per stage
  static constexpr int kMaskStageInts = kSwapDkv ? kBlockN * kMaskWords : 0;
  static constexpr int kOffEntry = kOffMask + kStages * kMaskStageInts * 4;  // 16 int
  static constexpr int kOffHead = kOffEntry + 16 * 4;                    // 16 int
  static constexpr int kOffList = kOffHead + 16 * 4;                     // 128 int
  static constexpr int kOffWarpCounts = kOffList + 128 * 4;              // 4 int (+pad)
  static constexpr int kOffDqOff = kOffWarpCounts + 16 * 4;               // int64: the dQ tile being written
  static constexpr int kOffdQ = (kOffDqOff + 8 + 1023) / 1024 * 1024;   // dQ tile, fp32, one part per warpgroup
  // full[kStages], empty[kStages], kv, dq_full[2], dq_empty
  static constexpr int kOffBar = kOffdQ + kConsumerWGs * kDqWgFloats * 4;
  static constexpr int kEnd = kOffBar + 8 * (2 * kStages + 4 + (kOwnDoRing ? 2 * kStagesdO : 0));
  static constexpr size_t kSmemBytes = kEnd + 1024;  // + alignment slack
  static_assert(kSmemBytes <= kSm90SmemLimit, "tile config exceeds the shared memory per block (yaml/kernel_configs.yaml)");
};

// BwdWgmmaTraits' shared-memory layout placed at the CTA's dynamic shared memory, rounded up to 1024 bytes.
template <class Tr>
struct BwdSmem {
  unsigned char* base;                          // the 1024-aligned base (generic address)
  uint32_t sK, sV;                              // K and V of the key block (shared-space addresses)
  uint32_t sQ, sdO;                             // Q and dO stages
  uint32_t sdS;                                 // dS^T buffers
  uint32_t sLse, sDelta;                        // lse2 and delta stages
  uint32_t sdQ;                                 // the dQ tile handed to the writer warp
  uint32_t* mask;                               // kSwapDkv: per stage, key column, 32 rows: visibility bits
  const float* lse;                             // lse2 stages (generic)
  const float* delta;                           // delta stages (generic)
  volatile int* entry;                          // per stage: the tile's entry (index + partial tag), -1 ends
  volatile int* head;                           // per stage: the tile's query head
  int* list;                                    // the mask scheduler's compacted window
  int* warp_counts;                             // the mask scheduler's per-warp counts
  volatile int64_t* dq_off;                     // workspace offset of the dQ tile in sdQ, -1 ends
  uint32_t bar_full, bar_empty, bar_kv;         // mbarriers: [kStages], [kStages], K/V
  uint32_t bar_dq_full, bar_dq_empty;           // consumers <-> dQ writer: [2] (tile % 2), [1]
  uint32_t bar_do_full, bar_do_empty;           // kOwnDoRing: [kStagesdO] each

  __device__ __forceinline__ explicit BwdSmem(unsigned char* smem_raw) {
    const uint32_t raw_u32 = smem_u32(smem_raw);
    const uint32_t base_u32 = (raw_u32 + 1023u) & ~1023u;
    base = smem_raw + (base_u32 - raw_u32);
    sK = base_u32 + Tr::kOffK;
    sV = base_u32 + Tr::kOffV;
    sQ = base_u32 + Tr::kOffQ;
    sdO = base_u32 + Tr::kOffdO;
    sdS = base_u32 + Tr::kOffdS;
    sLse = base_u32 + Tr::kOffLse;
    sDelta = base_u32 + Tr::kOffDelta;
    lse = reinterpret_cast<const float*>(base + Tr::kOffLse);
    delta = reinterpret_cast<const float*>(base + Tr::kOffDelta);
    mask = reinterpret_cast<uint32_t*>(base + Tr::kOffMask);
    entry = reinterpret_cast<volatile int*>(base + Tr::kOffEntry);
    head = reinterpret_cast<volatile int*>(base + Tr::kOffHead);
    list = reinterpret_cast<int*>(base + Tr::kOffList);
    warp_counts = reinterpret_cast<int*>(base + Tr::kOffWarpCounts);
    bar_full = base_u32 + Tr::kOffBar;
    bar_empty = bar_full + 8 * Tr::kNumStages;
    bar_kv = bar_empty + 8 * Tr::kNumStages;
    bar_dq_full = bar_kv + 8;
    bar_dq_empty = bar_kv + 24;
    bar_do_full = bar_dq_empty + 8;
    bar_do_empty = bar_do_full + 8 * Tr::kStagesdO;
    sdQ = base_u32 + Tr::kOffdQ;
    dq_off = reinterpret_cast<volatile int64_t*>(base + Tr::kOffDqOff);
  }
};

// The CTA's key block and the sizes every role derives from the arguments.
struct BwdBlock {
  int nb, hk, b;        // key block, kv head, batch (blockIdx)
  int n0;               // first key of the block
  int group;            // query heads per kv head
  int n_mtiles;         // query tiles
  int n_kblocks;        // key blocks
  int causal_offset;    // seqlen_k - seqlen_q
};

}  // namespace fm3::hopper::sm90
