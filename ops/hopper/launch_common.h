// Host-side pieces shared by the forward and backward launchers: error
// reporting, the lookup of a head-dim pair's tile config, the argument checks
// both C ABI entries make on fm3_fwd_params, filling the kernels' common
// arguments (AttnArgs), the TMA maps of q/k/v, and the block summary each launcher makes.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "attn_args.h"
#include "attn_checks.h"  // fail, check_attn_params
#include "fm3_cuda.h"     // fm3_cuda_block_summary
#include "fm3/mask.h"
#include "fm3/params.h"
#include "tma_map.cuh"

namespace fm3::hopper {

// In a function with `char* err, size_t err_len` parameters returning int.
#define FM3_CUDA_CHECK(expr)                                                                   \
  do {                                                                                         \
    cudaError_t e_ = (expr);                                                                   \
    if (e_ != cudaSuccess) return fail(err, err_len, "%s: %s", #expr, cudaGetErrorString(e_)); \
  } while (0)

// The tile config of head dims (q/k head_dim, v head_dim_v) in one of the generated tables
// (fm3_generated_config.h: kSm90Configs, kSm90BwdConfigs), or nullptr. Each C ABI entry resolves it
// once and hands the row on.
template <class Config, size_t N>
const Config* find_config(const std::array<Config, N>& table, int head_dim, int head_dim_v) {
  for (const Config& c : table)
    if (c.head_dim == head_dim && c.head_dim_v == head_dim_v) return &c;
  return nullptr;
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

// The key blocks the workspace's block summary is sized for: the finer of a config's two kernels'
// (the WGMMA kernel's and the mma.sync fallback's), since the launch decides which one runs.
template <class Config>
int summary_block_n(const Config& c) {
  return c.block_n < c.fallback_block_n ? c.block_n : c.fallback_block_n;
}

// The block summary of the mask at the key blocks of the kernel about to launch (block_n), into the
// args' workspace summary (sized at summary_block_n): each launcher makes its own, so it is made once,
// for the kernel that runs. Through the C ABI, since the summary kernel is compiled in one translation
// unit (flash_fwd_launch.cu).
template <class Args>
int summarize(const Args& a, int block_n, cudaStream_t stream, char* err, size_t err_len) {
  if (a.summary == nullptr) return 0;
  return fm3_cuda_block_summary(a.sri, a.batch, a.mask_heads, a.seqlen_q, a.seqlen_k, a.mask_cols, a.causal, block_n,
                                reinterpret_cast<int32_t*>(const_cast<fm3::BlockSummary*>(a.summary)), stream, err,
                                err_len);
}

}  // namespace fm3::hopper
