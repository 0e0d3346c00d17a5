// CPU kernels: tiled FlashMask attention forward (online softmax) and
// backward, fp32 accumulation, skipping fully masked tiles and mask work on
// unmasked tiles via the block summary (fm3/mask.h).
//
// Algorithms: FlashAttention-2 (Dao, 2023, Alg. 1 and 2) with FlashMask's
// block skipping (arXiv:2410.01359, §4.2). The backward runs as two passes --
// column-parallel for dK/dV, row-parallel for dQ -- so no two threads ever
// write the same element: results are bitwise reproducible without atomics.
// A learnable sink (fm3_fwd_params.learnable_sink) joins each row's softmax
// once its keys are done (add_sink); the backward's dq, dk, dv see it only
// through the lse, its own gradient is sink_grad.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include <cstdlib>
#include <cstring>

#include "cpu_isa.h"
#include "cpu_threads.h"
#include "fm3/mask.h"
#include "fm3/params.h"
#include "fm3_generated_config.h"
#include "gemm.h"
#include "numeric.h"

namespace fm3::cpu::FM3_CPU_ISA {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int ceil_div(int a, int b) { return static_cast<int>((static_cast<int64_t>(a) + b - 1) / b); }  // no int overflow near 2^31

// Copy rows [r0, r0+n) of one head into dst[n][d] as fp32, times `scale`.
template <typename T>
void load_rows(const T* base, int64_t row_stride, int r0, int n, int d, float scale,
               float* dst) {
  for (int i = 0; i < n; ++i) {
    const T* src = base + (r0 + i) * row_stride;
    for (int t = 0; t < d; ++t) dst[i * d + t] = to_float(src[t]) * scale;
  }
}

// Same, transposed: dst[d][n].
template <typename T>
void load_rows_t(const T* base, int64_t row_stride, int r0, int n, int d, float* dst) {
  for (int i = 0; i < n; ++i) {
    const T* src = base + (r0 + i) * row_stride;
    for (int t = 0; t < d; ++t) dst[t * n + i] = to_float(src[t]);
  }
}

// c[m][n] = a[m][d] * bt[d][n]
inline void gemm_abt(const float* a, const float* bt, int m, int n, int d, float* c) {
  std::fill(c, c + static_cast<size_t>(m) * n, 0.f);
  gemm_acc(a, d, bt, n, c, n, m, n, d);
}

// Work item w of a parallel loop over (outer, mid, inner) in row-major order.
struct WorkIndex {
  int outer, mid, inner;
  WorkIndex(int64_t w, int n_mid, int n_inner)
      : outer(static_cast<int>(w / (static_cast<int64_t>(n_mid) * n_inner))),
        mid(static_cast<int>((w / n_inner) % n_mid)),
        inner(static_cast<int>(w % n_inner)) {}
};

// The mask of one (batch, mask head) and its block summary.
struct MaskView {
  const int32_t* sri;          // [seqlen_k, mask_cols]
  const int32_t* bm;           // [bm_rows, bm_cols] or nullptr
  const BlockSummary* blocks;  // [ceil(seqlen_k / block_n)]
  int mask_cols, bm_cols, seqlen_q, seqlen_k, causal_offset, block_n;
  bool causal;

  ColumnBounds column(int j) const {
    return load_column(sri + static_cast<int64_t>(j) * mask_cols, j, mask_cols, causal, seqlen_q, causal_offset);
  }
  TileClass classify(int m0, int m1, int nb) const {
    const int n0 = nb * block_n, n1 = std::min(n0 + block_n, seqlen_k);
    TileClass c = classify_tile(blocks[nb], m0, m1, n0, n1, causal, causal_offset);
    return apply_block_mask(c, bm, bm_cols, m0, m1, n0, n1);
  }
  // Set masked entries of s[m][n] (rows m0.., columns n0..) to `fill`.
  void apply(float* s, int m0, int m, int n0, int n, float fill) const {
    for (int j = 0; j < n; ++j) {
      const ColumnBounds c = column(n0 + j);
      for (int i = 0; i < m; ++i)
        if (!visible(c, m0 + i, n0 + j, causal, causal_offset, bm, bm_cols)) s[i * n + j] = fill;
    }
  }
};

// Block summaries and mask views for every (batch, mask head).
struct MaskPlan {
  std::vector<BlockSummary> blocks;
  std::vector<MaskView> views;
  int mask_heads = 1;

  MaskPlan(const int32_t* sri, const int32_t* bm, int batch, int mask_heads_, int seqlen_q,
           int seqlen_k, int mask_cols, bool causal, int block_n)
      : mask_heads(mask_heads_) {
    const int nb = ceil_div(seqlen_k, block_n);
    const int bm_rows = static_cast<int>(block_mask_blocks(seqlen_q));
    const int bm_cols = static_cast<int>(block_mask_blocks(seqlen_k));
    blocks.assign(static_cast<size_t>(batch) * mask_heads * nb, empty_summary());
    for (int bh = 0; bh < batch * mask_heads; ++bh) {
      const int32_t* col0 = sri + static_cast<int64_t>(bh) * seqlen_k * mask_cols;
      MaskView v{col0, bm ? bm + static_cast<int64_t>(bh) * bm_rows * bm_cols : nullptr,
                 blocks.data() + static_cast<size_t>(bh) * nb, mask_cols, bm_cols, seqlen_q,
                 seqlen_k, causal_offset_of(seqlen_q, seqlen_k), block_n, causal};
      for (int j = 0; j < seqlen_k; ++j) summary_add(blocks[bh * nb + j / block_n], v.column(j));
      views.push_back(v);
    }
  }
  const MaskView& view(int b, int hm) const { return views[b * mask_heads + hm]; }
};

// The learnable sink: a virtual key of score `sink` and value 0 in the row's softmax. Takes the row's
// lse over its real keys and the output's scale (1 / row sum); returns the lse with the sink and
// scales the output by the real keys' share, 1 / (1 + exp(sink - lse)). In fp64, shifted by the
// larger of the two: no overflow for any sink. A row with no visible key gets lse = sink, out 0.
inline void add_sink(float sink, float* lse, float* out_scale) {
  if (*lse == kNegInf) {
    *lse = sink;
    *out_scale = 0.f;
    return;
  }
  const double l = *lse, d = static_cast<double>(sink) - l;
  *lse = static_cast<float>(d > 0 ? sink + std::log1p(std::exp(-d)) : l + std::log1p(std::exp(d)));
  *out_scale = static_cast<float>(*out_scale / (1.0 + std::exp(d)));
}

// dsink[h] = -sum over batch and rows of exp(sink[h] - lse) * D_row: the sink's value is 0, so the
// row term D_row = rowsum(dout * out) is all of its softmax gradient. From the out and lse the
// backward is given (a caller's merged ones under context parallelism, so not rowsum(P * dP) over
// this call's keys). One thread per head, adding in a fixed order in fp64: bitwise repeatable. A
// row with lse -inf (no key, no sink in its lse) adds 0.
void sink_grad(const fm3_fwd_params& p, const double* d_row, float* dsink) {
#pragma omp parallel for schedule(static) num_threads(parallel_threads())
  for (int h = 0; h < p.num_heads; ++h) {
    const double s = p.learnable_sink[h];
    double acc = 0.0;
    for (int b = 0; b < p.batch; ++b) {
      const int64_t r0 = (static_cast<int64_t>(b) * p.num_heads + h) * p.seqlen_q;
      for (int i = 0; i < p.seqlen_q; ++i) {
        const float l = p.softmax_lse[r0 + i];
        if (l != kNegInf) acc += std::exp(s - l) * d_row[r0 + i];
      }
    }
    dsink[h] = static_cast<float>(-acc);
  }
}

struct Heads {
  int group, num_heads, mask_heads;
  int kv(int h) const { return h / group; }
  int mask(int h) const { return mask_head_of(h, kv(h), num_heads, mask_heads); }
};

template <typename T>
void forward(const fm3_fwd_params& p) {
  // D: columns of q and k (the scores); Dv: columns of v and out (MLA: 192 and 128).
  const int D = p.head_dim, Dv = p.head_dim_v, BM = kCpuBlockM, BN = kCpuBlockN;
  const int n_mtiles = ceil_div(p.seqlen_q, BM), n_nblocks = ceil_div(p.seqlen_k, BN);
  const Heads heads{p.num_heads / p.num_heads_k, p.num_heads, p.mask_heads};
  const MaskPlan plan(p.startend_row_indices, p.block_mask, p.batch, p.mask_heads, p.seqlen_q,
                      p.seqlen_k, p.mask_cols, p.causal != 0, BN);
  const float q_scale = p.softmax_scale * kLog2e;  // scores in log2 units: exp2 below
  const int64_t n_work = static_cast<int64_t>(p.batch) * p.num_heads * n_mtiles;

#pragma omp parallel num_threads(parallel_threads())
  {
    std::vector<float> q(BM * D), o(BM * Dv), s(BM * BN), kt(D * BN), v(BN * Dv), row_max(BM), row_sum(BM);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_work; ++w) {
      const WorkIndex wi(w, p.num_heads, n_mtiles);
      const int b = wi.outer, h = wi.mid, mt = wi.inner;
      const int m0 = mt * BM, m1 = std::min(m0 + BM, p.seqlen_q), M = m1 - m0;
      const MaskView& mask = plan.view(b, heads.mask(h));
      const T* qh = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
      const T* kh = static_cast<const T*>(p.k) + b * p.k_batch_stride + heads.kv(h) * p.k_head_stride;
      const T* vh = static_cast<const T*>(p.v) + b * p.v_batch_stride + heads.kv(h) * p.v_head_stride;
      load_rows(qh, p.q_row_stride, m0, M, D, q_scale, q.data());
      std::fill(o.begin(), o.end(), 0.f);
      std::fill(row_max.begin(), row_max.end(), kNegInf);
      std::fill(row_sum.begin(), row_sum.end(), 0.f);

      for (int nb = 0; nb < n_nblocks; ++nb) {
        const TileClass cls = mask.classify(m0, m1, nb);
        if (cls == kFullyMasked) continue;
        const int n0 = nb * BN, N = std::min(n0 + BN, p.seqlen_k) - n0;
        load_rows_t(kh, p.k_row_stride, n0, N, D, kt.data());
        gemm_abt(q.data(), kt.data(), M, N, D, s.data());
        if (cls == kPartial) mask.apply(s.data(), m0, M, n0, N, kNegInf);
        load_rows(vh, p.v_row_stride, n0, N, Dv, 1.f, v.data());
        for (int i = 0; i < M; ++i) {  // online softmax; s becomes P (unnormalized)
          float* si = s.data() + i * N;
          float mx = row_max[i];
          bool nan = false;
          for (int j = 0; j < N; ++j) {
            mx = std::max(mx, si[j]);
            nan |= si[j] != si[j];
          }
          if (nan) mx = std::numeric_limits<float>::quiet_NaN();  // a NaN score propagates
          if (mx == kNegInf) {  // nothing visible yet in this row
            std::fill(si, si + N, 0.f);
            continue;
          }
          const float alpha = std::exp2(row_max[i] - mx);
          exp2_shifted(si, N, mx);
          float sum = 0.f;
          for (int j = 0; j < N; ++j) sum += si[j];
          row_sum[i] = row_sum[i] * alpha + sum;
          row_max[i] = mx;
          if (alpha != 1.f)
            for (int t = 0; t < Dv; ++t) o[i * Dv + t] *= alpha;
        }
        gemm_acc(s.data(), N, v.data(), Dv, o.data(), Dv, M, Dv, N);  // O += P V
      }

      T* oh = static_cast<T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride;
      float* lse = p.softmax_lse + (static_cast<int64_t>(b) * p.num_heads + h) * p.seqlen_q;
      for (int i = 0; i < M; ++i) {
        const bool empty = row_sum[i] == 0.f;  // fully masked row: out 0, lse -inf (or the sink)
        float inv = empty ? 0.f : 1.f / row_sum[i];
        float lse_row = empty ? kNegInf : (row_max[i] + std::log2(row_sum[i])) * kLn2;
        if (p.learnable_sink != nullptr) add_sink(p.learnable_sink[h], &lse_row, &inv);
        T* dst = oh + (m0 + i) * p.o_row_stride;
        for (int t = 0; t < Dv; ++t) dst[t] = from_float<T>(o[i * Dv + t] * inv);
        lse[m0 + i] = lse_row;
      }
    }
  }
}

// Recomputes P and dS = P * (dP - delta) for one tile; shared by both passes.
// q[m][D] (unscaled), kt[D][n], vt[Dv][n], dout[m][Dv]; lse2 and delta per row.
struct TileGrad {
  std::vector<float> s, dp;
  explicit TileGrad(int bm, int bn) : s(bm * bn), dp(bm * bn) {}

  void compute(const float* q, const float* kt, const float* vt, const float* dout,
               const float* lse2, const float* delta, int M, int N, int D, int Dv, float scale_log2,
               const MaskView& mask, TileClass cls, int m0, int n0) {
    gemm_abt(q, kt, M, N, D, s.data());
    for (int i = 0; i < M; ++i) {
      float* si = s.data() + i * N;
      if (lse2[i] == kNegInf) {  // fully masked row: no gradient flows through it
        std::fill(si, si + N, 0.f);
        continue;
      }
      for (int j = 0; j < N; ++j) si[j] *= scale_log2;
      exp2_shifted(si, N, lse2[i]);
    }
    if (cls == kPartial) mask.apply(s.data(), m0, M, n0, N, 0.f);
    gemm_abt(dout, vt, M, N, Dv, dp.data());  // dP = dO V^T, over v's columns
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) dp[i * N + j] = s[i * N + j] * (dp[i * N + j] - delta[i]);
  }
  const float* p() const { return s.data(); }
  const float* ds() const { return dp.data(); }
};

template <typename T>
void backward(const fm3_bwd_params& bp) {
  const fm3_fwd_params& p = bp.fwd;
  const int D = p.head_dim, Dv = p.head_dim_v, BM = kCpuBlockM, BN = kCpuBlockN;  // as in forward
  const int n_mtiles = ceil_div(p.seqlen_q, BM), n_nblocks = ceil_div(p.seqlen_k, BN);
  const Heads heads{p.num_heads / p.num_heads_k, p.num_heads, p.mask_heads};
  const MaskPlan plan(p.startend_row_indices, p.block_mask, p.batch, p.mask_heads, p.seqlen_q,
                      p.seqlen_k, p.mask_cols, p.causal != 0, BN);
  const float scale = p.softmax_scale, scale_log2 = p.softmax_scale * kLog2e;
  const int64_t n_rows = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;

  // delta = rowsum(dout * out), lse in log2 units; both [batch, num_heads, seqlen_q]. The sink's
  // gradient takes delta unrounded (d_row, fp64).
  const bool want_dsink = bp.dlearnable_sink != nullptr;
  std::vector<float> delta(n_rows), lse2(n_rows);
  std::vector<double> d_row(want_dsink ? n_rows : 0);
#pragma omp parallel for schedule(static) num_threads(parallel_threads())
  for (int64_t r = 0; r < n_rows; ++r) {
    const int i = static_cast<int>(r % p.seqlen_q), h = static_cast<int>((r / p.seqlen_q) % p.num_heads);
    const int b = static_cast<int>(r / (static_cast<int64_t>(p.seqlen_q) * p.num_heads));
    const int64_t off = b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
    const T* o = static_cast<const T*>(p.out) + off;
    const T* g = static_cast<const T*>(bp.dout) + off;
    double acc = 0.0;
    for (int t = 0; t < Dv; ++t) acc += static_cast<double>(to_float(o[t])) * to_float(g[t]);
    delta[r] = static_cast<float>(acc);
    if (want_dsink) d_row[r] = acc;
    lse2[r] = p.softmax_lse[r] * kLog2e;
  }
  if (want_dsink) sink_grad(p, d_row.data(), bp.dlearnable_sink);
  auto row_index = [&](int b, int h, int i) { return (static_cast<int64_t>(b) * p.num_heads + h) * p.seqlen_q + i; };
  auto q_head = [&](const void* base, int b, int h) {
    return static_cast<const T*>(base) + b * p.q_batch_stride + h * p.q_head_stride;
  };
  auto o_head = [&](const void* base, int b, int h) {
    return static_cast<const T*>(base) + b * p.o_batch_stride + h * p.o_head_stride;
  };

  // Pass 1, column-parallel: dK, dV of one key block, summed over the query heads of its group.
  const int64_t n_cols_work = static_cast<int64_t>(p.batch) * p.num_heads_k * n_nblocks;
#pragma omp parallel num_threads(parallel_threads())
  {
    std::vector<float> kt(D * BN), vt(Dv * BN), q(BM * D), g(BM * Dv), dk(BN * D), dv(BN * Dv), pt(BN * BM);
    TileGrad tg(BM, BN);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_cols_work; ++w) {
      const WorkIndex wi(w, p.num_heads_k, n_nblocks);
      const int b = wi.outer, hk = wi.mid, nb = wi.inner;
      const int n0 = nb * BN, N = std::min(n0 + BN, p.seqlen_k) - n0;
      const T* kh = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride;
      const T* vh = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride;
      load_rows_t(kh, p.k_row_stride, n0, N, D, kt.data());
      load_rows_t(vh, p.v_row_stride, n0, N, Dv, vt.data());
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int h = hk * heads.group; h < (hk + 1) * heads.group; ++h) {
        const MaskView& mask = plan.view(b, heads.mask(h));
        for (int mt = 0; mt < n_mtiles; ++mt) {
          const int m0 = mt * BM, m1 = std::min(m0 + BM, p.seqlen_q), M = m1 - m0;
          const TileClass cls = mask.classify(m0, m1, nb);
          if (cls == kFullyMasked) continue;
          load_rows(q_head(p.q, b, h), p.q_row_stride, m0, M, D, 1.f, q.data());
          load_rows(o_head(bp.dout, b, h), p.o_row_stride, m0, M, Dv, 1.f, g.data());
          const int64_t r0 = row_index(b, h, m0);
          tg.compute(q.data(), kt.data(), vt.data(), g.data(), lse2.data() + r0, delta.data() + r0,
                     M, N, D, Dv, scale_log2, mask, cls, m0, n0);
          transpose(tg.p(), M, N, pt.data());
          gemm_acc(pt.data(), M, g.data(), Dv, dv.data(), Dv, N, Dv, M);  // dV += P^T dO
          transpose(tg.ds(), M, N, pt.data());
          gemm_acc(pt.data(), M, q.data(), D, dk.data(), D, N, D, M);  // dK += dS^T Q
        }
      }
      T* dkh = static_cast<T*>(bp.dk) + b * p.k_batch_stride + hk * p.k_head_stride;
      T* dvh = static_cast<T*>(bp.dv) + b * p.v_batch_stride + hk * p.v_head_stride;
      for (int j = 0; j < N; ++j) {
        for (int t = 0; t < D; ++t) dkh[(n0 + j) * p.k_row_stride + t] = from_float<T>(dk[j * D + t] * scale);
        for (int t = 0; t < Dv; ++t) dvh[(n0 + j) * p.v_row_stride + t] = from_float<T>(dv[j * Dv + t]);
      }
    }
  }

  // Pass 2, row-parallel: dQ of one query tile.
  const int64_t n_rows_work = static_cast<int64_t>(p.batch) * p.num_heads * n_mtiles;
#pragma omp parallel num_threads(parallel_threads())
  {
    std::vector<float> kt(D * BN), vt(Dv * BN), kr(BN * D), q(BM * D), g(BM * Dv), dq(BM * D);
    TileGrad tg(BM, BN);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_rows_work; ++w) {
      const WorkIndex wi(w, p.num_heads, n_mtiles);
      const int b = wi.outer, h = wi.mid, mt = wi.inner;
      const int m0 = mt * BM, m1 = std::min(m0 + BM, p.seqlen_q), M = m1 - m0;
      const MaskView& mask = plan.view(b, heads.mask(h));
      const T* kh = static_cast<const T*>(p.k) + b * p.k_batch_stride + heads.kv(h) * p.k_head_stride;
      const T* vh = static_cast<const T*>(p.v) + b * p.v_batch_stride + heads.kv(h) * p.v_head_stride;
      load_rows(q_head(p.q, b, h), p.q_row_stride, m0, M, D, 1.f, q.data());
      load_rows(o_head(bp.dout, b, h), p.o_row_stride, m0, M, Dv, 1.f, g.data());
      std::fill(dq.begin(), dq.end(), 0.f);
      const int64_t r0 = row_index(b, h, m0);
      for (int nb = 0; nb < n_nblocks; ++nb) {
        const TileClass cls = mask.classify(m0, m1, nb);
        if (cls == kFullyMasked) continue;
        const int n0 = nb * BN, N = std::min(n0 + BN, p.seqlen_k) - n0;
        load_rows_t(kh, p.k_row_stride, n0, N, D, kt.data());
        load_rows_t(vh, p.v_row_stride, n0, N, Dv, vt.data());
        load_rows(kh, p.k_row_stride, n0, N, D, 1.f, kr.data());
        tg.compute(q.data(), kt.data(), vt.data(), g.data(), lse2.data() + r0, delta.data() + r0,
                   M, N, D, Dv, scale_log2, mask, cls, m0, n0);
        gemm_acc(tg.ds(), N, kr.data(), D, dq.data(), D, M, D, N);  // dQ += dS K
      }
      T* dqh = static_cast<T*>(bp.dq) + b * p.q_batch_stride + h * p.q_head_stride;
      for (int i = 0; i < M; ++i)
        for (int t = 0; t < D; ++t) dqh[(m0 + i) * p.q_row_stride + t] = from_float<T>(dq[i * D + t] * scale);
    }
  }
}

// The rules of params.h (every kernel's), then the CPU kernel's own: its dtypes and head dims up to
// kCpuMaxHeadDim (any value head dim in range: which (head_dim, head_dim_v) pairs the API accepts is
// its rule, paddle_fm3/_checks.py; the kernel computes any pair).
int check(const fm3_fwd_params& p, char* err, size_t n) {
  if (fm3_check_params(&p, err, n) != 0 || fm3_check_dtype("q", p.dtype, 0, err, n) != 0) return 1;
  for (const auto& [name, d] : {std::pair{"head_dim", p.head_dim}, std::pair{"head_dim_v", p.head_dim_v}}) {
    if (d > kCpuMaxHeadDim) {
      std::snprintf(err, n, "%s must be in [1, %d], got %d", name, kCpuMaxHeadDim, d);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int fwd(const fm3_fwd_params* p, char* err, size_t err_len) {
  if (check(*p, err, err_len)) return 1;
  switch (p->dtype) {
    case FM3_FLOAT32: forward<float>(*p); return 0;
    case FM3_FLOAT16: forward<half_bits>(*p); return 0;
    case FM3_BFLOAT16: forward<bf16_bits>(*p); return 0;
  }
  std::snprintf(err, err_len, "unsupported dtype %d", static_cast<int>(p->dtype));
  return 1;
}

int bwd(const fm3_bwd_params* p, char* err, size_t err_len) {
  if (check(p->fwd, err, err_len) || fm3_check_bwd_params(p, err, err_len)) return 1;
  switch (p->fwd.dtype) {
    case FM3_FLOAT32: backward<float>(*p); return 0;
    case FM3_FLOAT16: backward<half_bits>(*p); return 0;
    case FM3_BFLOAT16: backward<bf16_bits>(*p); return 0;
  }
  std::snprintf(err, err_len, "unsupported dtype %d", static_cast<int>(p->fwd.dtype));
  return 1;
}

}  // namespace fm3::cpu::FM3_CPU_ISA

#ifndef FM3_CPU_VARIANT  // the C ABI, once: in the build's own copy
namespace fm3::cpu {
namespace {

enum class Isa { kBase, kAvx2, kAvx512, kInvalid };

// The widest copy this CPU runs; FM3_CPU_KERNEL=base|avx2|avx512 (read per call, so tests can
// switch in-process) asks for a narrower one.
Isa pick_isa(char* err, size_t err_len) {
  Isa widest = Isa::kBase;
#if FM3_CPU_DISPATCH
  static const Isa detected = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kBase;
  }();
  widest = detected;
#endif
  const char* e = std::getenv("FM3_CPU_KERNEL");
  if (e == nullptr || *e == '\0') return widest;
  Isa want = Isa::kInvalid;
  if (std::strcmp(e, "base") == 0) want = Isa::kBase;
  if (std::strcmp(e, "avx2") == 0) want = Isa::kAvx2;
  if (std::strcmp(e, "avx512") == 0) want = Isa::kAvx512;
  if (want == Isa::kInvalid) {
    std::snprintf(err, err_len, "FM3_CPU_KERNEL must be base, avx2 or avx512, got '%s'", e);
    return Isa::kInvalid;
  }
  return want < widest ? want : widest;
}

}  // namespace
}  // namespace fm3::cpu

extern "C" int fm3_cpu_fwd(const fm3_fwd_params* p, char* err, size_t err_len) {
  switch (fm3::cpu::pick_isa(err, err_len)) {
    case fm3::cpu::Isa::kInvalid: return 1;
#if FM3_CPU_DISPATCH
    case fm3::cpu::Isa::kAvx512: return fm3::cpu::avx512::fwd(p, err, err_len);
    case fm3::cpu::Isa::kAvx2: return fm3::cpu::avx2::fwd(p, err, err_len);
#endif
    default: return fm3::cpu::base::fwd(p, err, err_len);
  }
}

extern "C" int fm3_cpu_bwd(const fm3_bwd_params* p, char* err, size_t err_len) {
  switch (fm3::cpu::pick_isa(err, err_len)) {
    case fm3::cpu::Isa::kInvalid: return 1;
#if FM3_CPU_DISPATCH
    case fm3::cpu::Isa::kAvx512: return fm3::cpu::avx512::bwd(p, err, err_len);
    case fm3::cpu::Isa::kAvx2: return fm3::cpu::avx2::bwd(p, err, err_len);
#endif
    default: return fm3::cpu::base::bwd(p, err, err_len);
  }
}

using namespace fm3::cpu::base;  // ceil_div for the classification

extern "C" int fm3_cpu_classify(const int32_t* sri, const int32_t* bm, int batch, int mask_heads,
                                int seqlen_q, int seqlen_k, int mask_cols, int causal, int block_m,
                                int block_n, int32_t* out, char* err, size_t err_len) {
  if (block_m < 1 || block_n < 1) {
    std::snprintf(err, err_len, "block_m and block_n must be positive, got %d and %d", block_m, block_n);
    return 1;
  }
  const int64_t shape[4] = {batch, mask_heads, seqlen_k, mask_cols};
  if (fm3_check_mask_shape(shape, -1, -1, -1, -1, causal, err, err_len) != 0) return 1;
  const MaskPlan plan(sri, bm, batch, mask_heads, seqlen_q, seqlen_k, mask_cols, causal != 0, block_n);
  const int n_mtiles = ceil_div(seqlen_q, block_m), n_nblocks = ceil_div(seqlen_k, block_n);
  for (int b = 0; b < batch; ++b)
    for (int hm = 0; hm < mask_heads; ++hm)
      for (int mt = 0; mt < n_mtiles; ++mt)
        for (int nb = 0; nb < n_nblocks; ++nb) {
          const int m0 = mt * block_m, m1 = std::min(m0 + block_m, seqlen_q);
          *out++ = plan.view(b, hm).classify(m0, m1, nb);
        }
  return 0;
}
#endif  // FM3_CPU_VARIANT
