// Forward WGMMA kernel (fwd/kernel.cuh): tile sizes, per-role thread and register budgets,
// the shared-memory layout (FwdWgmmaTraits) and its addresses in one CTA (FwdSmem).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "fm3/mask.h"           // kBlockMaskSize
#include "fm3_generated_config.h"  // kSm90SmemLimit
#include "warp_primitives.cuh"  // smem_u32

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages, bool kOverlap>
struct FwdWgmmaTraits {
  static constexpr int kNumStages = kStages;
  static constexpr int kConsumerWGs = kBlockM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kProducerThreads = 128;
  // Head dims: q / k kHeadDim, v kHeadDimV, each laid out in 128-byte-swizzled sub-tiles of 64
  // columns, padded to a multiple of 64 (kDimQK, kDimV): the TMA loads fill the padding with zeros
  // (paddle_fm3_build/kernel_rules.py). The products run over the real head dims only: S = Q K^T in
  // kQkSteps k16 steps, O = P V with N = kHeadDimV (a WGMMA may end inside a swizzle atom).
  static constexpr int kDimQK = (kHeadDim + 63) / 64 * 64, kDimV = (kHeadDimV + 63) / 64 * 64;
  static constexpr int kChunksQK = kDimQK / 64, kChunksV = kDimV / 64;  // sub-tiles along the head dims
  static constexpr int kQkSteps = (kHeadDim + 15) / 16;                 // k16 steps of S = Q K^T
  // Three consumer warpgroups (head dim 64: 192-row tiles, as FlashAttention-3) share 512 threads'
  // registers: 32 + 3 x 160 per thread; two take 40 + 2 x 232.
  static constexpr int kProducerRegs = kConsumerWGs == 3 ? 32 : 40;
  static constexpr int kConsumerRegs = kConsumerWGs == 3 ? 160 : 232;
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0 && kDimQK <= 256 && kDimV <= 256,
                "head dims: multiples of 16 up to 256 (the m64nNk16 products)");
  static_assert(kBlockN == 64 || kBlockN == 112 || kBlockN == 128, "WGMMA path: block_n 64, 112 or 128");
  static_assert(kBlockM % 64 == 0 && kConsumerWGs >= 1 && kConsumerWGs <= 3, "64 rows per consumer warpgroup");
  static_assert(kStages >= 2, "at least two stages");
  // A 32-row visibility word lies inside one block_mask row block (tiles start at multiples of 64
  // rows): the producer folds block_mask into the words per key column (TileMask::block_mask_bits), so
  // a tile may span row blocks and a 112-key block column blocks (the scheduler makes it partial).
  static_assert(kBlockMaskSize % 32 == 0, "block_mask blocks vs tiles");
  static_assert(kBlockN <= kProducerThreads, "one producer thread per key column");
  // setmaxnreg.inc blocks until the registers are free: the per-role budgets must fit in what the CTA
  // got at launch (the __launch_bounds__(kThreads, 1) cap, 65536 / kThreads rounded down to 8, per thread).
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8 > 255 ? 255 : (65536 / kThreads) / 8 * 8;
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * 128 * kConsumerWGs <= kLaunchRegs * kThreads,
                "register budgets exceed the launch allocation (setmaxnreg.inc would deadlock)");
  // Shared memory, every tile 1024-byte aligned (offsets from a 1024-aligned base).
  static constexpr int kQBytes = kBlockM * kDimQK * 2;
  static constexpr int kKBytes = kBlockN * kDimQK * 2;
  static constexpr int kVBytes = kBlockN * kDimV * 2;
  static constexpr int kOffQ = 0;
  // Q double-buffered (the next tile's Q loads during this tile) where shared memory allows; at head
  // dims 192, 192/128 and 256 a second buffer does not fit beside the K/V ring, so Q loads between
  // tiles.
  static constexpr int kQBuffers = 2 * kQBytes + kStages * (kKBytes + kVBytes) + 8192 <= kSm90SmemLimit ? 2 : 1;
  // O is staged in the finished tile's Q buffer for its TMA store (fwd/epilogue.cuh); with one Q
  // buffer the next tile's Q loads once the store has read it (FlashAttention-4's sO over sQ).
  static constexpr bool kStagedO = kDimV <= kDimQK;
  static constexpr int kOffK = kOffQ + kQBuffers * kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  static constexpr int kMaskWords = kBlockM / 32;               // visibility words per key column
  static constexpr int kOffMask = kOffV + kStages * kVBytes;  // kStages x [kBlockN][kMaskWords] uint32
  static constexpr int kMaskStageInts = kMaskWords * kBlockN;
  static constexpr int kOffEntry = kOffMask + kStages * kMaskStageInts * 4;  // kStages int
  static constexpr int kOffList = kOffEntry + 16 * 4;                          // kProducerThreads int
  static constexpr int kOffWarpCounts = kOffList + kProducerThreads * 4;       // 4 int (+pad)
  static constexpr int kOffTile = kOffWarpCounts + 16 * 4;  // 2 int: next tile, by tile parity
  // full[kStages], empty[kStages] (entry, visibility bits, K; and V unless kOverlap), q[2],
  // q_empty[2], v_full[kStages], v_empty[kStages] (kOverlap: V, held until its product completes,
  // a block after K; fwd/mainloop.cuh)
  static constexpr int kOffBar = kOffTile + 16;
  static constexpr int kEnd = kOffBar + 8 * (4 * kStages + 4);
  static constexpr size_t kSmemBytes = kEnd + 1024;  // + alignment slack
  static_assert(kStages <= 16, "entry slots");
  static_assert(kSmemBytes <= kSm90SmemLimit, "tile config exceeds the shared memory per block (yaml/kernel_configs.yaml)");
};

// FwdWgmmaTraits' shared-memory layout placed at the CTA's dynamic shared memory, rounded up to 1024 bytes.
template <class Tr>
struct FwdSmem {
  uint32_t sQ, sK, sV;  // Q buffers, K and V stages (shared-space addresses)
  uint32_t* mask;       // visibility bits: kStages x [kBlockN][kMaskWords]
  volatile int* entry;  // per stage: the block's entry or a tile boundary (tile_scheduler.cuh)
  int* list;            // the mask scheduler's compacted window
  int* warp_counts;     // the mask scheduler's per-warp counts
  int* tile;            // the next tile, by tile parity
  uint32_t bar_full, bar_empty, bar_q, bar_q_empty;  // mbarriers: [kStages], [kStages], [2], [2]
  uint32_t bar_v_full, bar_v_empty;                  // mbarriers of the V ring: [kStages], [kStages]

  __device__ __forceinline__ explicit FwdSmem(unsigned char* smem_raw) {
    const uint32_t raw_u32 = smem_u32(smem_raw);
    const uint32_t base_u32 = (raw_u32 + 1023u) & ~1023u;
    unsigned char* base = smem_raw + (base_u32 - raw_u32);
    sQ = base_u32 + Tr::kOffQ;
    sK = base_u32 + Tr::kOffK;
    sV = base_u32 + Tr::kOffV;
    mask = reinterpret_cast<uint32_t*>(base + Tr::kOffMask);
    entry = reinterpret_cast<volatile int*>(base + Tr::kOffEntry);
    list = reinterpret_cast<int*>(base + Tr::kOffList);
    warp_counts = reinterpret_cast<int*>(base + Tr::kOffWarpCounts);
    bar_full = base_u32 + Tr::kOffBar;
    bar_empty = bar_full + 8 * Tr::kNumStages;
    bar_q = bar_empty + 8 * Tr::kNumStages;
    tile = reinterpret_cast<int*>(base + Tr::kOffTile);
    bar_q_empty = bar_q + 16;  // bar_q[2], then bar_q_empty[2]
    bar_v_full = bar_q_empty + 16;
    bar_v_empty = bar_v_full + 8 * Tr::kNumStages;
  }
};

}  // namespace fm3::hopper::sm90
