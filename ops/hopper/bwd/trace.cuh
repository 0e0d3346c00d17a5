// Backward WGMMA kernel (bwd/kernel.cuh): per-CTA timestamps of its phases, for tools/bwd_trace.py.
// Compiled in only with -DFM3_BWD_TRACE (FM3_NVCC_EXTRA, scripts/gpu_build.sh); without it
// bwd_trace is empty and the kernels' machine code is that of a build without this file.
// fm3_cuda_bwd_trace (flash_bwd_launch.cu) points g_bwd_trace at a device buffer of
// kBwdTraceSlots uint64 per CTA (linear block index); null: nothing is recorded.
#pragma once
#include <stdint.h>

namespace fm3::hopper::sm90 {

enum BwdTraceSlot {
  kTraceStart,         // CTA entry (thread 0), %globaltimer ns
  kTraceSummary,       // the producer has the first query head's block summary (its load has landed)
  kTraceScheduled,     // ... and the query-tile window of its first tile
  kTraceFirstLoad,     // ... and has issued that tile's Q / dO loads
  kTraceKvReady,       // the consumers see K and V in shared memory
  kTraceFirstTile,     // ... and the first tile of the ring
  kTraceLoopEnd,       // ... and the end of the stream
  kTraceEpilogueDone,  // dK and dV are stored
  kTraceWriterDone,    // the (first) dQ writer leaves
  kTraceTilesSm,       // (SM id << 32) | query tiles the consumers computed
  kBwdTraceSlots
};

#ifdef FM3_BWD_TRACE
__device__ uint64_t* g_bwd_trace;

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void bwd_trace_put(int slot, uint64_t value) {
  if (g_bwd_trace == nullptr) return;
  const uint64_t cta = blockIdx.x + static_cast<uint64_t>(gridDim.x) * (blockIdx.y + static_cast<uint64_t>(gridDim.y) * blockIdx.z);
  g_bwd_trace[cta * kBwdTraceSlots + slot] = value;
}
// The time of `slot`, where `pred` (one thread per slot and CTA).
__device__ __forceinline__ void bwd_trace(int slot, bool pred) {
  if (pred) bwd_trace_put(slot, globaltimer_ns());
}
__device__ __forceinline__ void bwd_trace_tiles(int tiles, bool pred) {
  if (!pred) return;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  bwd_trace_put(kTraceTilesSm, (static_cast<uint64_t>(sm) << 32) | static_cast<uint32_t>(tiles));
}
#else
__device__ __forceinline__ void bwd_trace(int, bool) {}
__device__ __forceinline__ void bwd_trace_tiles(int, bool) {}
#endif

}  // namespace fm3::hopper::sm90
