// FlashMask backward on Hopper: warp-specialized TMA + WGMMA
// (the FlashAttention-3 backward structure, Shah et al. 2024, made
// mask-aware as FlashMask, arXiv:2410.01359), built for sm_90a.
//
// One CTA = one (key block of kBlockN = 128 columns, kv head, batch);
// 128 * (1 + kBlockN / 64) threads:
//   warpgroup 0, the producer (setmaxnreg down): warp 0 TMA-loads K and V once;
//     then, for every query head of the GQA group, it runs the query-tile
//     scheduler (compact_window over fm3::classify_tile / apply_block_mask of
//     the key block's summary, 32 tiles per window) and its lane 0 streams the
//     surviving query tiles -- Q and dO (TMA, 128-byte swizzle), lse2 and delta
//     (1-D bulk copies) -- into a kStages-deep ring on mbarriers, with the
//     tile's entry (index + partial tag) and head beside each stage. A fully
//     masked tile is never loaded. An entry of -1 ends the stream.
//     Warp 1 is the dQ writer (below); warps 2-3 exit.
//   warpgroups 1..2, the consumers (setmaxnreg up): 64 keys each. Per tile
//     (kBlockM = 64 queries), with WGMMA:
//       S^T = K Q^T, dP^T = V dO^T            (A, B from shared memory; P^T is
//                                               computed while dP^T is in flight)
//       P^T = exp2(S^T * scale * log2e - lse2), dS^T = P^T (dP^T - delta)
//         per-element mask only on partial tiles: the thread's two key columns'
//         row intervals sit in registers for the whole CTA
//       dV += P^T dO                            (A = P^T from registers)
//       both warpgroups' dS^T in shared memory (2 buffers, one named barrier)
//       dQ = dS K                               (A = dS^T, MN-major, from shared
//         memory; split between the warpgroups along the head dim (D=128) or
//         the keys (D=64)), then dK += dS^T Q (A = dS^T from registers): dQ
//         is stored to shared memory in accumulator order while dK runs, and
//         the writer warp adds the tile to the fp32 workspace with one bulk
//         reduction (cp.reduce.async.bulk .add.f32) per warpgroup part,
//         handing the buffer back once it has been read.
//         Deterministic mode (kWriteDq = false) leaves dQ to the row-parallel
//         pass.
//     dK, dV stay in registers over the whole GQA group; the epilogue stages
//     them in shared memory and writes them with 16-byte coalesced stores.
// Operand descriptors are built once per CTA (SmemDesc) and moved by constant offsets, with the
// warpgroup index broadcast so the compiler keeps them in uniform registers. Measurements and the
// variants tried: BENCHMARKS.md (Hopper backward).
// block_mask: a tile lies inside one 128 x 128 block, so apply_block_mask
// decides it whole and no per-element block_mask lookup is needed.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "attn_args.h"  // BwdArgs
#include "bwd_common.cuh"  // classify_pair, no_mask_summary, mask_head, dq_tile_offset
#include "fm3/mask.h"
#include "mask_scheduler.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack, fast_exp2
#include "sm90_primitives.cuh"

namespace fm3::hopper::sm90 {

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kStages>
struct BwdWgTraits {
  static constexpr int kConsumerWGs = kBlockN / 64;  // 64 keys per consumer warpgroup
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kDChunks = kHeadDim / 64;     // 128-byte swizzle sub-tiles along the head dim
  // FlashAttention-3/4 budgets (measured: BENCHMARKS.md, Hopper backward).
  static constexpr int kConsumerRegs = 240;
  static constexpr int kProducerRegs = 24;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "WGMMA backward: head dim 64 or 128");
  static_assert(kBlockN == 128 && (kBlockM == 64 || (kBlockM == 128 && kHeadDim == 64)),
                "WGMMA backward: 64 x 128 tiles, or 128 x 128 at head dim 64 (S^T is 64 keys x kBlockM queries per warpgroup)");
  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile must lie inside one block_mask block");
  static_assert(kStages >= 2 && kStages <= 16, "stages");
  static constexpr int kQSub = kBlockM / 64;  // 64-query sub-tiles of dS^T (128-byte rows)
  // dQ = dS K, split between the warpgroups: along the queries when the tile has 64 per warpgroup,
  // else along the head dim when each warpgroup has its own 64-column sub-tile, else along the keys.
  // In the first two, each warpgroup's part is one 64 x 64 tile of the dQ workspace.
  static constexpr bool kDqSplitM = kQSub == kConsumerWGs;
  static constexpr bool kDqSplitD = !kDqSplitM && kDChunks == kConsumerWGs;
  static constexpr bool kDqOwnPart = kDqSplitM || kDqSplitD;
  static constexpr int kDqKeys = kDqOwnPart ? kBlockN : 64;
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8 > 255 ? 255 : (65536 / kThreads) / 8 * 8;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWGs <= kLaunchRegs * kThreads,
                "register budgets exceed the launch allocation (setmaxnreg.inc would deadlock)");
  // Shared memory, every tile 1024-byte aligned (offsets from a 1024-aligned base).
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T [keys][queries]: kQSub sub-tiles of 128-byte rows
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKBytes;
  static constexpr int kOffQ = kOffV + kKBytes;
  static constexpr int kOffdO = kOffQ + kStages * kQBytes;
  static constexpr int kDsBuffers = 2;  // dS^T buffers (tile % 2)
  static constexpr int kOffdS = kOffdO + kStages * kQBytes;
  static constexpr int kOffLse = kOffdS + kDsBuffers * kDsBytes;  // kStages x kBlockM fp32
  // Epilogue: dK and dV staged over the Q / dO / dS^T ring, key rows padded by 16 bytes (the
  // 4-byte stores of a warp's 8 keys x 4 columns then fall in 32 different banks).
  static constexpr int kEpiPitch = kHeadDim * 2 + 16;
  static_assert(2 * kBlockN * kEpiPitch <= kOffLse - kOffQ, "dK / dV staging exceeds the Q / dO / dS ring");
  static constexpr int kOffDelta = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffEntry = kOffDelta + kStages * kBlockM * 4;  // 16 int
  static constexpr int kOffHead = kOffEntry + 16 * 4;                    // 16 int
  static constexpr int kOffList = kOffHead + 16 * 4;                     // 128 int
  static constexpr int kOffWarpCounts = kOffList + 128 * 4;              // 4 int (+pad)
  static constexpr int kOffDqOff = kOffWarpCounts + 16 * 4;               // int64: the dQ tile being written
  static constexpr int kOffdQ = (kOffDqOff + 8 + 1023) / 1024 * 1024;   // dQ tile, fp32, 2 x 16 KB (writer mode)
  static constexpr int kDqChunkFloats = 64 * 64;                         // one warpgroup's 64 x 64 part
  // full[kStages], empty[kStages], kv, dq_full, dq_empty
  static constexpr int kOffBar = kOffdQ + 2 * kDqChunkFloats * 4;
  static constexpr int kEnd = kOffBar + 8 * (2 * kStages + 3);
  static constexpr size_t kSmemBytes = kEnd + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "tile config exceeds the 227 KiB of shared memory per block (yaml/kernel_configs.yaml)");
};

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kStages, bool kWriteDq>
__global__ void __launch_bounds__(BwdWgTraits<T, kHeadDim, kBlockM, kBlockN, kStages>::kThreads, 1)
    flash_bwd_wgmma_kernel(const __grid_constant__ bwd::BwdArgs a, const __grid_constant__ CUtensorMap tmap_q,
                           const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                           const __grid_constant__ CUtensorMap tmap_do) {
  using Tr = BwdWgTraits<T, kHeadDim, kBlockM, kBlockN, kStages>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_u32 = smem_u32(smem_raw);
  const uint32_t base_u32 = (raw_u32 + 1023u) & ~1023u;
  unsigned char* base = smem_raw + (base_u32 - raw_u32);
  const uint32_t sK = base_u32 + Tr::kOffK, sV = base_u32 + Tr::kOffV;
  const uint32_t sQ = base_u32 + Tr::kOffQ, sdO = base_u32 + Tr::kOffdO;
  const uint32_t sdS = base_u32 + Tr::kOffdS;
  const uint32_t sLse = base_u32 + Tr::kOffLse, sDelta = base_u32 + Tr::kOffDelta;
  const float* lse_s = reinterpret_cast<const float*>(base + Tr::kOffLse);
  const float* delta_s = reinterpret_cast<const float*>(base + Tr::kOffDelta);
  volatile int* sEntry = reinterpret_cast<volatile int*>(base + Tr::kOffEntry);
  volatile int* sHead = reinterpret_cast<volatile int*>(base + Tr::kOffHead);
  int* sList = reinterpret_cast<int*>(base + Tr::kOffList);
  int* sWarpCounts = reinterpret_cast<int*>(base + Tr::kOffWarpCounts);
  const uint32_t bar_full = base_u32 + Tr::kOffBar;
  const uint32_t bar_empty = bar_full + 8 * kStages;
  const uint32_t bar_kv = bar_empty + 8 * kStages;
  const uint32_t bar_dq_full = bar_kv + 8, bar_dq_empty = bar_kv + 16;  // consumers <-> dQ writer warp
  const uint32_t sdQ = base_u32 + Tr::kOffdQ;
  volatile int64_t* sDqOff = reinterpret_cast<volatile int64_t*>(base + Tr::kOffDqOff);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // broadcast: the compiler sees it warp-uniform
  const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int n0 = nb * kBlockN;
  const int group = a.num_heads / a.num_heads_k;
  const int n_mtiles = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_kblocks = (a.seqlen_k + kBlockN - 1) / kBlockN;
  const int causal_offset = a.seqlen_k - a.seqlen_q;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + 8 * s, 1);                    // lane 0 of producer warp 0 (+ transaction bytes)
      mbar_init(bar_empty + 8 * s, 128 * Tr::kConsumerWGs);  // every consumer thread
    }
    mbar_init(bar_kv, 1);
    mbar_init(bar_dq_full, 128 * Tr::kConsumerWGs);
    mbar_init(bar_dq_empty, 1);
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------ producer ------------------------------
    reg_dealloc<Tr::kProducerRegs>();
    if constexpr (kWriteDq) {
      if (warp == 1 && lane == 0) {
        // dQ writer: per tile, one bulk fp32 reduction per warpgroup part into the tile-blocked
        // workspace; the shared buffer is handed back once the reductions have read it.
        for (int k = 0;; ++k) {
          mbar_wait(bar_dq_full, k & 1);
          const int64_t off = *sDqOff;
          if (off < 0) break;
#pragma unroll
          for (int part = 0; part < Tr::kConsumerWGs; ++part)
            bulk_reduce_add_f32(a.dq_accum + off + (Tr::kDqOwnPart ? part * Tr::kDqChunkFloats : 0),
                                sdQ + part * Tr::kDqChunkFloats * 4, Tr::kDqChunkFloats * 4);
          bulk_commit();
          bulk_wait_read<0>();
          mbar_arrive(bar_dq_empty);
        }
        bulk_wait<0>();  // every reduction has landed before the CTA exits
      }
    }
    if (warp != 0) return;  // warp 0 schedules and loads; warps 2-3 (and 1 unless writing dQ) have no work
    if (lane == 0) {
      tma_prefetch_desc(&tmap_q);
      tma_prefetch_desc(&tmap_do);
      mbar_arrive_expect_tx(bar_kv, 2 * Tr::kKBytes);
#pragma unroll
      for (int c = 0; c < Tr::kDChunks; ++c) {
        tma_load_4d(sK + c * kBlockN * 128, &tmap_k, bar_kv, c * 64, n0, hk, b);
        tma_load_4d(sV + c * kBlockN * 128, &tmap_v, bar_kv, c * 64, n0, hk, b);
      }
    }
    int stage = 0, phase = 0;
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
      const int64_t bhm = static_cast<int64_t>(b) * a.mask_heads + bwd::mask_head(a, h);
      const int32_t* bm = a.block_mask ? a.block_mask + bhm * a.bm_rows * a.bm_cols : nullptr;
      const BlockSummary summ = a.summary ? a.summary[bhm * n_kblocks + nb] : bwd::no_mask_summary(a.seqlen_q);
      const int64_t bh = static_cast<int64_t>(b) * a.num_heads + h;
      const float* lse2 = a.lse2 + bh * a.lse_stride;
      const float* delta = a.delta + bh * a.lse_stride;
      auto classify = [&](int mt) {
        return bwd::classify_pair(summ, bm, a.bm_cols, mt * kBlockM, kBlockM, n0, kBlockN, a.seqlen_q, a.seqlen_k,
                                  a.causal, causal_offset);
      };
      for (int first = 0; first < n_mtiles; first += 32) {
        const int count = compact_window<32, 1>(classify, first, n_mtiles, sList, sWarpCounts);
        for (int i = 0; i < count; ++i) {
          if (lane == 0) {
            const int entry = sList[i];
            const int m0 = BlockEntry::block(entry) * kBlockM;
            mbar_wait(bar_empty + 8 * stage, phase ^ 1);
            sEntry[stage] = entry;
            sHead[stage] = h;
            const uint32_t full = bar_full + 8 * stage;
            mbar_arrive_expect_tx(full, 2 * Tr::kQBytes + 2 * kBlockM * 4);
#pragma unroll
            for (int c = 0; c < Tr::kDChunks; ++c) {
              tma_load_4d(sQ + stage * Tr::kQBytes + c * kBlockM * 128, &tmap_q, full, c * 64, m0, h, b);
              tma_load_4d(sdO + stage * Tr::kQBytes + c * kBlockM * 128, &tmap_do, full, c * 64, m0, h, b);
            }
            bulk_load_1d(sLse + stage * kBlockM * 4, lse2 + m0, kBlockM * 4, full);
            bulk_load_1d(sDelta + stage * kBlockM * 4, delta + m0, kBlockM * 4, full);
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
        __syncwarp();
      }
    }
    if (lane == 0) {  // end of stream
      mbar_wait(bar_empty + 8 * stage, phase ^ 1);
      sEntry[stage] = -1;
      mbar_arrive(bar_full + 8 * stage);
    }
    return;
  }

  // ------------------------------ consumers ------------------------------
  reg_alloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;   // consumer warpgroup: keys [cw * 64, cw * 64 + 64) of the block
  const int wq = warp % 4;  // warp within the warpgroup: 16 keys (S^T rows) / 16 queries (dQ rows)
  const int g = lane / 4, t = lane % 4;
  const int key_local = cw * 64 + wq * 16 + g;  // this thread's keys: key_local and key_local + 8
  constexpr int kD = kHeadDim / 2;              // dK / dV accumulators per thread (m64 x kHeadDim)
  float dk[kD], dv[kD];
#pragma unroll
  for (int i = 0; i < kD; ++i) dk[i] = dv[i] = 0.f;
  ColumnBounds cb[2];
  int cur_hm = -1, cur_h = -1, hm = 0;
  int64_t head_off = 0;
  // Operand descriptors, built once; a tile's operands are these moved by constant byte offsets.
  const SmemDesc dsc_k = smem_desc(sK + cw * 64 * 128, 16, 1024);  // this warpgroup's keys (S^T A operand)
  const SmemDesc dsc_v = smem_desc(sV + cw * 64 * 128, 16, 1024);
  const SmemDesc dsc_q = smem_desc(sQ, 16, 1024), dsc_do = smem_desc(sdO, 16, 1024);  // K-major B of S^T, dP^T
  const SmemDesc dsc_q_mn = smem_desc(sQ, kBlockM * 128, 1024);                       // MN-major B of dK, dV
  const SmemDesc dsc_do_mn = smem_desc(sdO, kBlockM * 128, 1024);
  const SmemDesc dsc_ds = smem_desc(sdS, 16, 1024);                                   // MN-major A of dQ
  const SmemDesc dsc_kd = smem_desc(sK + (Tr::kDqSplitD ? cw * kBlockN * 128 : 0), kBlockN * 128, 1024);
  constexpr int kS = kBlockM / 2;   // S^T / dP^T accumulators per thread (64 keys x kBlockM queries)
  constexpr int kKs = kBlockM / 16;  // k16 steps of dV / dK (queries)

  // dQ (64 queries x 64 head-dim columns) = dS K over kDqKeys keys, from dS^T buffer `buf`:
  // A = dS^T [keys][queries] and B = K [keys][head dim], both MN-major (k16 step = 16 key rows).
  auto issue_dq = [&](int buf, float (&dq)[32]) {
    const uint32_t key0 = Tr::kDqOwnPart ? 0 : cw * 64 * 128;
    const uint32_t qsub = Tr::kDqSplitM ? cw * kBlockN * 128 : 0;  // this warpgroup's 64 queries
    gmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::kDqKeys / 16; ++ks)
      gmma_ss_mn<T, 64>(dsc_ds.at(buf * Tr::kDsBytes + qsub + key0 + ks * 2048), dsc_kd.at(key0 + ks * 2048), dq,
                        ks > 0);
    gmma_commit();
  };
  // This warpgroup's 64 x 64 part of the dQ tile at workspace offset `off` to shared memory in
  // accumulator order (bwd::dq_tile_offset), once the writer has read the previous tile's; the
  // writer warp adds it to the workspace.
  int dq_count = 0;
  auto write_dq = [&](const float (&dq)[32], int64_t off) {
    if (dq_count > 0) mbar_wait(bar_dq_empty, (dq_count - 1) & 1);
    float* dst = reinterpret_cast<float*>(base + Tr::kOffdQ) + cw * Tr::kDqChunkFloats + wq * 8 * 128 + lane * 4;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<float4*>(dst + j * 128) = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
    fence_proxy_async();  // read by the bulk reduction (async proxy)
    if (cw == 0 && wq == 0 && lane == 0) *sDqOff = off;
    mbar_arrive(bar_dq_full);
    ++dq_count;
  };

  mbar_wait(bar_kv, 0);
  int stage = 0, phase = 0, iter = 0;
  for (;; ++iter) {
    mbar_wait(bar_full + 8 * stage, phase);
    const int entry = sEntry[stage];
    if (entry < 0) break;
    const int h = sHead[stage];
    const int m0 = BlockEntry::block(entry) * kBlockM;
    const bool partial = BlockEntry::partial(entry);
    if (h != cur_h) {  // per-head values, once per head (the division stays out of the tile loop)
      cur_h = h;
      hm = bwd::mask_head(a, h);
      head_off = (static_cast<int64_t>(b) * a.num_heads + h) * a.lse_stride;
    }
    if (partial && hm != cur_hm) {  // the two key columns' bounds, once per mask head
      const int64_t bhm = static_cast<int64_t>(b) * a.mask_heads + hm;
      const int32_t* sri = a.sri ? a.sri + bhm * a.seqlen_k * a.mask_cols : nullptr;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        cb[r] = column_bounds(sri, n0 + key_local + 8 * r, a.seqlen_q, a.seqlen_k, a.mask_cols, a.causal,
                              causal_offset);
      cur_hm = hm;
    }
    const uint32_t qoff = stage * Tr::kQBytes;  // this stage's Q and dO

    // S^T = K Q^T and dP^T = V dO^T: 64 keys x kBlockM queries each.
    float s[kS], dp[kS];
    gmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;  // k16 step within the 128-byte row
      gmma_ss<T, kBlockM>(dsc_k.at((ks / 4) * kBlockN * 128 + off), dsc_q.at(qoff + (ks / 4) * kBlockM * 128 + off),
                          s, ks > 0);
    }
    gmma_commit();  // S^T first: P^T is computed while dP^T is in flight
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks % 4) * 32;
      gmma_ss<T, kBlockM>(dsc_v.at((ks / 4) * kBlockN * 128 + off), dsc_do.at(qoff + (ks / 4) * kBlockM * 128 + off),
                          dp, ks > 0);
    }
    gmma_commit();
    // P^T and dS^T (fp32, in place; masked per element on partial tiles), packed as the register
    // A operands of dV and dK.
    // 64-query tiles: this thread's queries' lse2 is read while S^T is in flight, and delta while dP^T
    // is (query pairs 2t, 2t + 1 are adjacent); 128-query tiles have no registers to spare for them.
    constexpr bool kStatsInRegs = kBlockM == 64;
    const float* lse_t = lse_s + stage * kBlockM;
    const float* delta_t = delta_s + stage * kBlockM;
    float2 l2[kBlockM / 8], dlt[kBlockM / 8];
    if constexpr (kStatsInRegs) {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) l2[j] = *reinterpret_cast<const float2*>(lse_t + j * 8 + 2 * t);
    }
    gmma_wait<1>();
    fence_regs(s);
    // Two copies of the loop, so that tiles without masked elements carry no per-element test.
    auto softmax = [&](auto masked) {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int ql = j * 8 + 2 * t + c;
          const float lse2 = !kStatsInRegs ? lse_t[ql] : c == 0 ? l2[j].x : l2[j].y;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int i = j * 4 + 2 * r + c;
            float p = fast_exp2(s[i] * a.scale_log2 - lse2);  // lse2 = +inf (empty row, padding): 0
            if constexpr (decltype(masked)::value) {
              if (row_masked(cb[r], m0 + ql)) p = 0.f;
            }
            s[i] = p;
          }
        }
    };
    if (partial)
      softmax(std::true_type{});
    else
      softmax(std::false_type{});
    if constexpr (kStatsInRegs) {
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) dlt[j] = *reinterpret_cast<const float2*>(delta_t + j * 8 + 2 * t);
    }
    gmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float dl = !kStatsInRegs ? delta_t[j * 8 + 2 * t + c] : c == 0 ? dlt[j].x : dlt[j].y;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = j * 4 + 2 * r + c;
          dp[i] = s[i] * (dp[i] - dl);
        }
      }
    uint32_t pp[kKs][4], pds[kKs][4];
#pragma unroll
    for (int ps = 0; ps < kKs; ++ps)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pp[ps][e] = Mma<T>::pack(s[8 * ps + 2 * e], s[8 * ps + 2 * e + 1]);
        pds[ps][e] = Mma<T>::pack(dp[8 * ps + 2 * e], dp[8 * ps + 2 * e + 1]);
      }
    const int dsb = iter % Tr::kDsBuffers;
    if constexpr (kWriteDq) {
      // dS^T to shared memory, [keys][queries] as kQSub sub-tiles of 64 queries, 128-byte rows,
      // 16-byte chunks XOR-swizzled by (key % 8) as TMA would write it. pds[ps][e]: key row
      // key_local + 8 * (e % 2), queries 8 * (2 * ps + e / 2) + 2t, +1. Two buffers: both
      // warpgroups' dQ of tile iter - 2 completed before either passed the dS barrier of tile iter - 1.
      unsigned char* dst = base + Tr::kOffdS + dsb * Tr::kDsBytes;
#pragma unroll
      for (int ps = 0; ps < kKs; ++ps)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = key_local + 8 * (e % 2), chunk = (2 * ps + e / 2) % 8, sub = ps / 4;
          *reinterpret_cast<uint32_t*>(dst + sub * kBlockN * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * t) =
              pds[ps][e];
        }
      fence_proxy_async();  // the stores above are read by WGMMA (async proxy)
    }
    // dV += P^T dO (B = dO [queries][head dim], MN-major, k16 step = 16 query rows); then, once both
    // warpgroups' dS^T is in shared memory, dQ = dS K, and dK += dS^T Q while dQ goes to the writer.
    gmma_fence();
#pragma unroll
    for (int ps = 0; ps < kKs; ++ps) gmma_rs<T, kHeadDim>(pp[ps], dsc_do_mn.at(qoff + ps * 2048), dv);
    gmma_commit();
    if constexpr (kWriteDq) {
      named_barrier_sync(6, 128 * Tr::kConsumerWGs);  // both halves of dS^T written
      float dq[32];
      issue_dq(dsb, dq);
      gmma_wait<1>();  // dV done
      fence_regs(dv);
      fence_regs(pp);
#pragma unroll
      for (int ps = 0; ps < kKs; ++ps) gmma_rs<T, kHeadDim>(pds[ps], dsc_q_mn.at(qoff + ps * 2048), dk);
      gmma_commit();
      gmma_wait<1>();  // dQ done; dK runs while dQ is stored
      fence_regs(dq);
      write_dq(dq, (head_off + m0) * kHeadDim);
    } else {
#pragma unroll
      for (int ps = 0; ps < kKs; ++ps) gmma_rs<T, kHeadDim>(pds[ps], dsc_q_mn.at(qoff + ps * 2048), dk);
      gmma_commit();
    }
    gmma_wait<0>();
    fence_regs(dk);
    fence_regs(dv);
    fence_regs(pp);
    fence_regs(pds);
    mbar_arrive(bar_empty + 8 * stage);  // Q, dO, lse2, delta of this stage are no longer read
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }

  if constexpr (kWriteDq) {  // end of the dQ stream
    if (dq_count > 0) mbar_wait(bar_dq_empty, (dq_count - 1) & 1);
    if (cw == 0 && wq == 0 && lane == 0) *sDqOff = -1;
    mbar_arrive(bar_dq_full);
  }
  (void)sdQ;

  // Epilogue: dK * softmax_scale and dV staged in shared memory (the Q / dO / dS^T ring, free once
  // both warpgroups are past their last tile) in rows padded to a conflict-free pitch, then written
  // with 16-byte coalesced stores, each warpgroup its own 64 keys.
  named_barrier_sync(6, 128 * Tr::kConsumerWGs);
  unsigned char* stage_k = base + Tr::kOffQ;
  unsigned char* stage_v = stage_k + kBlockN * Tr::kEpiPitch;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key_local + 8 * r;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int off = row * Tr::kEpiPitch + (8 * j + 2 * t) * 2;
      *reinterpret_cast<uint32_t*>(stage_k + off) = Mma<T>::pack(dk[j * 4 + 2 * r] * a.scale, dk[j * 4 + 2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(stage_v + off) = Mma<T>::pack(dv[j * 4 + 2 * r], dv[j * 4 + 2 * r + 1]);
    }
  }
  named_barrier_sync(4 + cw, 128);  // this warpgroup's rows are staged
  T* dkg = static_cast<T*>(a.dk) + b * a.k_bs + hk * a.k_hs;
  T* dvg = static_cast<T*>(a.dv) + b * a.v_bs + hk * a.v_hs;
  constexpr int kRowChunks = kHeadDim / 8;  // 16-byte chunks per key row
#pragma unroll
  for (int i = tid % 128; i < 64 * kRowChunks; i += 128) {
    const int row = cw * 64 + i / kRowChunks, chunk = i % kRowChunks;
    const int key = n0 + row;
    if (key < a.seqlen_k) {
      const int off = row * Tr::kEpiPitch + chunk * 16;
      *reinterpret_cast<uint4*>(dkg + static_cast<int64_t>(key) * a.k_rs + chunk * 8) =
          *reinterpret_cast<const uint4*>(stage_k + off);
      *reinterpret_cast<uint4*>(dvg + static_cast<int64_t>(key) * a.v_rs + chunk * 8) =
          *reinterpret_cast<const uint4*>(stage_v + off);
    }
  }
}

}  // namespace fm3::hopper::sm90
