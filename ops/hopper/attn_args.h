// Arguments every Hopper attention kernel takes (passed by value as
// __grid_constant__ parameters; FwdArgs and BwdArgs extend them).
#pragma once
#include <stdint.h>

namespace fm3::hopper {

struct AttnArgs {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* sri;         // startend_row_indices [batch, mask_heads, seqlen_k, mask_cols] or nullptr
  const int32_t* block_mask;  // [batch, mask_heads, bm_rows, bm_cols] or nullptr
  int64_t q_bs, q_rs, q_hs, k_bs, k_rs, k_hs, v_bs, v_rs, v_hs, o_bs, o_rs, o_hs;  // strides in elements
  int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, mask_heads, mask_cols;
  int bm_rows, bm_cols;
  float scale_log2;  // softmax_scale * log2(e)
  bool causal;
};

}  // namespace fm3::hopper
