// Host side of the Hopper backward: validates fm3_bwd_params, lays out the workspace (the
// caller's, or the library pool's, workspace.cu: lse2, delta, block summary at the key blocks of the
// kernel that runs, via fm3_cuda_block_summary, fp32 dQ accumulator), runs preprocess (which also
// clears the accumulator) -> block summary -> main kernel -> dQ conversion (the mma.sync fallback: the
// row-parallel dQ pass when deterministic), and the learnable sink's gradient after the preprocess,
// with the tile config generated from yaml/kernel_configs.yaml
// (kSm90BwdConfigs, fm3_generated_config.h). C ABI: fm3_cuda_bwd (fm3_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "mma_sync/bwd_kernel.cuh"
#include "bwd/kernel.cuh"
#include "fm3_cuda.h"
#include "launch_common.h"
#include "workspace.h"
#include "fm3_generated_config.h"

namespace fm3::hopper {
namespace {

using namespace bwd;  // BwdArgs (attn_args.h) and the kernels around the main pass (bwd/common.cuh)

// dq = softmax_scale * dq_accum (rows of TD floats, the first D of them dQ's columns) from the
// tile-blocked accumulator of the WGMMA kernel.
template <typename T, int TD, int D>
int launch_dq_tiled(const BwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  const int64_t n = static_cast<int64_t>(args.batch) * args.num_heads * (args.lse_stride / 2) * (D / 8);
  bwd_convert_dq_tiled_kernel<T, TD, D><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      args.dq_accum, static_cast<T*>(args.dq), args.q_bs, args.q_rs, args.q_hs, args.num_heads, args.seqlen_q,
      args.lse_stride, args.scale, n);
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// The mma.sync column-parallel kernel, then dq = softmax_scale * dq_accum from its row-major
// accumulator, or the row-parallel deterministic dQ pass.
template <typename T, int D, int BM, int BN>
int launch_mma_sync(const BwdArgs& args, bool deterministic, cudaStream_t stream, char* err, size_t err_len) {
  if (summarize(args, BN, stream, err, err_len) != 0) return 1;
  using Tr = mma_sync::BwdMmaSyncTraits<T, D, BM, BN>;
  const int n_kblocks = (args.seqlen_k + BN - 1) / BN;
  auto col = deterministic ? mma_sync::flash_bwd_mma_sync_kernel<T, D, BM, BN, false>
                           : mma_sync::flash_bwd_mma_sync_kernel<T, D, BM, BN, true>;
  FM3_CUDA_CHECK(
      cudaFuncSetAttribute(col, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tr::kColSmem)));
  col<<<dim3(n_kblocks, args.num_heads_k, args.batch), Tr::kThreads, Tr::kColSmem, stream>>>(args);
  FM3_CUDA_CHECK(cudaGetLastError());
  if (deterministic) {
    const int n_mtiles = (args.seqlen_q + BM - 1) / BM;
    auto row = mma_sync::flash_bwd_dq_mma_sync_kernel<T, D, BM, BN>;
    FM3_CUDA_CHECK(
        cudaFuncSetAttribute(row, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tr::kRowSmem)));
    row<<<dim3(n_mtiles, args.num_heads, args.batch), Tr::kThreads, Tr::kRowSmem, stream>>>(args);
  } else {
    const int64_t n = static_cast<int64_t>(args.batch) * args.num_heads * args.seqlen_q * (D / 8);
    bwd_convert_dq_kernel<T, D><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        args.dq_accum, static_cast<T*>(args.dq), args.q_bs, args.q_rs, args.q_hs, args.num_heads, args.seqlen_q,
        args.seqlen_q, args.scale, n);
  }
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// Chunks of the sink gradient's first pass per head (bwd/common.cuh).
int64_t sink_chunks(int batch, int seqlen_q) {
  return (static_cast<int64_t>(batch) * seqlen_q + kSinkChunkRows - 1) / kSinkChunkRows;
}

int launch_sink_grad(const BwdArgs& args, const float* lse, cudaStream_t stream, char* err, size_t err_len) {
  const int64_t chunks = sink_chunks(args.batch, args.seqlen_q);
  bwd_sink_partial_kernel<<<dim3(static_cast<unsigned>(chunks), args.num_heads), 256, 0, stream>>>(
      lse, args.delta, args.learnable_sink, args.sink_partial, args.num_heads, args.seqlen_q, args.lse_stride,
      static_cast<int64_t>(args.batch) * args.seqlen_q);
  FM3_CUDA_CHECK(cudaGetLastError());
  bwd_sink_grad_kernel<<<args.num_heads, 256, 0, stream>>>(args.sink_partial, args.dlearnable_sink,
                                                           static_cast<int>(chunks));
  FM3_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// The warp-specialized TMA + WGMMA kernel, for the configs the generator marks wgmma
// (paddle_fm3_build/kernel_rules.py, serve_bwd) unless FM3_BWD_KERNEL=mma_sync asks for the mma.sync kernel
// (read per call, so a test can switch paths in-process). Returns -1 when not applicable (a
// layout TMA cannot describe).

bool env_is(const char* name, const char* value) {  // read per call, so a test can switch in-process
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, value) == 0;
}

// TD: the tile head dim (kernel_rules.py; q, k, v, dO are read at their real head dims, zeros past
// them), D: q's head dim (dQ's columns), DV: v's. The kernel's products run at the larger head dim
// (bwd/traits.cuh), on the split-D path (tile head dims 192 and 256) at the tile head dim, those of
// V and dO there at DV rounded up to 64 (MLA's 192 / 128: 128).
template <typename T, int TD, int D, int DV, int BM, int BN, int ST>
int launch_wgmma(const BwdArgs& args, cudaStream_t stream, char* err, size_t err_len) {
  if (env_is("FM3_BWD_KERNEL", "mma_sync")) return -1;
  CUtensorMap mq, mk, mv, mdo;
  if (!make_qkv_maps<T>(args, BM, BN, &mq, &mk, &mv) ||
      !make_tma_map<T>(&mdo, args.dout, args.head_dim_v, args.seqlen_q, args.num_heads, args.batch, args.o_rs,
                       args.o_hs, args.o_bs, BM))
    return -1;
  if (summarize(args, BN, stream, err, err_len) != 0) return 1;
  constexpr int KD = TD >= 192 ? TD : (D > DV ? D : DV);
  constexpr int KDV = TD >= 192 ? (DV + 63) / 64 * 64 : KD;
  using Tr = sm90::BwdWgmmaTraits<T, KD, KDV, BM, BN, ST>;
  // Deterministic mode too writes dQ from this kernel, the parts of a tile added in key-block order
  // (args.dq_semaphore, set by fm3_cuda_bwd).
  auto kernel = sm90::flash_bwd_wgmma_kernel<T, KD, KDV, BM, BN, ST>;
  FM3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Tr::kSmemBytes)));
  using Sched = sm90::BwdTileScheduler<BM, BN>;
  if (args.dq_semaphore != nullptr) {  // deterministic: each tile's first contributing key block (bwd/dq_writer.cuh)
    const int n_mtiles = (args.seqlen_q + BM - 1) / BM;
    const int64_t n = static_cast<int64_t>(args.batch) * args.mask_heads * n_mtiles;
    sm90::dq_chain_start_kernel<BM, BN>
        <<<static_cast<unsigned>((n + 127) / 128), 128, 0, stream>>>(args, n_mtiles, Sched::key_blocks(args), n);
  }
  kernel<<<Sched::grid(args), Tr::kThreads, Tr::kSmemBytes, stream>>>(args, mq, mk, mv, mdo);
  FM3_CUDA_CHECK(cudaGetLastError());
  return launch_dq_tiled<T, TD, D>(args, stream, err, err_len);
}

// The mma.sync kernels where the config has them (fallback), on tiles of kMmaSyncBlockMBwd query rows
// (their warp layouts) whatever block_m the config gives the WGMMA kernel; else the reason the WGMMA
// kernel did not run.
template <typename T, int D, int BN, bool kFallback>
int launch_fallback(const BwdArgs& args, bool deterministic, cudaStream_t stream, char* err, size_t err_len) {
  if constexpr (kFallback) {
    return launch_mma_sync<T, D, kMmaSyncBlockMBwd, BN>(args, deterministic, stream, err, err_len);
  } else {
    return fail(err, err_len,
                "head_dim %d / head_dim_v %d runs on the WGMMA backward only (the mma.sync kernels serve equal head "
                "dims that are multiples of 64), and it did not run: %s",
                args.head_dim, args.head_dim_v,
                env_is("FM3_BWD_KERNEL", "mma_sync") ? "FM3_BWD_KERNEL=mma_sync asks for the mma.sync kernels"
                                                     : "TMA cannot describe the layout of q, k, v or dout");
  }
}

// The kernels of config row I of kSm90BwdConfigs, instantiated with its values, when cfg is that row;
// else the next row's.
template <typename T, size_t I = 0>
int dispatch(const Sm90BwdConfig* cfg, const BwdArgs& args, bool deterministic, const void* out, const float* lse,
             cudaStream_t stream, char* err, size_t err_len) {
  if constexpr (I == kSm90BwdConfigs.size()) {
    return fail(err, err_len, "the backward's config is not a row of kSm90BwdConfigs");
  } else {
    if (cfg != &kSm90BwdConfigs[I])
      return dispatch<T, I + 1>(cfg, args, deterministic, out, lse, stream, err, err_len);
    constexpr Sm90BwdConfig c = kSm90BwdConfigs[I];
    const int64_t rows = static_cast<int64_t>(args.batch) * args.num_heads * args.lse_stride;
    constexpr int64_t kRowsPerBlock = 8 * (32 / kPrepLanesPerRow<c.head_dim_v>);
    bwd_preprocess_kernel<T, c.tile_dim, c.head_dim_v>
        <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 256, 0, stream>>>(
            static_cast<const T*>(out), static_cast<const T*>(args.dout), lse, const_cast<float*>(args.delta),
            const_cast<float*>(args.lse2), args.dq_accum, args.o_bs, args.o_rs, args.o_hs, args.num_heads,
            args.seqlen_q, args.lse_stride, rows);
    FM3_CUDA_CHECK(cudaGetLastError());
    if (args.dlearnable_sink != nullptr && launch_sink_grad(args, lse, stream, err, err_len) != 0) return 1;
    if constexpr (c.wgmma) {
      const int rc = launch_wgmma<T, c.tile_dim, c.head_dim, c.head_dim_v, c.block_m, c.block_n, c.stages>(
          args, stream, err, err_len);
      if (rc >= 0) return rc;
    }
    return launch_fallback<T, c.head_dim, c.fallback_block_n, c.fallback>(args, deterministic, stream, err, err_len);
  }
}

// has_config: the head-dim pair has a backward config.
int check_params(const fm3_bwd_params* bp, bool has_config, char* err, size_t err_len) {
  if (check_attn_params(&bp->fwd, has_config, err, err_len) != 0) return 1;
  return check_attn_grads(bp, err, err_len);
}

size_t round_up(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

// The backward's workspace: [dq_accum][lse2][delta][summary][dq_semaphore][dq_chain_start][sink_partial], each
// 256-byte aligned. dq_accum has lse_stride rows per (batch, head): whole 64-row tiles for the
// tile-blocked layout; the WGMMA kernel writes it in both modes (in key-block order when
// deterministic: dq_semaphore and dq_chain_start, one int per 64 rows, enough for any block_m). Its rows
// are the config's tile_dim floats wide; the mma.sync fallback's accumulator rows of head_dim floats fit
// inside the rows cleared and allocated at that width.
struct WorkspaceLayout {
  int lse_stride;  // rows per (batch, head) of dq_accum, lse2 and delta
  // Byte offsets of the parts (dq_accum at 0); summary, sem and chain hold 0 bytes where absent.
  size_t lse2, delta, summary, sem, chain, sink_partial, total;
  size_t summary_bytes, sem_bytes;
};

// cfg: the head dims' config, or nullptr (a pair without one: no dQ accumulator or block summary).
WorkspaceLayout workspace_layout(const fm3_bwd_params* bp, const Sm90BwdConfig* cfg) {
  const fm3_fwd_params* p = &bp->fwd;
  const int lse_stride = (p->seqlen_q + kLsePad - 1) / kLsePad * kLsePad;
  const size_t rows = static_cast<size_t>(p->batch) * p->num_heads * lse_stride;
  const int block_n = cfg != nullptr ? summary_block_n(*cfg) : 0;
  const size_t n_kblocks = block_n > 0 ? (p->seqlen_k + block_n - 1) / block_n : 0;
  const bool det = bp->deterministic != 0;
  AttnArgs a{};
  fill_attn_args(a, p);  // its mask_heads: 1 without a mask
  const size_t mask_rows = static_cast<size_t>(p->batch) * a.mask_heads;
  WorkspaceLayout w;
  w.lse_stride = lse_stride;
  size_t end = 0;
  auto part = [&end](size_t bytes) {  // the next part's offset
    const size_t at = end;
    end += round_up(bytes);
    return at;
  };
  part(rows * (cfg != nullptr ? cfg->tile_dim : 0) * sizeof(float));  // dq_accum
  w.lse2 = part(rows * sizeof(float));
  w.delta = part(rows * sizeof(float));
  w.summary_bytes = p->startend_row_indices ? sizeof(fm3::BlockSummary) * mask_rows * n_kblocks : 0;
  w.summary = part(w.summary_bytes);
  w.sem_bytes = det ? rows / 64 * sizeof(int32_t) : 0;
  w.sem = part(w.sem_bytes);
  w.chain = part(det ? mask_rows * (lse_stride / 64) * sizeof(int32_t) : 0);
  w.sink_partial = part(bp->dlearnable_sink ? p->num_heads * sink_chunks(p->batch, p->seqlen_q) * sizeof(float) : 0);
  w.total = end;
  return w;
}

}  // namespace
}  // namespace fm3::hopper

using namespace fm3::hopper;

extern "C" int fm3_cuda_bwd_block_n(int head_dim, int head_dim_v) {
  const fm3::Sm90BwdConfig* cfg = find_config(fm3::kSm90BwdConfigs, head_dim, head_dim_v);
  return cfg != nullptr ? cfg->block_n : 0;
}

extern "C" size_t fm3_cuda_bwd_workspace_bytes(const fm3_bwd_params* bp) {
  if (bp == nullptr) return 0;
  return workspace_layout(bp, find_config(fm3::kSm90BwdConfigs, bp->fwd.head_dim, bp->fwd.head_dim_v)).total;
}

extern "C" int fm3_cuda_bwd(const fm3_bwd_params* bp, char* err, size_t err_len) {
  if (bp == nullptr) return fail(err, err_len, "params is NULL");
  // The config is resolved once per call and handed on.
  const fm3::Sm90BwdConfig* cfg = find_config(fm3::kSm90BwdConfigs, bp->fwd.head_dim, bp->fwd.head_dim_v);
  if (check_params(bp, cfg != nullptr, err, err_len) != 0) return 1;
  const fm3_fwd_params* p = &bp->fwd;
  cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
  const bool deterministic = bp->deterministic != 0;
  const WorkspaceLayout w = workspace_layout(bp, cfg);
  if (bp->workspace != nullptr && (bp->workspace_bytes < w.total || reinterpret_cast<uintptr_t>(bp->workspace) % 256))
    return fail(err, err_len, "workspace must be 256-byte aligned and hold %zu bytes, got %zu bytes at %p", w.total,
                bp->workspace_bytes, bp->workspace);

  bwd::BwdArgs a{};
  fill_attn_args(a, p);
  a.dout = bp->dout;
  a.dq = bp->dq;
  a.dk = bp->dk;
  a.dv = bp->dv;
  a.lse_stride = w.lse_stride;
  a.scale = p->softmax_scale;
  a.learnable_sink = p->learnable_sink;
  a.dlearnable_sink = bp->dlearnable_sink;

  char* ws = static_cast<char*>(bp->workspace);
  if (ws == nullptr) FM3_CUDA_CHECK(workspace_alloc(reinterpret_cast<void**>(&ws), w.total, stream));
  a.dq_accum = reinterpret_cast<float*>(ws);
  a.lse2 = reinterpret_cast<float*>(ws + w.lse2);
  a.delta = reinterpret_cast<float*>(ws + w.delta);
  a.summary = w.summary_bytes ? reinterpret_cast<fm3::BlockSummary*>(ws + w.summary) : nullptr;
  a.dq_semaphore = deterministic ? reinterpret_cast<int32_t*>(ws + w.sem) : nullptr;
  a.dq_chain_start = deterministic ? reinterpret_cast<int32_t*>(ws + w.chain) : nullptr;
  a.sink_partial = reinterpret_cast<float*>(ws + w.sink_partial);

  int rc = 0;
  cudaError_t e = cudaSuccess;
  // dq_accum is cleared by bwd_preprocess_kernel (bwd/common.cuh).
  if (deterministic) e = cudaMemsetAsync(a.dq_semaphore, 0, w.sem_bytes, stream);
  if (e != cudaSuccess) {
    rc = fail(err, err_len, "backward set-up: %s", cudaGetErrorString(e));
  } else {
    rc = p->dtype == FM3_BFLOAT16
             ? dispatch<__nv_bfloat16>(cfg, a, deterministic, p->out, p->softmax_lse, stream, err, err_len)
             : dispatch<__half>(cfg, a, deterministic, p->out, p->softmax_lse, stream, err, err_len);
  }
  if (bp->workspace == nullptr) {
    e = workspace_free(ws, stream);
    if (rc == 0 && e != cudaSuccess) return fail(err, err_len, "workspace free: %s", cudaGetErrorString(e));
  }
  return rc;
}

#ifdef FM3_BWD_TRACE
// tools/bwd_trace.py: the WGMMA backward records its phases per CTA into buf (bwd/trace.cuh,
// kBwdTraceSlots uint64 per CTA, enough for the next launch's grid); null stops it.
extern "C" int fm3_cuda_bwd_trace(uint64_t* buf) {
  return cudaMemcpyToSymbol(sm90::g_bwd_trace, &buf, sizeof(buf)) == cudaSuccess ? 0 : 1;
}
#endif
