// Host-side pieces shared by the forward and backward launchers: error
// reporting, the lookup of a head-dim pair's tile config, the argument checks
// both C ABI entries make on fm3_fwd_params, filling the kernels' common
// arguments (AttnArgs), and the TMA maps of q/k/v.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "attn_args.h"
#include "fm3/mask.h"
#include "fm3/params.h"
#include "tma_map.cuh"

namespace fm3::hopper {

// Writes the message into err (if any) and returns 1, the C ABI's error code.
inline int fail(char* err, size_t len, const char* fmt, ...) {
  if (err != nullptr && len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return 1;
}

// In a function with `char* err, size_t err_len` parameters returning int.
#define FM3_CUDA_CHECK(expr)                                                                   \
  do {                                                                                         \
    cudaError_t e_ = (expr);                                                                   \
    if (e_ != cudaSuccess) return fail(err, err_len, "%s: %s", #expr, cudaGetErrorString(e_)); \
  } while (0)

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The tile config of head dims (q/k head_dim, v head_dim_v) in one of the generated tables
// (fm3_generated_config.h: kSm90Configs, kSm90BwdConfigs), or nullptr. Each C ABI entry resolves it
// once and hands the row on.
template <class Config, size_t N>
const Config* find_config(const std::array<Config, N>& table, int head_dim, int head_dim_v) {
  for (const Config& c : table)
    if (c.head_dim == head_dim && c.head_dim_v == head_dim_v) return &c;
  return nullptr;
}

// Checks of the forward inputs every entry makes (has_config: the head-dim pair has a tile config).
inline int check_attn_params(const fm3_fwd_params* p, bool has_config, char* err, size_t err_len) {
  if (p->dtype != FM3_FLOAT16 && p->dtype != FM3_BFLOAT16)
    return fail(err, err_len, "dtype must be float16 or bfloat16, got enum %d", static_cast<int>(p->dtype));
  if (p->batch < 1 || p->seqlen_q < 1 || p->seqlen_k < 1 || p->num_heads < 1 || p->num_heads_k < 1)
    return fail(err, err_len, "batch, seqlen_q, seqlen_k, num_heads, num_heads_k must be >= 1");
  if (p->num_heads % p->num_heads_k != 0)
    return fail(err, err_len, "num_heads (%d) must be a multiple of num_heads_k (%d)", p->num_heads, p->num_heads_k);
  if (!has_config)
    return fail(err, err_len, "head_dim %d with head_dim_v %d has no sm90 config in yaml/kernel_configs.yaml",
                p->head_dim, p->head_dim_v);
  if (!p->q || !p->k || !p->v || !p->out || !p->softmax_lse)
    return fail(err, err_len, "q, k, v, out and softmax_lse must be non-NULL device pointers");
  if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) || !aligned16(p->out))
    return fail(err, err_len, "q, k, v and out must be 16-byte aligned");
  const int64_t strides[] = {p->q_batch_stride, p->q_row_stride, p->q_head_stride,
                             p->k_batch_stride, p->k_row_stride, p->k_head_stride,
                             p->v_batch_stride, p->v_row_stride, p->v_head_stride,
                             p->o_batch_stride, p->o_row_stride, p->o_head_stride};
  for (int64_t s : strides)
    if (s % 8 != 0)
      return fail(err, err_len, "every batch/row/head stride must be a multiple of 8 elements, got %lld",
                  static_cast<long long>(s));
  if (fm3_check_params_mask(p, err, err_len) != 0) return 1;
  if (!(p->softmax_scale > 0.f)) return fail(err, err_len, "softmax_scale must be > 0, got %g", p->softmax_scale);
  return 0;
}

// The kernels' common arguments from checked params.
inline void fill_attn_args(AttnArgs& a, const fm3_fwd_params* p) {
  const bool has_mask = p->startend_row_indices != nullptr || p->block_mask != nullptr;
  a.q = p->q;
  a.k = p->k;
  a.v = p->v;
  a.sri = p->startend_row_indices;
  a.block_mask = p->block_mask;
  a.q_bs = p->q_batch_stride; a.q_rs = p->q_row_stride; a.q_hs = p->q_head_stride;
  a.k_bs = p->k_batch_stride; a.k_rs = p->k_row_stride; a.k_hs = p->k_head_stride;
  a.v_bs = p->v_batch_stride; a.v_rs = p->v_row_stride; a.v_hs = p->v_head_stride;
  a.o_bs = p->o_batch_stride; a.o_rs = p->o_row_stride; a.o_hs = p->o_head_stride;
  a.head_dim = p->head_dim;
  a.head_dim_v = p->head_dim_v;
  a.batch = p->batch;
  a.seqlen_q = p->seqlen_q;
  a.seqlen_k = p->seqlen_k;
  a.num_heads = p->num_heads;
  a.num_heads_k = p->num_heads_k;
  a.mask_heads = has_mask && p->mask_heads >= 1 ? p->mask_heads : 1;
  a.mask_cols = p->mask_cols;
  a.bm_rows = static_cast<int>(block_mask_blocks(p->seqlen_q));
  a.bm_cols = static_cast<int>(block_mask_blocks(p->seqlen_k));
  a.scale_log2 = p->softmax_scale * 1.4426950408889634f;
  a.causal = p->causal != 0;
}

// TMA maps of q (box rows block_m) and k, v (box rows block_n) at their real head dims (a kernel's
// wider tiles read zeros past them); false if TMA cannot describe one.
template <typename T>
bool make_qkv_maps(const AttnArgs& a, int block_m, int block_n, CUtensorMap* mq, CUtensorMap* mk, CUtensorMap* mv) {
  return make_tma_map<T>(mq, a.q, a.head_dim, a.seqlen_q, a.num_heads, a.batch, a.q_rs, a.q_hs, a.q_bs, block_m) &&
         make_tma_map<T>(mk, a.k, a.head_dim, a.seqlen_k, a.num_heads_k, a.batch, a.k_rs, a.k_hs, a.k_bs, block_n) &&
         make_tma_map<T>(mv, a.v, a.head_dim_v, a.seqlen_k, a.num_heads_k, a.batch, a.v_rs, a.v_hs, a.v_bs, block_n);
}

}  // namespace fm3::hopper
