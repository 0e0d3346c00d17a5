// Host side of the Hopper forward: validates fm3_fwd_params, computes the
// block summary, picks the tile config generated from yaml/kernel_configs.yaml
// (FM3_SM90_CONFIGS) and launches. The C ABI lives here (see fm3_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "block_summary.cuh"
#include "fm3_cuda.h"
#include "launch_common.h"
#include "workspace.h"
#include "fm3_generated_config.h"
#include "mma_sync/fwd_kernel.cuh"
#include "fwd/kernel.cuh"
#include "tma_map.cuh"

// FM3_NO_WGMMA=1 at compile time builds only the mma.sync kernel.
#ifndef FM3_NO_WGMMA
#define FM3_NO_WGMMA 0
#endif

namespace fm3::hopper {
namespace {

template <typename T, int D, int BM, int BN>
int launch(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  using Tr = FwdMmaSyncTraits<T, D, BM, BN>;
  auto kernel = flash_fwd_kernel<T, D, BM, BN>;
  FM3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const int n_mtiles = (args.seqlen_q + BM - 1) / BM;
  dim3 grid(n_mtiles, args.num_heads, args.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// The warp-specialized TMA + WGMMA kernel serves the configs the generator marks wgmma
// (ops/hopper/kernel_rules.py, serve_fwd); the mma.sync kernel, where it is built for a config
// (fallback), serves layouts TMA cannot describe and FM3_FWD_KERNEL=mma_sync.
bool force_mma_sync() {  // read per call (cheap), so a test can switch paths in-process
  const char* e = std::getenv("FM3_FWD_KERNEL");
  return e != nullptr && std::strcmp(e, "mma_sync") == 0;
}

// Grid of the persistent kernel: one CTA per SM (the kernel's shared memory allows one). The
// environment variable FM3_FWD_GRID overrides it: "tiles" gives one CTA per tile (each then does
// exactly one tile, as a non-persistent launch; kept to measure what persistence gives,
// BENCHMARKS.md), a number N caps the grid at N CTAs (tests use it to give each CTA many tiles).
int persistent_grid(int num_tiles, char* err, size_t err_len, int* grid) {
  int cap = 0;
  if (const char* e = std::getenv("FM3_FWD_GRID")) {
    if (std::strcmp(e, "tiles") == 0) {
      cap = num_tiles;
    } else {
      cap = std::atoi(e);
      if (cap < 1) return fail(err, err_len, "FM3_FWD_GRID must be 'tiles' or a positive integer, got '%s'", e);
    }
  } else {
    int dev = 0;
    FM3_CUDA_CHECK(cudaGetDevice(&dev));
    FM3_CUDA_CHECK(cudaDeviceGetAttribute(&cap, cudaDevAttrMultiProcessorCount, dev));
  }
  *grid = num_tiles < cap ? num_tiles : cap;
  return 0;
}

// 0: launched; 1: error (message in err); -1: not applicable (use the fallback).
template <typename T, int D, int DV, int BM, int BN, int ST, bool OV>
int launch_wgmma(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  if (force_mma_sync()) return -1;
  CUtensorMap mq, mk, mv;
  if (!make_qkv_maps<T>(args, BM, BN, &mq, &mk, &mv)) return -1;
  using Tr = sm90::FwdWgmmaTraits<T, D, DV, BM, BN, ST, OV>;
  auto kernel = sm90::flash_fwd_wgmma_kernel<T, D, DV, BM, BN, ST, OV>;
  FM3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  FwdArgs a = args;
  // O staged through shared memory and stored with TMA where the map describes out (a box of one
  // consumer warpgroup's 64 rows), else written directly.
  CUtensorMap mo{};
  a.o_staged = Tr::kStagedO && make_tma_map<T>(&mo, args.out, args.head_dim_v, args.seqlen_q, args.num_heads,
                                               args.batch, args.o_rs, args.o_hs, args.o_bs, 64);
  const int64_t tiles = static_cast<int64_t>((args.seqlen_q + BM - 1) / BM) * args.num_heads * args.batch;
  if (tiles > INT32_MAX / 2) return fail(err, err_len, "too many query tiles (%lld)", static_cast<long long>(tiles));
  a.num_tiles = static_cast<int>(tiles);
  int grid = 0;
  if (persistent_grid(a.num_tiles, err, err_len, &grid) != 0) return 1;
  FM3_CUDA_CHECK(cudaMemsetAsync(a.tile_counter, 0, sizeof(int), stream));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a, mq, mk, mv, mo);
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

int block_n_for(int head_dim, int head_dim_v) {
#define FM3_X(hd, hdv, bm, bn, st, wg, ov, wgmma, fallback) \
  if (head_dim == hd && head_dim_v == hdv) return bn;
  FM3_SM90_CONFIGS(FM3_X)
#undef FM3_X
  return 0;
}

// The mma.sync kernel, where the config has it (fallback); else the reason the WGMMA kernel did not run.
template <typename T, int D, int BM, int BN, bool kFallback>
int launch_fallback(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  if constexpr (kFallback) {
    return launch<T, D, (BM < fm3::kMmaSyncMaxBlockM ? BM : fm3::kMmaSyncMaxBlockM), BN>(args, stream, err, err_len);
  } else {
    return fail(err, err_len,
                "head_dim %d / head_dim_v %d runs on the WGMMA kernel only (the mma.sync kernel serves equal head "
                "dims that are multiples of 64), and it did not run: %s",
                args.head_dim, args.head_dim_v,
                force_mma_sync() ? "FM3_FWD_KERNEL=mma_sync asks for the mma.sync kernel"
                                 : "TMA cannot describe the layout of q, k or v");
  }
}

template <typename T>
int dispatch(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
#define FM3_X(hd, hdv, bm, bn, st, wg, ov, wgmma, fallback)                             \
  if (args.head_dim == hd && args.head_dim_v == hdv) {                                  \
    static_assert(bm == 16 * 4 * wg, "block_m must be 64 rows per consumer warpgroup"); \
    if constexpr (wgmma && !FM3_NO_WGMMA) {                                             \
      const int rc = launch_wgmma<T, hd, hdv, bm, bn, st, ov>(args, stream, err, err_len); \
      if (rc >= 0) return rc;                                                           \
    }                                                                                   \
    return launch_fallback<T, hd, bm, bn, fallback>(args, stream, err, err_len);        \
  }
  FM3_SM90_CONFIGS(FM3_X)
#undef FM3_X
  return fail(err, err_len, "head_dim %d with head_dim_v %d has no sm90 config in yaml/kernel_configs.yaml",
              args.head_dim, args.head_dim_v);
}

int check_params(const fm3_fwd_params* p, char* err, size_t err_len) {
  if (p == nullptr) return fail(err, err_len, "params is NULL");
  return check_attn_params(p, block_n_for(p->head_dim, p->head_dim_v) != 0, err, err_len);
}

}  // namespace
}  // namespace fm3::hopper

using namespace fm3::hopper;

extern "C" int fm3_cuda_block_n(int head_dim, int head_dim_v) { return block_n_for(head_dim, head_dim_v); }

extern "C" int fm3_cuda_block_summary(const int32_t* sri, int batch, int mask_heads, int seqlen_q,
                                      int seqlen_k, int mask_cols, int causal, int block_n,
                                      int32_t* out, void* stream, char* err, size_t err_len) {
  if (sri == nullptr || out == nullptr) return fail(err, err_len, "startend_row_indices and out must be non-NULL");
  if (block_n < 1 || batch < 1 || mask_heads < 1 || seqlen_k < 1 || seqlen_q < 1)
    return fail(err, err_len, "sizes must be >= 1");
  const int64_t shape[4] = {batch, mask_heads, seqlen_k, mask_cols};
  if (fm3_check_mask_shape(shape, -1, -1, -1, -1, causal, err, err_len) != 0) return 1;
  FM3_CUDA_CHECK(launch_block_summary(sri, batch * mask_heads, seqlen_q, seqlen_k, mask_cols, causal != 0,
                                      block_n, reinterpret_cast<fm3::BlockSummary*>(out),
                                      static_cast<cudaStream_t>(stream)));
  return 0;
}

extern "C" int fm3_cuda_fwd(const fm3_fwd_params* p, char* err, size_t err_len) {
  if (check_params(p, err, err_len) != 0) return 1;
  cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
  const int block_n = block_n_for(p->head_dim, p->head_dim_v);
  const int n_blocks = (p->seqlen_k + block_n - 1) / block_n;
  FwdArgs a{};
  fill_attn_args(a, p);
  a.out = p->out;
  a.lse = p->softmax_lse;
  a.learnable_sink = p->learnable_sink;
  // Workspace: [tile counter (256 bytes)][block summary (when there is a mask)].
  const size_t summary_bytes = p->startend_row_indices != nullptr
                                   ? sizeof(fm3::BlockSummary) * static_cast<size_t>(p->batch) * a.mask_heads * n_blocks
                                   : 0;
  char* ws = nullptr;
  FM3_CUDA_CHECK(workspace_alloc(reinterpret_cast<void**>(&ws), 256 + summary_bytes, stream));
  a.tile_counter = reinterpret_cast<int*>(ws);
  a.summary = nullptr;
  if (p->startend_row_indices != nullptr) {
    fm3::BlockSummary* summary = reinterpret_cast<fm3::BlockSummary*>(ws + 256);
    cudaError_t e = launch_block_summary(p->startend_row_indices, p->batch * a.mask_heads, p->seqlen_q,
                                         p->seqlen_k, p->mask_cols, a.causal, block_n, summary, stream);
    if (e != cudaSuccess) {
      workspace_free(ws, stream);
      return fail(err, err_len, "block summary launch: %s", cudaGetErrorString(e));
    }
    a.summary = summary;
  }
  int rc = p->dtype == FM3_BFLOAT16 ? dispatch<__nv_bfloat16>(a, stream, err, err_len)
                                    : dispatch<__half>(a, stream, err, err_len);
  cudaError_t e = workspace_free(ws, stream);
  if (rc == 0 && e != cudaSuccess) return fail(err, err_len, "workspace free: %s", cudaGetErrorString(e));
  return rc;
}

extern "C" int fm3_cuda_upload(const void* host, size_t bytes, void* stream, void** dev_out, char* err,
                               size_t err_len) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  FM3_CUDA_CHECK(workspace_alloc(dev_out, bytes, s));
  FM3_CUDA_CHECK(cudaMemcpyAsync(*dev_out, host, bytes, cudaMemcpyHostToDevice, s));
  FM3_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may go away after return
  return 0;
}

extern "C" int fm3_cuda_free(void* dev, void* stream, char* err, size_t err_len) {
  FM3_CUDA_CHECK(workspace_free(dev, static_cast<cudaStream_t>(stream)));
  return 0;
}
