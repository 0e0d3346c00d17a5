// Hopper (sm_90a) primitives for the warp-specialized forward kernel:
// mbarriers, TMA bulk-tensor loads, WGMMA shared-memory descriptors, the
// wgmma.mma_async atoms (CuTe's SM90 GMMA PTX wrappers) and setmaxnreg.
//
// Shared-memory tiles are stored the way TMA writes them with
// CU_TENSOR_MAP_SWIZZLE_128B and a box of 64 elements (128 bytes) along the
// head dimension: a [rows][D] tile is D/64 sub-tiles of [rows][64], each row
// 128 bytes, 16-byte chunks XOR-swizzled by (row % 8), every 8 rows a
// 1024-byte swizzle atom. Every sub-tile starts 1024-byte aligned.
//   K-major operand (Q as A, K as B of S = Q K^T): SBO = 1024 B (next 8 rows),
//     LBO unused (1); the k16 step s of a sub-tile starts at +32*s bytes.
//   MN-major operand (V as B of O = P V, N = head dim, K = keys): LBO = the
//     sub-tile size (next 64 head-dim columns), SBO = 1024 B (next 8 keys);
//     the k16 step s starts at +2048*s bytes.
#pragma once
#include <cuda.h>  // CUtensorMap (header only; the driver entry point is fetched at run time)
#include <stdint.h>

#include <utility>

// The N = 80 / 96 products (head dims 80, 96) are among CuTe's extended shapes.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1
#include <cute/arch/mma_sm90_gmma.hpp>

namespace fm3::hopper::sm90 {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled sub-tile (above).
__host__ __device__ __forceinline__ constexpr int swizzle128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}
// Byte offset of 16-byte half `half` (0, 1) of row `row` in a 32-byte-swizzled block of 16-element
// rows (256-byte aligned; gmma_desc's kSwizzle32B).
__host__ __device__ __forceinline__ constexpr int swizzle32(int row, int half) {
  return row * 32 + ((half ^ ((row >> 2) & 1)) << 4);
}

// ---- mbarriers ------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once (one thread arriving for its warpgroup).
__device__ __forceinline__ void mbar_arrive(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Block until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "FM3_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra FM3_DONE;\n"
      "bra FM3_WAIT;\n"
      "FM3_DONE:\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- TMA --------------------------------------------------------------------
// 4-D tile load (coordinates innermost first) completing on an mbarrier.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// 4-D tile store from shared memory laid out as the map's box (its swizzle), in the issuing
// thread's bulk async-group; elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// 1-D bulk copy of `bytes` (multiple of 16, 16-byte aligned ends) completing on an mbarrier.
__device__ __forceinline__ void bulk_load_1d(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Make this thread's generic-proxy shared-memory writes visible to the async proxy (WGMMA operands).
// 1-D bulk reduction dst[i] += src[i] (fp32) of `bytes` (multiple of 16, 16-byte aligned ends) from
// shared to global memory, in the issuing thread's bulk async-group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Wait until at most N bulk groups are pending: their shared-memory sources may be reused (read) /
// their writes are done (no suffix).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Order this thread's generic-proxy global accesses with its async-proxy ones (bulk copies, reductions).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int32_t* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- register reallocation ------------------------------------------------
template <int N>
__device__ __forceinline__ void reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- WGMMA ------------------------------------------------------------------
// Shared-memory matrix descriptor; layout type 1: 128-byte swizzle (the TMA tiles above), 3: 32-byte
// swizzle (16-element rows, 16-byte halves XOR-swizzled by bit 2 of the row, 256-byte atoms:
// swizzle32).
constexpr uint32_t kSwizzle128B = 1, kSwizzle32B = 3;
__device__ __forceinline__ uint64_t gmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              uint32_t layout = kSwizzle128B) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(layout) << 62;
  return d;
}

// A shared-memory matrix descriptor kept as two 32-bit words, so that moving it by a byte offset is one
// 32-bit add on the low word: the start-address field is (address >> 4) in its low 14 bits, and every
// operand lies below 256 KiB, so the add never carries into the leading-byte-offset field above it.
struct SmemDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ uint64_t at(uint32_t bytes) const {
    return (static_cast<uint64_t>(hi) << 32) | (lo + (bytes >> 4));
  }
  // Moved by a runtime byte offset (a multiple of 16, e.g. a ring stage's): taken once per stage, so
  // that each product's at(constant) is one add of an immediate. Folding the runtime offset into every
  // at() makes ptxas shift the sum again for each product (ULOP3 + ULEA.HI per WGMMA).
  __device__ __forceinline__ SmemDesc plus(uint32_t bytes) const { return {lo + (bytes >> 4), hi}; }
};
__device__ __forceinline__ SmemDesc smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              uint32_t layout = kSwizzle128B) {
  const uint64_t d = gmma_desc(smem_addr, lbo_bytes, sbo_bytes, layout);
  return {static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32)};
}

// The cursor of a kStages-deep ring of mbarrier pairs (the forward's K and V rings, the backward's Q / dO
// ring and its own dO ring): both sides walk the stages in order and the phase bit flips at each wrap;
// the producer waits on a stage's "empty" mbarrier with phase ^ 1, the consumers on its "full" one with
// phase.
template <int kStages>
struct RingCursor {
  int stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

namespace G = cute::SM90::GMMA;

template <typename T, int N>
struct GmmaAtoms;
#define FM3_GMMA_ATOMS(TYPE, N, NAME)                                           \
  template <>                                                                   \
  struct GmmaAtoms<TYPE, N> {                                                   \
    using SS = G::MMA_64x##N##x16_F32##NAME##_SS<G::Major::K, G::Major::K>;     \
    using RS = G::MMA_64x##N##x16_F32##NAME##_RS<G::Major::K, G::Major::MN>;    \
    using SS_MN = G::MMA_64x##N##x16_F32##NAME##_SS<G::Major::MN, G::Major::MN>; \
    using SS_KMN = G::MMA_64x##N##x16_F32##NAME##_SS<G::Major::K, G::Major::MN>; \
  };
FM3_GMMA_ATOMS(__nv_bfloat16, 32, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 48, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 64, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 80, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 96, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 112, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 128, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 192, BF16BF16)
FM3_GMMA_ATOMS(__nv_bfloat16, 256, BF16BF16)
FM3_GMMA_ATOMS(__half, 32, F16F16)
FM3_GMMA_ATOMS(__half, 48, F16F16)
FM3_GMMA_ATOMS(__half, 64, F16F16)
FM3_GMMA_ATOMS(__half, 80, F16F16)
FM3_GMMA_ATOMS(__half, 96, F16F16)
FM3_GMMA_ATOMS(__half, 112, F16F16)
FM3_GMMA_ATOMS(__half, 128, F16F16)
FM3_GMMA_ATOMS(__half, 192, F16F16)
FM3_GMMA_ATOMS(__half, 256, F16F16)
#undef FM3_GMMA_ATOMS

// kOff: the first of d's accumulators the product writes (a WGMMA over some of d's columns).
template <class Atom, int kOff, int N, size_t... I>
__device__ __forceinline__ void gmma_ss_impl(uint64_t da, uint64_t db, float (&d)[N], bool accumulate,
                                             std::index_sequence<I...>) {
  Atom::fma(da, db, d[kOff + I]..., accumulate ? G::ScaleOut::One : G::ScaleOut::Zero);
}
template <class Atom, int N, size_t... I>
__device__ __forceinline__ void gmma_rs_impl(const uint32_t (&a)[4], uint64_t db, float (&d)[N],
                                             std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], db, d[I]..., G::ScaleOut::One);
}

// D[64 x N] (+)= A[64 x 16] (smem) * B[16 x N] (smem), fp32 accumulators
// (N / 2 per thread, the m64nN accumulator layout).
template <typename T, int N>
__device__ __forceinline__ void gmma_ss(uint64_t da, uint64_t db, float (&d)[N / 2], bool accumulate) {
  gmma_ss_impl<typename GmmaAtoms<T, N>::SS, 0>(da, db, d, accumulate, std::make_index_sequence<N / 2>{});
}
// D[64 x N] (+)= A[64 x 16] * B[16 x N], both from smem and MN-major (A stored [k][m], B [k][n]);
// D: accumulators [kOff, kOff + N / 2) of d (columns [2 kOff, 2 kOff + N) of a wider accumulator).
template <typename T, int N, int kOff = 0, int M>
__device__ __forceinline__ void gmma_ss_mn(uint64_t da, uint64_t db, float (&d)[M], bool accumulate) {
  static_assert(kOff + N / 2 <= M, "accumulators");
  gmma_ss_impl<typename GmmaAtoms<T, N>::SS_MN, kOff>(da, db, d, accumulate, std::make_index_sequence<N / 2>{});
}
// D[64 x N] += A[64 x 16] (smem, K-major: stored [m][k]) * B[16 x N] (smem, MN-major: stored [k][n]);
// D as for gmma_ss_mn.
template <typename T, int N, int kOff = 0, int M>
__device__ __forceinline__ void gmma_ss_kmn(uint64_t da, uint64_t db, float (&d)[M], bool accumulate) {
  static_assert(kOff + N / 2 <= M, "accumulators");
  gmma_ss_impl<typename GmmaAtoms<T, N>::SS_KMN, kOff>(da, db, d, accumulate, std::make_index_sequence<N / 2>{});
}
// D[64 x N] += A[64 x 16] (registers, the mma.m16n8k16 A layout per warp) * B (smem, MN-major).
template <typename T, int N>
__device__ __forceinline__ void gmma_rs(const uint32_t (&a)[4], uint64_t db, float (&d)[N / 2]) {
  gmma_rs_impl<typename GmmaAtoms<T, N>::RS, N / 2>(a, db, d, std::make_index_sequence<N / 2>{});
}

__device__ __forceinline__ void gmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void gmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keep the compiler from moving accumulator reads/writes across the async MMA,
// and keep register A operands (read asynchronously) alive until the wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

}  // namespace fm3::hopper::sm90
