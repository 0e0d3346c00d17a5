// Host side of the Hopper forward: validates fm3_fwd_params, computes the
// block summary, picks the tile config generated from yaml/kernel_configs.yaml
// (FM3_SM90_CONFIGS) and launches. The C ABI lives here (see fm3_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "block_summary.cuh"
#include "fm3_cuda.h"
#include "fm3_generated_config.h"
#include "flash_fwd_kernel.cuh"
#include "flash_fwd_wgmma.cuh"
#include "tma_map.cuh"

// FM3_NO_WGMMA=1 at compile time builds only the step-1 (mma.sync) kernel.
#ifndef FM3_NO_WGMMA
#define FM3_NO_WGMMA 0
#endif

namespace fm3::hopper {
namespace {

int fail(char* err, size_t len, const char* fmt, ...) {
  if (err != nullptr && len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return 1;
}

#define FM3_CUDA_CHECK(expr)                                                               \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) return fail(err, err_len, "%s: %s", #expr, cudaGetErrorString(e_)); \
  } while (0)

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, int D, int BM, int BN>
int launch(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  using Tr = FwdTraits<T, D, BM, BN>;
  auto kernel = flash_fwd_kernel<T, D, BM, BN>;
  FM3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const int n_mtiles = (args.seqlen_q + BM - 1) / BM;
  dim3 grid(n_mtiles, args.num_heads, args.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// ---- step 2: warp-specialized TMA + WGMMA kernel ---------------------------
// Used for every sm90 config it covers (head_dim 64/128, block_m 64 per consumer
// warpgroup, block_n 64/128); the step-1 kernel stays the fallback for the rest
// (head_dim 256), for layouts TMA cannot describe, and when the environment
// variable FM3_FWD_KERNEL=mma_sync asks for it.
constexpr bool wgmma_covers(int hd, int bm, int bn, int wg) {
  return !FM3_NO_WGMMA && (hd == 64 || hd == 128) && (bn == 64 || bn == 128) && bm == 64 * wg &&
         (wg == 1 || wg == 2);
}

bool force_mma_sync() {  // read per call (cheap), so a test can switch paths in-process
  const char* e = std::getenv("FM3_FWD_KERNEL");
  return e != nullptr && std::strcmp(e, "mma_sync") == 0;
}

// 0: launched; 1: error (message in err); -1: not applicable (use the fallback).
template <typename T, int D, int BM, int BN, int ST>
int launch_wgmma(const FwdArgs& args, int head_dim, cudaStream_t stream, char* err, size_t err_len) {
  if (force_mma_sync()) return -1;
  CUtensorMap mq, mk, mv;
  if (!make_tma_map<T>(&mq, args.q, head_dim, args.seqlen_q, args.num_heads, args.batch, args.q_rs, args.q_hs,
                       args.q_bs, BM) ||
      !make_tma_map<T>(&mk, args.k, head_dim, args.seqlen_k, args.num_heads_k, args.batch, args.k_rs, args.k_hs,
                       args.k_bs, BN) ||
      !make_tma_map<T>(&mv, args.v, head_dim, args.seqlen_k, args.num_heads_k, args.batch, args.v_rs, args.v_hs,
                       args.v_bs, BN))
    return -1;
  using Tr = sm90::WgTraits<T, D, BM, BN, ST>;
  auto kernel = sm90::flash_fwd_wgmma_kernel<T, D, BM, BN, ST>;
  FM3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const int n_mtiles = (args.seqlen_q + BM - 1) / BM;
  dim3 grid(n_mtiles, args.num_heads, args.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(args, mq, mk, mv);
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

int block_n_for(int head_dim) {
#define FM3_X(hd, bm, bn, st, wg) \
  if (head_dim == hd) return bn;
  FM3_SM90_CONFIGS(FM3_X)
#undef FM3_X
  return 0;
}

template <typename T>
int dispatch(const FwdArgs& args, int head_dim, cudaStream_t stream, char* err, size_t err_len) {
#define FM3_X(hd, bm, bn, st, wg)                                                     \
  if (head_dim == hd) {                                                               \
    static_assert(bm == 16 * 4 * wg, "block_m must be 64 rows per consumer warpgroup"); \
    if constexpr (wgmma_covers(hd, bm, bn, wg)) {                                     \
      const int rc = launch_wgmma<T, hd, bm, bn, st>(args, head_dim, stream, err, err_len); \
      if (rc >= 0) return rc;                                                         \
    }                                                                                 \
    return launch<T, hd, bm, bn>(args, stream, err, err_len);                         \
  }
  FM3_SM90_CONFIGS(FM3_X)
#undef FM3_X
  return fail(err, err_len, "head_dim %d has no sm90 config in yaml/kernel_configs.yaml", head_dim);
}

int check_params(const fm3_fwd_params* p, char* err, size_t err_len) {
  if (p == nullptr) return fail(err, err_len, "params is NULL");
  if (p->dtype != FM3_FLOAT16 && p->dtype != FM3_BFLOAT16)
    return fail(err, err_len, "dtype must be float16 or bfloat16, got enum %d", static_cast<int>(p->dtype));
  if (p->batch < 1 || p->seqlen_q < 1 || p->seqlen_k < 1 || p->num_heads < 1 || p->num_heads_k < 1)
    return fail(err, err_len, "batch, seqlen_q, seqlen_k, num_heads, num_heads_k must be >= 1");
  if (p->num_heads % p->num_heads_k != 0)
    return fail(err, err_len, "num_heads (%d) must be a multiple of num_heads_k (%d)", p->num_heads, p->num_heads_k);
  if (block_n_for(p->head_dim) == 0)
    return fail(err, err_len, "head_dim %d has no sm90 config in yaml/kernel_configs.yaml", p->head_dim);
  if (!p->q || !p->k || !p->v || !p->out || !p->softmax_lse)
    return fail(err, err_len, "q, k, v, out and softmax_lse must be non-NULL device pointers");
  if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) || !aligned16(p->out))
    return fail(err, err_len, "q, k, v and out must be 16-byte aligned");
  const int64_t strides[] = {p->q_batch_stride, p->q_row_stride, p->q_head_stride,
                             p->k_batch_stride, p->k_row_stride, p->k_head_stride,
                             p->v_batch_stride, p->v_row_stride, p->v_head_stride,
                             p->o_batch_stride, p->o_row_stride, p->o_head_stride};
  for (int64_t s : strides)
    if (s % 8 != 0) return fail(err, err_len, "every batch/row/head stride must be a multiple of 8 elements, got %lld", static_cast<long long>(s));
  if (p->startend_row_indices != nullptr) {
    const int hm = p->mask_heads;
    if (hm != 1 && hm != p->num_heads_k && hm != p->num_heads)
      return fail(err, err_len, "mask_heads must be 1, num_heads_k or num_heads, got %d", hm);
    const int c = p->mask_cols;
    const bool ok = p->causal ? (c == 1 || c == 2) : (c == 2 || c == 4);
    if (!ok) return fail(err, err_len, "mask_cols %d is not valid with causal=%d (causal: 1 or 2; non-causal: 2 or 4)", c, p->causal);
  } else if (p->block_mask != nullptr && p->mask_heads < 1) {
    return fail(err, err_len, "mask_heads must be >= 1 when block_mask is given");
  }
  if (!(p->softmax_scale > 0.f)) return fail(err, err_len, "softmax_scale must be > 0, got %g", p->softmax_scale);
  return 0;
}

}  // namespace
}  // namespace fm3::hopper

using namespace fm3::hopper;

extern "C" int fm3_cuda_block_n(int head_dim) { return block_n_for(head_dim); }

extern "C" int fm3_cuda_block_summary(const int32_t* sri, int batch, int mask_heads, int seqlen_q,
                                      int seqlen_k, int mask_cols, int causal, int block_n,
                                      int32_t* out, void* stream, char* err, size_t err_len) {
  if (sri == nullptr || out == nullptr) return fail(err, err_len, "startend_row_indices and out must be non-NULL");
  if (block_n < 1 || batch < 1 || mask_heads < 1 || seqlen_k < 1 || seqlen_q < 1)
    return fail(err, err_len, "sizes must be >= 1");
  FM3_CUDA_CHECK(launch_block_summary(sri, batch * mask_heads, seqlen_q, seqlen_k, mask_cols, causal != 0,
                                      block_n, reinterpret_cast<fm3::BlockSummary*>(out),
                                      static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int fm3_cuda_fwd(const fm3_fwd_params* p, char* err, size_t err_len) {
  if (check_params(p, err, err_len) != 0) return 1;
  cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
  const int block_n = block_n_for(p->head_dim);
  const int n_blocks = (p->seqlen_k + block_n - 1) / block_n;
  const int mask_heads = p->mask_heads < 1 ? 1 : p->mask_heads;

  FwdArgs a{};
  a.q = p->q;
  a.k = p->k;
  a.v = p->v;
  a.out = p->out;
  a.lse = p->softmax_lse;
  a.sri = p->startend_row_indices;
  a.block_mask = p->block_mask;
  a.q_bs = p->q_batch_stride; a.q_rs = p->q_row_stride; a.q_hs = p->q_head_stride;
  a.k_bs = p->k_batch_stride; a.k_rs = p->k_row_stride; a.k_hs = p->k_head_stride;
  a.v_bs = p->v_batch_stride; a.v_rs = p->v_row_stride; a.v_hs = p->v_head_stride;
  a.o_bs = p->o_batch_stride; a.o_rs = p->o_row_stride; a.o_hs = p->o_head_stride;
  a.batch = p->batch;
  a.seqlen_q = p->seqlen_q;
  a.seqlen_k = p->seqlen_k;
  a.num_heads = p->num_heads;
  a.num_heads_k = p->num_heads_k;
  a.mask_heads = mask_heads;
  a.mask_cols = p->mask_cols;
  a.bm_rows = (p->seqlen_q + fm3::kBlockMaskSize - 1) / fm3::kBlockMaskSize;
  a.bm_cols = (p->seqlen_k + fm3::kBlockMaskSize - 1) / fm3::kBlockMaskSize;
  a.scale_log2 = p->softmax_scale * 1.4426950408889634f;
  a.causal = p->causal != 0;

  fm3::BlockSummary* summary = nullptr;
  if (p->startend_row_indices != nullptr) {
    const size_t bytes = sizeof(fm3::BlockSummary) * static_cast<size_t>(p->batch) * mask_heads * n_blocks;
    FM3_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&summary), bytes, stream));
    cudaError_t e = launch_block_summary(p->startend_row_indices, p->batch * mask_heads, p->seqlen_q,
                                         p->seqlen_k, p->mask_cols, a.causal, block_n, summary, stream);
    if (e != cudaSuccess) {
      cudaFreeAsync(summary, stream);
      return fail(err, err_len, "block summary launch: %s", cudaGetErrorString(e));
    }
  }
  a.summary = summary;
  int rc = p->dtype == FM3_BFLOAT16 ? dispatch<__nv_bfloat16>(a, p->head_dim, stream, err, err_len)
                                    : dispatch<__half>(a, p->head_dim, stream, err, err_len);
  if (summary != nullptr) {
    cudaError_t e = cudaFreeAsync(summary, stream);
    if (rc == 0 && e != cudaSuccess) return fail(err, err_len, "cudaFreeAsync: %s", cudaGetErrorString(e));
  }
  return rc;
}

extern "C" int fm3_cuda_upload(const void* host, size_t bytes, void* stream, void** dev_out, char* err,
                               size_t err_len) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  FM3_CUDA_CHECK(cudaMallocAsync(dev_out, bytes, s));
  FM3_CUDA_CHECK(cudaMemcpyAsync(*dev_out, host, bytes, cudaMemcpyHostToDevice, s));
  FM3_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may go away after return
  return 0;
}

extern "C" int fm3_cuda_free(void* dev, void* stream, char* err, size_t err_len) {
  FM3_CUDA_CHECK(cudaFreeAsync(dev, static_cast<cudaStream_t>(stream)));
  return 0;
}
