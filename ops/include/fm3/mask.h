// FlashMask column-boundary mask: the one place where the mask is read and
// where (query tile, key block) pairs are classified. Every path uses it: the
// CPU kernels, the Hopper kernels (it compiles for the device), the block
// classification op that the workload estimate and the CP plan call.
//
// Semantics (FlashMask, arXiv:2410.01359 §4.1; Paddle's flashmask_attention):
// startend_row_indices[b, hm, j, :] holds, for key column j, query-row bounds.
//   causal, C=1:     LTS                masked rows: [LTS, S_q)
//   causal, C=2:     LTS, LTE           masked rows: [LTS, LTE)
//   non-causal, C=2: LTS, UTE           masked rows: [LTS, S_q) and [0, UTE)
//   non-causal, C=4: LTS, LTE, UTS, UTE masked rows: [LTS, LTE) and [UTS, UTE)
// Causal additionally hides key j from row i when j > i + (S_k - S_q)
// (bottom-right alignment). block_mask (optional, 128x128 blocks, 1 = keep)
// is AND-ed on top.
// Every int32 value is accepted with Paddle's meaning: Paddle's kernels compare
// row indices against the raw values, so a value above S_q acts as S_q ("to the
// end"), a negative one as 0, and an interval with start > end is empty.
// load_column clamps to [0, S_q] once, so everything downstream (summaries,
// bit masks, classification) sees in-range values.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define FM3_HD __host__ __device__ __forceinline__
#else
#define FM3_HD inline
#endif

namespace fm3 {

// Side of the square blocks addressed by block_mask (Paddle's convention).
constexpr int kBlockMaskSize = 128;

// The one C/C++ home of three shape rules (paddle_fm3/_checks.py is the Python one).
// block_mask's blocks along seqlen rows or columns: its shape is
// [batch, mask_heads, block_mask_blocks(seqlen_q), block_mask_blocks(seqlen_k)].
FM3_HD int64_t block_mask_blocks(int64_t seqlen) { return (seqlen + kBlockMaskSize - 1) / kBlockMaskSize; }

// Bottom-right aligned causality: key j is visible to row i iff j <= i + causal_offset_of(S_q, S_k).
FM3_HD int causal_offset_of(int seqlen_q, int seqlen_k) { return seqlen_k - seqlen_q; }

// The mask head that query head h (kv head hk) reads; mask_heads is 1, num_heads_k or num_heads.
FM3_HD int mask_head_of(int h, int hk, int num_heads, int mask_heads) {
  return mask_heads == 1 ? 0 : (mask_heads == num_heads ? h : hk);
}

enum TileClass : int32_t {
  kFullyMasked = 0,  // skip: no load, no math
  kPartial = 1,      // apply the per-element mask
  kUnmasked = 2,     // no mask work at all
};

// The bounds of one key column, normalized to the four-interval form
// [lts, lte) U [uts, ute); an absent interval is empty.
struct ColumnBounds {
  int32_t lts, lte, uts, ute;
};

// Bounds of key column j read from col = &startend_row_indices[b, hm, j, 0].
// With causal, the causal triangle of the column -- rows [0, j - (S_k - S_q))
// -- becomes the upper interval, so the block summary and the classification
// see the whole mask (e.g. a causal document tile is exactly fully masked).
// A row bound clamped to [0, seqlen_q] (see the note on values above).
FM3_HD int32_t clamp_row(int32_t v, int seqlen_q) { return v < 0 ? 0 : (v > seqlen_q ? seqlen_q : v); }

FM3_HD ColumnBounds load_column(const int32_t* col, int j, int mask_cols, bool causal,
                                int seqlen_q, int causal_offset) {
  ColumnBounds c;
  c.lts = clamp_row(col[0], seqlen_q);
  if (causal) {
    const int first_row = j - causal_offset;  // first row that may see key j
    c.lte = mask_cols == 2 ? clamp_row(col[1], seqlen_q) : seqlen_q;
    c.uts = 0;
    c.ute = first_row < 0 ? 0 : (first_row > seqlen_q ? seqlen_q : first_row);
  } else if (mask_cols == 2) {
    c.lte = seqlen_q;
    c.uts = 0;
    c.ute = clamp_row(col[1], seqlen_q);
  } else {
    c.lte = clamp_row(col[1], seqlen_q);
    c.uts = clamp_row(col[2], seqlen_q);
    c.ute = clamp_row(col[3], seqlen_q);
  }
  return c;
}

FM3_HD bool row_masked(const ColumnBounds& c, int row) {
#ifdef __CUDA_ARCH__
  // Bitwise on the GPU: its kernels test this per element, and && / || made a branch of each.
  return ((row >= c.lts) & (row < c.lte)) | ((row >= c.uts) & (row < c.ute));
#else
  return (row >= c.lts && row < c.lte) || (row >= c.uts && row < c.ute);
#endif
}

// Bounds of key column j for any mask input: read from sri = &startend_row_indices[b, hm, 0, 0]
// when given, else the empty mask with, if causal, the causal triangle; a column at or past
// seqlen_k masks every row. With this, row_masked() alone decides visibility (block_mask aside).
FM3_HD ColumnBounds column_bounds(const int32_t* sri, int j, int seqlen_q, int seqlen_k, int mask_cols,
                                  bool causal, int causal_offset) {
  if (j >= seqlen_k) return ColumnBounds{0, seqlen_q, 0, 0};
  if (sri != nullptr) return load_column(sri + static_cast<int64_t>(j) * mask_cols, j, mask_cols, causal, seqlen_q,
                                         causal_offset);
  const int first_row = j - causal_offset;
  const int ute = !causal || first_row < 0 ? 0 : (first_row > seqlen_q ? seqlen_q : first_row);
  return ColumnBounds{seqlen_q, seqlen_q, 0, ute};
}

// Bits [0, n) set, n clamped to [0, 32].
FM3_HD uint32_t rows_below_bits(int n) {
  return n <= 0 ? 0u : (n >= 32 ? 0xffffffffu : (1u << n) - 1u);
}

// Visibility of rows [r0, r0 + 32) of a column as bits: bit i set iff row r0 + i is not masked
// (the partial-tile mask of the Hopper forward, built once per column by the producer).
FM3_HD uint32_t visible_bits(const ColumnBounds& c, int r0) {
  const uint32_t lower = rows_below_bits(c.lte - r0) & ~rows_below_bits(c.lts - r0);
  const uint32_t upper = rows_below_bits(c.ute - r0) & ~rows_below_bits(c.uts - r0);
  return ~(lower | upper);
}

// Min/max of each boundary vector over one block of key columns.
struct BlockSummary {
  int32_t lts_min, lts_max, lte_min, lte_max;
  int32_t uts_min, uts_max, ute_min, ute_max;
};

FM3_HD BlockSummary empty_summary() {
  const int32_t hi = 0x7fffffff, lo = -0x7fffffff - 1;
  return BlockSummary{hi, lo, hi, lo, hi, lo, hi, lo};
}

FM3_HD void summary_add(BlockSummary& s, const ColumnBounds& c) {
  s.lts_min = c.lts < s.lts_min ? c.lts : s.lts_min;
  s.lts_max = c.lts > s.lts_max ? c.lts : s.lts_max;
  s.lte_min = c.lte < s.lte_min ? c.lte : s.lte_min;
  s.lte_max = c.lte > s.lte_max ? c.lte : s.lte_max;
  s.uts_min = c.uts < s.uts_min ? c.uts : s.uts_min;
  s.uts_max = c.uts > s.uts_max ? c.uts : s.uts_max;
  s.ute_min = c.ute < s.ute_min ? c.ute : s.ute_min;
  s.ute_max = c.ute > s.ute_max ? c.ute : s.ute_max;
}

// Query rows that every column of a key block masks: four intervals [lo, hi)
// read off the block summary, each possibly empty (lo >= hi). A tile is fully
// masked iff its rows lie inside one of them. (The causal triangle is the
// upper interval, see load_column.) Fixed size, constant indices: stays in
// registers on the GPU.
struct MaskedRows {
  int32_t lo[4], hi[4];
};

FM3_HD MaskedRows fully_masked_rows(const BlockSummary& s) {
  MaskedRows r;
  r.lo[0] = s.lts_max;  // inside every column's lower interval
  r.hi[0] = s.lte_min;
  r.lo[1] = s.uts_max;  // inside every column's upper interval
  r.hi[1] = s.ute_min;
  // Where the two intervals overlap in every column, their union covers the span.
  r.lo[2] = s.uts_max;
  r.hi[2] = s.lts_max <= s.ute_min ? s.lte_min : s.uts_max;
  r.lo[3] = s.lts_max;
  r.hi[3] = s.uts_max <= s.lte_min ? s.ute_min : s.lts_max;
  return r;
}

FM3_HD bool rows_inside(const MaskedRows& r, int m0, int m1) {
  bool inside = false;
  for (int k = 0; k < 4; ++k) inside = inside || (m0 >= r.lo[k] && m1 <= r.hi[k]);
  return inside;
}

// Classify query rows [m0, m1) against key columns [n0, n1) (both non-empty,
// already clipped to the sequence) from the block summary of those columns.
// Conservative: kPartial is always a correct answer; kFullyMasked and
// kUnmasked are exact claims. With startend_row_indices the causal triangle is
// already part of the summary (load_column); the two causal tests below make
// the answer right also for a summary built without it (no mask given).
FM3_HD TileClass classify_tile(const BlockSummary& s, int m0, int m1, int n0,
                               int n1, bool causal, int causal_offset) {
  if (causal && n0 > m1 - 1 + causal_offset) return kFullyMasked;
  if (rows_inside(fully_masked_rows(s), m0, m1)) return kFullyMasked;
  const bool partial = (m0 < s.lte_max && m1 > s.lts_min) ||
                       (m0 < s.ute_max && m1 > s.uts_min) ||
                       (causal && n1 - 1 > m0 + causal_offset);
  return partial ? kPartial : kUnmasked;
}

// block_mask refines a class: a tile is fully masked if every 128x128 block it
// touches is 0, partial if some are, unchanged if all are 1.
// bm points at block_mask[b, hm, 0, 0], row length bm_cols.
FM3_HD TileClass apply_block_mask(TileClass cls, const int32_t* bm, int bm_cols,
                                  int m0, int m1, int n0, int n1) {
  if (bm == nullptr || cls == kFullyMasked) return cls;
  bool any_keep = false, any_drop = false;
  for (int bi = m0 / kBlockMaskSize; bi <= (m1 - 1) / kBlockMaskSize; ++bi)
    for (int bj = n0 / kBlockMaskSize; bj <= (n1 - 1) / kBlockMaskSize; ++bj) {
      if (bm[bi * bm_cols + bj]) any_keep = true; else any_drop = true;
    }
  if (!any_keep) return kFullyMasked;
  return any_drop ? kPartial : cls;
}

// block_mask's entry for element (row, col): false where the 128 x 128 block holding it is dropped.
FM3_HD bool block_kept(const int32_t* bm, int bm_cols, int row, int col) {
  return bm[(row / kBlockMaskSize) * bm_cols + col / kBlockMaskSize] != 0;
}

// Per-element visibility, used only on partial tiles.
FM3_HD bool visible(const ColumnBounds& c, int row, int col, bool causal,
                    int causal_offset, const int32_t* bm, int bm_cols) {
  if (causal && col > row + causal_offset) return false;
  if (row_masked(c, row)) return false;
  if (bm != nullptr && !block_kept(bm, bm_cols, row, col)) return false;
  return true;
}

}  // namespace fm3
