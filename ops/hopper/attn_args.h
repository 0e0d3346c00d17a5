// Arguments of the Hopper attention kernels, passed by value as __grid_constant__ parameters:
// AttnArgs (every kernel), FwdArgs (the forward kernels), BwdArgs (the backward kernels).
#pragma once
#include <stdint.h>

#include "fm3/mask.h"  // BlockSummary

namespace fm3::hopper {

struct AttnArgs {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* sri;         // startend_row_indices [batch, mask_heads, seqlen_k, mask_cols] or nullptr
  const int32_t* block_mask;  // [batch, mask_heads, bm_rows, bm_cols] or nullptr
  int64_t q_bs, q_rs, q_hs, k_bs, k_rs, k_hs, v_bs, v_rs, v_hs, o_bs, o_rs, o_hs;  // strides in elements
  int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, mask_heads, mask_cols;
  int head_dim, head_dim_v;  // q / k and v / out columns (the kernels' tiles may be wider: kernel_rules.py)
  int bm_rows, bm_cols;
  float scale_log2;  // softmax_scale * log2(e)
  bool causal;
};

struct FwdArgs : AttnArgs {
  void* out;
  float* lse;
  const float* learnable_sink;  // [num_heads] or nullptr (fm3/params.h)
  const BlockSummary* summary;  // [batch, mask_heads, n_blocks] or nullptr (sri == nullptr)
  // Persistent WGMMA kernel only: query tiles (batch x heads x tiles) and the zeroed counter
  // from which CTAs take their next tile.
  int num_tiles;
  int* tile_counter;
  bool o_staged;  // WGMMA kernel: O goes out through shared memory and TMA (fwd/epilogue.cuh)
};

namespace bwd {

// Rows of lse2/delta per (batch, head) are padded to a multiple of this.
constexpr int kLsePad = 128;

struct BwdArgs : AttnArgs {
  const void* dout;        // strides o_* (as out)
  void* dq;                // strides q_*
  void* dk;                // strides k_*
  void* dv;                // strides v_*
  float* dq_accum;         // fp32 [batch, num_heads, rows, head_dim], cleared by bwd_preprocess_kernel: rows =
                           // lse_stride in 64-row tiles (dq_tile_offset) for the WGMMA kernel, seqlen_q row-major
                           // for the mma.sync one
  const float* lse2;       // [batch, num_heads, lse_stride], log2 units, +inf for empty rows and padding
  const float* delta;      // [batch, num_heads, lse_stride], 0 in the padding
  const BlockSummary* summary;  // [batch, mask_heads, n_kblocks] with block_n = kBlockN; nullptr if sri == nullptr
  // Deterministic mode of the WGMMA kernel: per (batch, head, query tile), the key block that last
  // added its dQ part, + 1 (0: none yet); each writer waits for its predecessor, so the fp32 sums
  // are formed in key-block order. nullptr: parts are added in any order.
  int32_t* dq_semaphore;   // [batch, num_heads, lse_stride / block_m], zeroed
  int32_t* dq_chain_start; // [batch, mask_heads, n_mtiles]: first key block adding to the tile (bwd/dq_writer.cuh)
  // The learnable sink and its gradient (fm3/params.h), nullptr without; the main kernels need
  // neither: the sink reaches dQ, dK, dV only through lse.
  const float* learnable_sink;
  float* dlearnable_sink;
  float* sink_partial;     // [num_heads, chunks] of the sink gradient's first pass (bwd/common.cuh)
  int lse_stride;          // seqlen_q rounded up to kLsePad: whole query tiles can be bulk-copied
  float scale;             // softmax_scale
};

}  // namespace bwd
}  // namespace fm3::hopper
