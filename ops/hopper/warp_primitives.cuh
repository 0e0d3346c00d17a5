// Warp-level PTX primitives shared by the mma.sync and WGMMA kernels: shared-memory
// addresses, cp.async copies, ldmatrix, mma.sync m16n8k16 with fp32 accumulators, bf16/fp16
// packing, exp2, the end of a forward row. Fragment layouts are PTX's
// ("Matrix Fragments for mma.m16n8k16"): with g = lane / 4, t = lane % 4,
//   A 16x16: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t), a[2] = (g, 2t+8), a[3] = (g+8, 2t+8)
//   B 16x8 : b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C 16x8 : c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

namespace fm3::hopper {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4-byte global->shared copy (mask columns); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The inverse of ldmatrix_x4: lane i gives the shared-memory address of row i % 8 of 8 x 8 matrix
// i / 8; r[m] is this thread's pair of 16-bit elements of matrix m (the mma fragment layout).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// The double-buffered walk of the mma.sync kernels over a compacted list (one cp.async group per
// entry, committed by load(entry, stage)): start loading entry i + 1 into the other stage, then
// wait for entry i's loads.
template <class Load>
__device__ __forceinline__ void load_next_wait_current(const int* list, int i, int count, int stage,
                                                       const Load& load) {
  if (i + 1 < count) {
    load(list[i + 1], stage ^ 1);
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The forward's end of a query row: l, the row's sum (this thread's share plus its quad's, the other
// three threads holding the row), gives the factor for O and lse = (row maximum m + log2 l) * ln 2
// (m, l in log2 units). A learnable sink (sink_log2 > -inf: a virtual key of that score and value 0)
// joins the denominator, shifted to max(m, sink) so that a large sink cannot overflow. A row that
// saw no key gets O = 0 and lse -inf (with a sink: the sink's): a fully masked row is 0, never NaN.
struct RowEnd {
  float o_scale;  // multiplies the row's unnormalized O
  float lse;      // natural log
  __device__ __forceinline__ RowEnd(float row_sum_share, float row_max_log2, float sink_log2) {
    float l = row_sum_share;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float m = row_max_log2;
    float alpha = 1.f;  // rescales l and O from m to the shifted maximum
    if (sink_log2 != -CUDART_INF_F) {
      const float mn = fmaxf(m, sink_log2);
      alpha = exp2f(m - mn);  // 0 when no key was seen (m = -inf)
      l = l * alpha + exp2f(sink_log2 - mn);
      m = mn;
    }
    const bool empty = !(l > 0.f);
    o_scale = empty ? 0.f : alpha / l;
    lse = empty ? -CUDART_INF_F : (m + __log2f(l)) * 0.6931471805599453f;
  }
};

// The sink of query head h in log2 units, -inf without one (RowEnd).
__device__ __forceinline__ float sink_log2(const float* learnable_sink, int h) {
  return learnable_sink != nullptr ? __ldg(learnable_sink + h) * 1.4426950408889634f : -CUDART_INF_F;
}

}  // namespace fm3::hopper
