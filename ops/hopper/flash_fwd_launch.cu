// Host side of the Hopper forward: validates fm3_fwd_params, computes the
// block summary, picks the tile config generated from yaml/kernel_configs.yaml
// (kSm90Configs, fm3_generated_config.h) and launches. The C ABI lives here (see fm3_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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
int launch_mma_sync(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  if (summarize(args, BN, stream, err, err_len) != 0) return 1;
  using Tr = mma_sync::FwdMmaSyncTraits<T, D, BM, BN>;
  auto kernel = mma_sync::flash_fwd_mma_sync_kernel<T, D, BM, BN>;
  FM3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const int n_mtiles = (args.seqlen_q + BM - 1) / BM;
  dim3 grid(n_mtiles, args.num_heads, args.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// The warp-specialized TMA + WGMMA kernel serves the configs the generator marks wgmma
// (paddle_fm3_build/kernel_rules.py, serve_fwd); the mma.sync kernel, where it is built for a config
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
  if (summarize(args, BN, stream, err, err_len) != 0) return 1;
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

// The mma.sync kernel, where the config has it (fallback); else the reason the WGMMA kernel did not run.
template <typename T, int D, int BM, int BN, bool kFallback>
int launch_fallback(const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  if constexpr (kFallback) {
    return launch_mma_sync<T, D, (BM < kMmaSyncMaxBlockM ? BM : kMmaSyncMaxBlockM), BN>(args, stream, err, err_len);
  } else {
    return fail(err, err_len,
                "head_dim %d / head_dim_v %d runs on the WGMMA kernel only (the mma.sync kernel serves equal head "
                "dims that are multiples of 64), and it did not run: %s",
                args.head_dim, args.head_dim_v,
                force_mma_sync() ? "FM3_FWD_KERNEL=mma_sync asks for the mma.sync kernel"
                                 : "TMA cannot describe the layout of q, k or v");
  }
}

// The kernels of config row I of kSm90Configs, instantiated with its values, when cfg is that row;
// else the next row's.
template <typename T, size_t I = 0>
int dispatch(const Sm90Config* cfg, const FwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  if constexpr (I == kSm90Configs.size()) {
    return fail(err, err_len, "the forward's config is not a row of kSm90Configs");
  } else {
    if (cfg != &kSm90Configs[I]) return dispatch<T, I + 1>(cfg, args, stream, err, err_len);
    constexpr Sm90Config c = kSm90Configs[I];
    static_assert(c.block_m == 16 * 4 * c.consumer_warpgroups, "block_m must be 64 rows per consumer warpgroup");
    if constexpr (c.wgmma && !FM3_NO_WGMMA) {
      const int rc = launch_wgmma<T, c.head_dim, c.head_dim_v, c.block_m, c.block_n, c.stages, c.intra_wg_overlap>(
          args, stream, err, err_len);
      if (rc >= 0) return rc;
    }
    return launch_fallback<T, c.head_dim, c.block_m, c.fallback_block_n, c.fallback>(args, stream, err, err_len);
  }
}

}  // namespace
}  // namespace fm3::hopper

using namespace fm3::hopper;

extern "C" int fm3_cuda_block_n(int head_dim, int head_dim_v) {
  const fm3::Sm90Config* cfg = find_config(fm3::kSm90Configs, head_dim, head_dim_v);
  return cfg != nullptr ? cfg->block_n : 0;
}

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
  if (p == nullptr) return fail(err, err_len, "params is NULL");
  // The config is resolved once per call and handed on.
  const fm3::Sm90Config* cfg = find_config(fm3::kSm90Configs, p->head_dim, p->head_dim_v);
  if (check_attn_params(p, cfg != nullptr, err, err_len) != 0) return 1;
  cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
  const int block_n = summary_block_n(*cfg);
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
  a.summary = p->startend_row_indices != nullptr ? reinterpret_cast<fm3::BlockSummary*>(ws + 256) : nullptr;
  int rc = p->dtype == FM3_BFLOAT16 ? dispatch<__nv_bfloat16>(cfg, a, stream, err, err_len)
                                    : dispatch<__half>(cfg, a, stream, err, err_len);
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
