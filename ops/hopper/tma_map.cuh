// Host side: 4-D TMA descriptors ([batch, seqlen, heads, head_dim] tensors,
// 128-byte swizzle, box of 64 head-dim elements x box_rows rows), shared by the
// forward and backward launchers. The driver entry point is fetched at run time
// (no -lcuda).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <type_traits>

namespace fm3::hopper {

using EncodeTiledFn = PFN_cuTensorMapEncodeTiled_v12000;

inline EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiledFn>(nullptr);
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// [batch, seqlen, heads, head_dim] (strides in elements) as a 4-D TMA map with a
// 128-byte-swizzled box of 64 x box_rows (head dim innermost). False when TMA
// cannot describe it.
template <typename T>
inline bool make_tma_map(CUtensorMap* map, const void* ptr, int head_dim, int seqlen, int heads, int batch, int64_t rs,
                  int64_t hs, int64_t bs, int box_rows) {
  EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  int64_t st[3] = {rs, hs, bs};
  // A stride of a size-1 dimension is never used; make it one TMA accepts.
  if (seqlen == 1) st[0] = head_dim;
  if (heads == 1) st[1] = st[0] * seqlen;
  if (batch == 1) st[2] = st[1] * heads;
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    if (st[i] <= 0) return false;
    strides[i] = static_cast<cuuint64_t>(st[i]) * sizeof(T);
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt =
      sizeof(T) == 2 && std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(map, dt, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace fm3::hopper
