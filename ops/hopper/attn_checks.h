// The Hopper C ABI's argument checks (check_attn_params, check_attn_grads) and its error reporting
// (fail). Free of CUDA headers, so that the DLPack module can run the same checks before it stages
// host masks on the GPU, and raise them as ValueError rather than as a failed launch.
#pragma once
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "fm3/params.h"

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

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The forward's params as the Hopper kernels need them (has_config: the head-dim pair has a tile
// config): every kernel's rules (fm3_check_params, params.h), then the GPU's own: float16 / bfloat16,
// at least one key, a kernel for the head dims, and what TMA and the 16-byte vector accesses need.
inline int check_attn_params(const fm3_fwd_params* p, bool has_config, char* err, size_t err_len) {
  if (fm3_check_params(p, err, err_len) != 0 || fm3_check_dtype("q", p->dtype, 1, err, err_len) != 0) return 1;
  if (p->seqlen_k < 1) return fail(err, err_len, "seqlen_k must be >= 1 on the GPU, got %d", p->seqlen_k);
  if (!has_config)
    return fail(err, err_len, "head_dim %d (q, k) with head_dim_v %d (v) has no sm90 kernel (yaml/kernel_configs.yaml)",
                p->head_dim, p->head_dim_v);
  if (!p->q || !p->k || !p->v || !p->out || !p->softmax_lse)
    return fail(err, err_len, "q, k, v, out and softmax_lse must be non-NULL device pointers");
  const struct {
    const char* name;
    const void* data;
    int64_t batch, row, head;  // strides
  } ts[] = {{"q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride},
            {"k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride},
            {"v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride},
            {"out", p->out, p->o_batch_stride, p->o_row_stride, p->o_head_stride}};
  for (const auto& t : ts) {
    if (!aligned16(t.data)) return fail(err, err_len, "%s must be 16-byte aligned", t.name);
    if (t.batch % 8 != 0 || t.row % 8 != 0 || t.head % 8 != 0)
      return fail(err, err_len,
                  "%s's batch, row and head strides must be multiples of 8 elements, got %lld, %lld, %lld", t.name,
                  static_cast<long long>(t.batch), static_cast<long long>(t.row), static_cast<long long>(t.head));
  }
  return 0;
}

// The backward's own pointers (their strides are the forward's: check_attn_params): non-NULL and
// 16-byte aligned; and the backward's rules of every kernel (fm3_check_bwd_params).
inline int check_attn_grads(const fm3_bwd_params* bp, char* err, size_t err_len) {
  if (fm3_check_bwd_params(bp, err, err_len) != 0) return 1;
  const struct {
    const char* name;
    const void* data;
  } grads[] = {{"dout", bp->dout}, {"dq", bp->dq}, {"dk", bp->dk}, {"dv", bp->dv}};
  for (const auto& g : grads) {
    if (g.data == nullptr) return fail(err, err_len, "%s must be a non-NULL device pointer", g.name);
    if (!aligned16(g.data)) return fail(err, err_len, "%s must be 16-byte aligned", g.name);
  }
  return 0;
}

}  // namespace fm3::hopper
