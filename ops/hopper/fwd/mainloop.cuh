// Forward WGMMA kernel (fwd/kernel.cuh): the consumers, warpgroups 1..kConsumerWGs, 64 query
// rows each. Per tile of the scheduler (fwd/tile_scheduler.cuh), one of two loops over its key
// blocks, chosen per head dim in yaml/kernel_configs.yaml (intra_wg_overlap):
// - plain: per block, S = Q K^T (A and B from shared memory), the per-element mask (partial
//   entries only) and online softmax, O += P V (A = P from registers, V MN-major), each product
//   waited for before the next step; the block's K/V stage is handed back after its product.
// - overlapped (FlashAttention-3's intra-warpgroup overlap): S_i = Q K_i^T is issued together with
//   O += P_{i-1} V_{i-1}, and the mask and softmax of S_i run while that product is in flight. K,
//   the entry and the visibility bits of a block are handed back (K ring "empty") after its
//   softmax; V after its product (V ring "v_empty"), which completes a block later -- hence the
//   two rings. The loop holds the block twice, one copy for unmasked blocks, so that their path
//   has no jump over the per-element mask code.
// At the tile boundary the consumers write the tile (fwd/epilogue.cuh) and hand the Q buffer back
// (q_empty; after O's staged store has read it, else before the epilogue).
//
// Measured (H200, BENCHMARKS.md): the overlap gains up to 5% at D=256 and D=128 and loses 4-5% at
// D=64 on full / causal, where a block's products are short. An earlier pipelined loop ran at 306
// (one K+V barrier per stage) and 460 TFLOP/s (separate barriers) against 536-552 for the plain
// loop: ptxas serialized its wgmma (C7514) because a product issued under a condition was waited
// for under another. Here the first block is peeled so every product is waited for in its
// iteration; and ptxas, left alone, sinks the softmax's exp2 below the product's wait (SASS: MUFU
// after WARPGROUP.DEPBAR), so the next entry is awaited between them.
#pragma once
#include <math_constants.h>
#include <stdint.h>

#include "attn_args.h"  // FwdArgs
#include "fm3/mask.h"   // BlockEntry
#include "fwd/epilogue.cuh"
#include "fwd/tile_scheduler.cuh"
#include "fwd/traits.cuh"
#include "sm90_primitives.cuh"
#include "warp_primitives.cuh"  // Mma<T>::pack, fast_exp2

namespace fm3::hopper::sm90 {

// The accumulators live in this function across the tile loop and the per-block steps are lambdas
// over them: with the accumulators passed in by reference (the loop in the kernel), nvcc, which
// optimizes a function before inlining it, emits different machine code.
template <typename T, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kStages, bool kOverlap>
__device__ __forceinline__ void fwd_consumer(const FwdArgs& a, const FwdSmem<FwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>>& sm,
                                             const FwdTileScheduler<kBlockM>& sched, const CUtensorMap* tmap_o, int wg,
                                             int warp, int lane) {
  using Tr = FwdWgmmaTraits<T, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, kOverlap>;
  const int cw = wg - 1;               // consumer warpgroup: rows [cw * 64, cw * 64 + 64) of the tile
  const int wq = warp % 4;             // warp within the warpgroup: 16 rows
  const int g = lane / 4, t = lane % 4;
  const int row_base = cw * 64 + wq * 16 + g;  // tile-local rows row_base and row_base + 8
  constexpr int kS = kBlockN / 2;      // S accumulators per thread
  constexpr int kO = kHeadDimV / 2;    // O accumulators per thread
  float o[kO];
  float row_max[2], row_sum[2];  // log2 units; row_sum over this thread's columns only
  // Operand descriptors, built once; a block's operands are these moved by byte offsets.
  const SmemDesc dsc_q = smem_desc(sm.sQ + cw * 64 * 128, 16, 1024);  // this warpgroup's 64 rows of Q buffer 0
  const SmemDesc dsc_k = smem_desc(sm.sK, 16, 1024), dsc_v = smem_desc(sm.sV, kBlockN * 128, 1024);
  uint32_t qoff = 0;  // the tile's Q buffer (set per tile)

  // S = Q K^T for the block in `stage` (issued, not waited for).
  auto issue_qk = [&](float (&s)[kS], int stage) {
    const SmemDesc q = dsc_q.plus(qoff), k = dsc_k.plus(stage * Tr::kKBytes);
#pragma unroll
    for (int ks = 0; ks < Tr::kQkSteps; ++ks) {
      const uint32_t off = (ks % 4) * 32;  // k16 step within the 128-byte row
      gmma_ss<T, kBlockN>(q.at((ks / 4) * kBlockM * 128 + off), k.at((ks / 4) * kBlockN * 128 + off), s, ks > 0);
    }
    gmma_commit();
  };
  // O += P V for the block in `stage` (issued, not waited for).
  auto issue_pv = [&](const uint32_t (&p)[kBlockN / 16][4], int stage) {
    const SmemDesc v = dsc_v.plus(stage * Tr::kVBytes);
#pragma unroll
    for (int ps = 0; ps < kBlockN / 16; ++ps) gmma_rs<T, kHeadDimV>(p[ps], v.at(ps * 2048), o);
    gmma_commit();
  };
  // Mask (partial blocks only), online-softmax update of row_max (log2 units) / row_sum; S becomes
  // P (unnormalized, fp32), the scale into log2 units folded into the exponent's FFMA (the scale is
  // > 0, so the raw maximum scales to the scaled one); returns the two rows' rescale factors for O.
  // may_be_partial (a constant where the lambda is inlined): false for a block known to be
  // unmasked, true for one that may be partial (then its entry decides).
  auto softmax = [&](float (&s)[kS], int entry, int stage, float (&alpha)[2], bool may_be_partial) {
    if (may_be_partial && BlockEntry::partial(entry)) {
      // This thread's rows row_base and row_base + 8 lie in one 32-row word of each column.
      const uint32_t* bits = sm.mask + stage * Tr::kMaskStageInts + row_base / 32;
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
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * r], s[j * 4 + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(row_max[r], mx * a.scale_log2);
      const float base_m = mx == -CUDART_INF_F ? 0.f : mx;  // nothing visible yet: keep p = 0
      alpha[r] = fast_exp2(row_max[r] - base_m);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        s[j * 4 + 2 * r] = fast_exp2(fmaf(s[j * 4 + 2 * r], a.scale_log2, -base_m));
        s[j * 4 + 2 * r + 1] = fast_exp2(fmaf(s[j * 4 + 2 * r + 1], a.scale_log2, -base_m));
        sum += s[j * 4 + 2 * r] + s[j * 4 + 2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  };
  // O *= alpha. The overlapped loop skips it when neither row's maximum moved (most blocks once the
  // maximum settles); the plain loop runs faster without the branch (BENCHMARKS.md, 2026-12-02).
  auto rescale_o = [&](const float (&alpha)[2]) {
    if (kOverlap && alpha[0] == 1.f && alpha[1] == 1.f) return;
#pragma unroll
    for (int d = 0; d < kHeadDimV / 8; ++d)
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

  RingCursor<kStages> ring, vring;
  int tile = first_tile(sm, ring);
  for (int k = 0; tile < a.num_tiles; ++k) {
    const FwdTile x = sched.tile_at(a, tile);
    const int qb = k % Tr::kQBuffers;
    qoff = qb * Tr::kQBytes;
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = -CUDART_INF_F;
      row_sum[r] = 0.f;
    }
    mbar_wait(sm.bar_q + 8 * qb, (k / Tr::kQBuffers) & 1);
    if constexpr (!kOverlap) {
      for (;;) {
        const int stage = ring.stage;
        mbar_wait(sm.bar_full + 8 * stage, ring.phase);
        const int entry = sm.entry[stage];
        if (is_tile_boundary(entry)) {  // end of this tile; the boundary names the next one
          tile = boundary_tile(entry);
          mbar_arrive(sm.bar_empty + 8 * stage);
          ring.advance();
          break;
        }
        float s[kS];
        gmma_fence();
        issue_qk(s, stage);
        gmma_wait<0>();
        fence_regs(s);
        float alpha[2];
        softmax(s, entry, stage, alpha, true);
        rescale_o(alpha);
        uint32_t p[kBlockN / 16][4];
        pack_p(s, p);
        fence_regs(o);
        gmma_fence();
        issue_pv(p, stage);
        gmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
        mbar_arrive(sm.bar_empty + 8 * stage);  // this thread is done with the stage (its reads happen-before the refill)
        ring.advance();
      }
    } else {
      // Software pipeline over the tile's blocks: S_i = Q K_i^T is issued together with
      // O += P_{i-1} V_{i-1}, so the softmax of S_i runs while that product is in flight. The first
      // block is peeled off, so that every product issued in the loop is waited for in the same
      // iteration (ptxas serializes the wgmma when it cannot see that).
      // Next entry of the K ring; false (and the next tile named) at the tile boundary.
      auto next_block = [&](int& entry) {
        mbar_wait(sm.bar_full + 8 * ring.stage, ring.phase);
        entry = sm.entry[ring.stage];
        if (!is_tile_boundary(entry)) return true;
        tile = boundary_tile(entry);
        mbar_arrive(sm.bar_empty + 8 * ring.stage);
        ring.advance();
        return false;
      };
      int entry;
      if (next_block(entry)) {
        uint32_t p[kBlockN / 16][4];  // P_{i-1}, the register A operand of the pending product
        float s[kS];
        float alpha[2];
        gmma_fence();
        issue_qk(s, ring.stage);
        gmma_wait<0>();
        fence_regs(s);
        softmax(s, entry, ring.stage, alpha, true);
        mbar_arrive(sm.bar_empty + 8 * ring.stage);  // K and the visibility bits of this block are read
        ring.advance();
        bool more = next_block(entry);
        pack_p(s, p);  // O is still 0: no rescale
        alpha[0] = alpha[1] = 1.f;
        // One block of the loop; two copies of it, so that an unmasked block runs without the
        // per-element mask code in its path.
        auto step = [&](bool may_be_partial) {
          fence_regs(p);
          gmma_fence();
          issue_qk(s, ring.stage);
          // O (P_{i-2} V_{i-2} done) rescaled for P_{i-1} while S_i runs, as FlashAttention-3 does,
          // instead of between P_{i-2} V_{i-2}'s wait and S_i's issue, where the tensor cores idle.
          rescale_o(alpha);
          mbar_wait(sm.bar_v_full + 8 * vring.stage, vring.phase);  // V_{i-1}: loaded a block ago
          fence_regs(o);
          gmma_fence();
          issue_pv(p, vring.stage);
          gmma_wait<1>();  // S_i done, P_{i-1} V_{i-1} may still run
          fence_regs(s);
          softmax(s, entry, ring.stage, alpha, may_be_partial);
          fence_regs(s);
          mbar_arrive(sm.bar_empty + 8 * ring.stage);
          ring.advance();
          // The next entry is awaited before the product's wait: besides overlapping the two waits,
          // the control flow between them keeps ptxas from sinking the softmax below the wait.
          more = next_block(entry);
          gmma_wait<0>();
          fence_regs(o);
          fence_regs(p);
          mbar_arrive(sm.bar_v_empty + 8 * vring.stage);
          vring.advance();
          pack_p(s, p);
        };
        while (more) {
          if (BlockEntry::partial(entry))
            step(true);
          else
            step(false);
        }
        // The tile's last block.
        rescale_o(alpha);
        mbar_wait(sm.bar_v_full + 8 * vring.stage, vring.phase);
        fence_regs(o);
        fence_regs(p);
        gmma_fence();
        issue_pv(p, vring.stage);
        gmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
        mbar_arrive(sm.bar_v_empty + 8 * vring.stage);
        vring.advance();
      }
    }
    if constexpr (Tr::kStagedO) {
      if (a.o_staged) {  // hands the Q buffer back itself, once O has left it
        fwd_epilogue_staged<T, kHeadDimV, kBlockM>(a, x, o, row_max, row_sum, row_base, t, sm.sQ + qoff, tmap_o,
                                                   sm.bar_q_empty + 8 * qb, cw, wq, lane);
        continue;
      }
    }
    mbar_arrive(sm.bar_q_empty + 8 * qb);  // every GEMM reading this Q buffer has completed
    fwd_epilogue<T, kHeadDimV>(a, x, o, row_max, row_sum, row_base, t);
  }
}

}  // namespace fm3::hopper::sm90
