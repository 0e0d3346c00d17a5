// Context-parallel workload summary in O(S) per (batch, mask head): for each
// query segment, the number of (query tile, key block) pairs that are not
// fully masked, and which key segments it needs at all. Each key block's fully
// masked rows (fm3::fully_masked_rows, the classification of mask.h) become at
// most four ranges of whole query tiles, so no (tile, block) pair is visited.
// Equals counting paddle_fm3.block_classify's output (tested), without its
// O((S / tile)^2) cost.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "fm3/mask.h"
#include "fm3/params.h"

namespace {

struct TileRange {
  int lo, hi;  // query tiles [lo, hi)
};

// Fully masked query tiles of one key block, as sorted disjoint ranges.
int masked_tile_ranges(const fm3::BlockSummary& s, int tile, TileRange* out) {
  const fm3::MaskedRows rows = fm3::fully_masked_rows(s);
  int n = 0;
  for (int k = 0; k < 4; ++k) {
    const int lo = (rows.lo[k] + tile - 1) / tile, hi = rows.hi[k] / tile;  // tiles wholly inside
    if (lo < hi) out[n++] = TileRange{lo, hi};  // empty intervals give no tiles
  }
  std::sort(out, out + n, [](const TileRange& a, const TileRange& b) { return a.lo < b.lo; });
  int m = 0;
  for (int k = 0; k < n; ++k) {
    if (m > 0 && out[k].lo <= out[m - 1].hi) out[m - 1].hi = std::max(out[m - 1].hi, out[k].hi);
    else out[m++] = out[k];
  }
  return m;
}

}  // namespace

extern "C" int fm3_cpu_segment_workload(const int32_t* sri, int batch, int mask_heads, int seqlen,
                                        int mask_cols, int causal, int tile, int segment_size,
                                        int64_t* weights, int32_t* needed, char* err, size_t err_len) {
  if (batch < 1 || mask_heads < 1 || seqlen < 1) {
    std::snprintf(err, err_len, "batch, mask_heads and seqlen must be >= 1, got %d, %d, %d", batch, mask_heads, seqlen);
    return 1;
  }
  const int64_t shape[4] = {batch, mask_heads, seqlen, mask_cols};
  if (fm3_check_mask_shape(shape, -1, -1, -1, -1, causal, err, err_len) != 0) return 1;
  if (tile < 1 || segment_size < tile || segment_size % tile != 0 || seqlen % segment_size != 0) {
    std::snprintf(err, err_len, "need tile | segment_size | seqlen, got tile %d, segment_size %d, seqlen %d",
                  tile, segment_size, seqlen);
    return 1;
  }
  const int n_seg = seqlen / segment_size, tps = segment_size / tile, n_blocks = seqlen / tile;
  std::memset(weights, 0, sizeof(int64_t) * n_seg);
  std::memset(needed, 0, sizeof(int32_t) * static_cast<size_t>(n_seg) * n_seg);
  TileRange ranges[4];
  for (int bh = 0; bh < batch * mask_heads; ++bh) {
    const int32_t* cols = sri + static_cast<int64_t>(bh) * seqlen * mask_cols;
    for (int kb = 0; kb < n_blocks; ++kb) {
      fm3::BlockSummary s = fm3::empty_summary();
      for (int j = kb * tile; j < (kb + 1) * tile; ++j)
        fm3::summary_add(s, fm3::load_column(cols + static_cast<int64_t>(j) * mask_cols, j, mask_cols,
                                             causal != 0, seqlen, fm3::causal_offset_of(seqlen, seqlen)));
      const int n_ranges = masked_tile_ranges(s, tile, ranges);
      const int key_seg = kb / tps;
      for (int q = 0; q < n_seg; ++q) {
        const int t0 = q * tps, t1 = t0 + tps;
        int covered = 0;
        for (int k = 0; k < n_ranges; ++k) covered += std::max(0, std::min(t1, ranges[k].hi) - std::max(t0, ranges[k].lo));
        if (covered < tps) {
          weights[q] += tps - covered;
          needed[static_cast<int64_t>(q) * n_seg + key_seg] = 1;
        }
      }
    }
  }
  return 0;
}
