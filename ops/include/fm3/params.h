/* The single contract between the framework bindings (Paddle op, DLPack
 * binding) and the kernels: plain pointers, shapes and strides. Plain C so the
 * kernels can sit in a shared library with a C ABI and know no framework. */
#ifndef FM3_PARAMS_H_
#define FM3_PARAMS_H_
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FM3_FLOAT32 = 0, FM3_FLOAT16 = 1, FM3_BFLOAT16 = 2 } fm3_dtype;

/* Layout [batch, seqlen, num_heads, head_dim]; strides in elements; the
 * head_dim stride is 1. q and k have head_dim columns, v and out head_dim_v (equal but for the
 * pairs yaml/kernel_configs.yaml lists, e.g. MLA's 192 / 128). startend_row_indices is contiguous int32
 * [batch, mask_heads, seqlen_k, mask_cols]; block_mask (may be NULL) is
 * contiguous int32 [batch, mask_heads, ceil(seqlen_q/128), ceil(seqlen_k/128)].
 * softmax_lse is contiguous fp32 [batch, num_heads, seqlen_q], natural log. learnable_sink (may be
 * NULL) is contiguous fp32 [num_heads]: one sink logit per query head, a virtual key of score
 * learnable_sink[h] (the scaled scores' units) and value 0 in every row's softmax; out sums over the
 * real keys, softmax_lse includes the sink (a row that sees no key: out 0, lse learnable_sink[h]). */
typedef struct {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* softmax_lse;
  const int32_t* startend_row_indices;
  const int32_t* block_mask;
  const float* learnable_sink;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, head_dim_v;
  int mask_heads, mask_cols;
  float softmax_scale;
  int causal;
  fm3_dtype dtype;
  void* stream; /* cudaStream_t for GPU kernels; unused on CPU */
} fm3_fwd_params;

/* Backward: fwd holds q, k, v, out, softmax_lse (inputs here) and the mask;
 * dout, dq, dk, dv share out's/q's/k's/v's strides respectively. dq, dk, dv depend on the sink only
 * through softmax_lse (the forward's, which includes it). dlearnable_sink: with fwd.learnable_sink,
 * fp32 [num_heads], written (not added to) with -sum over batch and rows of
 * exp(learnable_sink[h] - lse_row) * sum(dout_row * out_row); NULL skips it. workspace: NULL, or device
 * memory of workspace_bytes >= fm3_cuda_bwd_workspace_bytes(p), 256-byte aligned, that the GPU
 * backward uses instead of its own pool (a framework's allocator; unused on CPU). */
typedef struct {
  fm3_fwd_params fwd;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* dlearnable_sink;
  int deterministic;
  void* workspace;
  size_t workspace_bytes;
} fm3_bwd_params;

/* The C/C++ rules of the arguments, one home each: the C ABI's entries (fm3_cpu_fwd / fm3_cpu_bwd;
 * fm3_cuda_fwd / fm3_cuda_bwd through check_attn_params, ops/hopper/attn_checks.h) check them
 * first, for callers that reach them without Python, and the bindings' filler (fm3/fill_params.h)
 * checks them after mapping tensors, so that the Paddle op and the DLPack module raise them as
 * ValueError / TypeError. Python's home of the same rules: paddle_fm3/_checks.py. Each returns 0,
 * or 1 with the message in err. */

/* The shape rule of the masks (Python's mirror, worded alike: _checks.check_mask_shape):
 * startend_row_indices is [batch, mask_heads, seqlen_k, C] with mask_heads in
 * {1, num_heads_k, num_heads} and C in {1, 2} when causal, {2, 4} otherwise; name:
 * the tensor the message names (block_mask when it comes alone: its mask heads). A negative
 * expected size (batch, seqlen_k, num_heads, num_heads_k) or a negative shape[3] is not checked:
 * the caller does not know it or there is no startend_row_indices. */
static inline int fm3_check_mask_shape_of(const char* name, const int64_t shape[4], int64_t batch, int64_t seqlen_k,
                                          int64_t num_heads, int64_t num_heads_k, int causal, char* err,
                                          size_t err_len) {
  const int64_t hm = shape[1], c = shape[3];
  if ((batch >= 0 && shape[0] != batch) || (seqlen_k >= 0 && shape[2] != seqlen_k)) {
    snprintf(err, err_len,
             "%s must have shape [batch=%lld, mask_heads, seqlen_k=%lld, C], got [%lld, %lld, %lld, %lld]", name,
             (long long)batch, (long long)seqlen_k, (long long)shape[0], (long long)shape[1], (long long)shape[2],
             (long long)shape[3]);
    return 1;
  }
  if (num_heads >= 0 && num_heads_k >= 0 && hm != 1 && hm != num_heads_k && hm != num_heads) {
    snprintf(err, err_len, "%s.shape[1] (mask heads) must be 1, num_heads_k (%lld) or num_heads (%lld), got %lld",
             name, (long long)num_heads_k, (long long)num_heads, (long long)hm);
    return 1;
  }
  if (c >= 0 && (causal ? !(c == 1 || c == 2) : !(c == 2 || c == 4))) {
    snprintf(err, err_len, "%s.shape[3]: with causal=%s the last dimension C must be one of %s, got %lld", name,
             causal ? "True" : "False", causal ? "(1, 2)" : "(2, 4)", (long long)c);
    return 1;
  }
  return 0;
}

/* fm3_check_mask_shape_of for startend_row_indices (every C/C++ entry that takes one alone: the CPU
 * classification, the CP workload, the CUDA block summary). */
static inline int fm3_check_mask_shape(const int64_t shape[4], int64_t batch, int64_t seqlen_k,
                                       int64_t num_heads, int64_t num_heads_k, int causal,
                                       char* err, size_t err_len) {
  return fm3_check_mask_shape_of("startend_row_indices", shape, batch, seqlen_k, num_heads, num_heads_k, causal, err,
                                 err_len);
}

/* fm3_check_mask_shape of the masks in params (mask_heads checked when startend_row_indices or
 * block_mask is given, C when startend_row_indices is). */
static inline int fm3_check_params_mask(const fm3_fwd_params* p, char* err, size_t err_len) {
  if (p->startend_row_indices == NULL && p->block_mask == NULL) return 0;
  const int64_t shape[4] = {p->batch, p->mask_heads, p->seqlen_k,
                            p->startend_row_indices != NULL ? p->mask_cols : -1};
  return fm3_check_mask_shape_of(p->startend_row_indices != NULL ? "startend_row_indices" : "block_mask", shape,
                                 p->batch, p->seqlen_k, p->num_heads, p->num_heads_k, p->causal, err, err_len);
}

/* The dtypes of q, k, v and out that the kernels take: float16 and bfloat16, and on the CPU (gpu = 0)
 * float32 too. dtype: an fm3_dtype, or -1 for any other; name: the tensor the message names. */
static inline int fm3_check_dtype(const char* name, int dtype, int gpu, char* err, size_t err_len) {
  if (dtype == FM3_FLOAT16 || dtype == FM3_BFLOAT16 || (dtype == FM3_FLOAT32 && !gpu)) return 0;
  snprintf(err, err_len, "%s must be %s", name, gpu ? "float16 or bfloat16" : "float32, float16 or bfloat16");
  return 1;
}

/* The rules of the forward's params that every kernel needs: sizes >= 1 (seqlen_k >= 0: the CPU
 * kernel gives a row that sees no key 0 and lse -inf; the GPU kernels need a key), num_heads a
 * multiple of num_heads_k, a softmax_scale whose scale into log2 units, softmax_scale * log2(e),
 * is a normal float32 (Python: _checks.check_softmax_scale), and the masks' shape. */
static inline int fm3_check_params(const fm3_fwd_params* p, char* err, size_t err_len) {
  const struct {
    const char* name;
    int value, min;
  } sizes[] = {{"batch", p->batch, 1},         {"seqlen_q", p->seqlen_q, 1},       {"seqlen_k", p->seqlen_k, 0},
               {"num_heads", p->num_heads, 1}, {"num_heads_k", p->num_heads_k, 1}, {"head_dim", p->head_dim, 1},
               {"head_dim_v", p->head_dim_v, 1}};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    if (sizes[i].value < sizes[i].min) {
      snprintf(err, err_len, "%s must be >= %d, got %d", sizes[i].name, sizes[i].min, sizes[i].value);
      return 1;
    }
  }
  if (p->num_heads % p->num_heads_k != 0) {
    snprintf(err, err_len, "num_heads (%d) must be a multiple of num_heads_k (%d)", p->num_heads, p->num_heads_k);
    return 1;
  }
  const double log2e = 1.4426950408889634;
  if (!(p->softmax_scale >= FLT_MIN && p->softmax_scale * log2e <= FLT_MAX)) {
    snprintf(err, err_len,
             "softmax_scale must be a finite float32 > 0 whose scores fit in float32 (softmax_scale * log2(e) <= "
             "%.3g; the usual value is head_dim ** -0.5), got %g", FLT_MAX / log2e, (double)p->softmax_scale);
    return 1;
  }
  return fm3_check_params_mask(p, err, err_len);
}

/* The backward's: the forward's, and a sink gradient only with the sink it is the gradient of. */
static inline int fm3_check_bwd_params(const fm3_bwd_params* p, char* err, size_t err_len) {
  if (fm3_check_params(&p->fwd, err, err_len) != 0) return 1;
  if (p->dlearnable_sink != NULL && p->fwd.learnable_sink == NULL) {
    snprintf(err, err_len, "dlearnable_sink needs learnable_sink (the sink the forward ran with)");
    return 1;
  }
  return 0;
}

/* Return 0 on success; otherwise non-zero with a message in err. */
int fm3_cpu_fwd(const fm3_fwd_params* p, char* err, size_t err_len);
int fm3_cpu_bwd(const fm3_bwd_params* p, char* err, size_t err_len);

/* Block classification of every (query tile, key block) pair: out is int32
 * [batch, mask_heads, ceil(seqlen_q/block_m), ceil(seqlen_k/block_n)] holding
 * fm3::TileClass values (0 fully masked, 1 partial, 2 unmasked). */
int fm3_cpu_classify(const int32_t* startend_row_indices,
                     const int32_t* block_mask, int batch, int mask_heads,
                     int seqlen_q, int seqlen_k, int mask_cols, int causal,
                     int block_m, int block_n, int32_t* out, char* err,
                     size_t err_len);

/* Context-parallel workload (square masks, seqlen_q == seqlen_k == seqlen;
 * tile | segment_size | seqlen): weights int64 [n] = not-fully-masked
 * (query tile, key block) pairs per query segment, summed over batch and mask
 * heads; needed int32 [n, n] = 1 where query segment q sees some key of key
 * segment t. n = seqlen / segment_size. */
int fm3_cpu_segment_workload(const int32_t* startend_row_indices, int batch,
                             int mask_heads, int seqlen, int mask_cols,
                             int causal, int tile, int segment_size,
                             int64_t* weights, int32_t* needed, char* err,
                             size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* FM3_PARAMS_H_ */
