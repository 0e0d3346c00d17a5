/* C ABI of the Hopper (sm90a) kernels in libfm3_cuda.so. Framework-free: the
 * Paddle GPU glue and the DLPack binding both fill fm3_fwd_params and call
 * these. Every function returns 0 on success, else non-zero with a message in
 * err (never throws, never exits). All work is enqueued on p->stream. */
#ifndef FM3_CUDA_H_
#define FM3_CUDA_H_
#include <stddef.h>
#include <stdint.h>

#include "fm3/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward attention. q/k/v/out/softmax_lse/startend_row_indices/block_mask are
 * device pointers (startend_row_indices may be NULL: no mask beyond causal).
 * (head_dim, head_dim_v) must be one of the sm90 configs of yaml/kernel_configs.yaml. */
int fm3_cuda_fwd(const fm3_fwd_params* p, char* err, size_t err_len);

/* Block summary alone (also run inside fm3_cuda_fwd): for every
 * (batch, mask head, key block of block_n columns), the min/max of the four
 * normalized boundary vectors, as 8 int32 in fm3::BlockSummary order
 * (lts_min, lts_max, lte_min, lte_max, uts_min, uts_max, ute_min, ute_max).
 * out: device int32 [batch, mask_heads, ceil(seqlen_k/block_n), 8]. */
int fm3_cuda_block_summary(const int32_t* startend_row_indices, int batch, int mask_heads,
                           int seqlen_q, int seqlen_k, int mask_cols, int causal, int block_n,
                           int32_t* out, void* stream, char* err, size_t err_len);

/* The key-block width the forward kernel uses for head dims (q/k head_dim, v head_dim_v; 0 if none). */
int fm3_cuda_block_n(int head_dim, int head_dim_v);

/* Backward attention (flash_bwd_launch.cu): p->fwd holds q, k, v, out,
 * softmax_lse (natural log, as fm3_cuda_fwd writes it) and the mask; dout, dq,
 * dk, dv are device pointers sharing out's, q's, k's, v's strides. dq, dk, dv
 * are fully written (0 where no visible pair contributes). deterministic != 0
 * makes dQ bitwise repeatable: each query tile's fp32 sum is formed in key-block
 * order (the mma.sync fallback: a row-parallel pass without atomics). With
 * p->dlearnable_sink, the sink's gradient is written too (fixed order, bitwise repeatable). The
 * workspace (fp32 dQ accumulator, row statistics, block summary, the sink gradient's partial sums) is p->workspace
 * when given, else taken from the library's workspace pool on p->fwd.stream. */
int fm3_cuda_bwd(const fm3_bwd_params* p, char* err, size_t err_len);

/* The key-block width (columns per CTA) the backward kernel uses (0 if none). */
int fm3_cuda_bwd_block_n(int head_dim, int head_dim_v);

/* Device workspace bytes fm3_cuda_bwd needs for p (reads p->fwd's sizes, whether it has
 * startend_row_indices, its mask_heads, p->deterministic and whether p->dlearnable_sink is set). */
size_t fm3_cuda_bwd_workspace_bytes(const fm3_bwd_params* p);

/* Only in a build with -DFM3_BWD_TRACE (tools/bwd_trace.py): the WGMMA backward writes per-CTA
 * timestamps of its phases to the device buffer buf (bwd/trace.cuh); null stops it. */
int fm3_cuda_bwd_trace(uint64_t* buf);

/* The launchers' own workspace (the backward's when p->workspace is NULL, the forward's block
 * summary, staged host masks) comes from a memory pool per device that keeps the memory it took
 * between calls, as a framework's caching allocator does. This hands what it keeps back to the
 * driver (all devices; memory still in use by enqueued work stays). */
int fm3_cuda_release_workspace(char* err, size_t err_len);

/* Small helpers so bindings without their own CUDA runtime can stage host
 * masks: stream-ordered device allocation, host->device copy, free. */
int fm3_cuda_upload(const void* host, size_t bytes, void* stream, void** dev_out, char* err,
                    size_t err_len);
int fm3_cuda_free(void* dev, void* stream, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* FM3_CUDA_H_ */
