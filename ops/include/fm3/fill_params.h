// The one map from a binding's tensors to the C ABI's params (fm3/params.h), shared by the Paddle op
// (ops/paddle/fm3_paddle_kernels.cc) and the DLPack module (ops/dlpack/fm3_dlpack.cc). It checks
// what the struct cannot hold: each tensor's rank, a shape that agrees with q's, k's and v's, sizes
// that fit an int, one dtype for q, k, v, out, and strides the struct describes (unit stride along
// the head dim; the gradients' strides are their counterparts'). It ends with the rules on the params
// (fm3_check_params, params.h), so that both bindings raise those as ValueError too, before any
// kernel. The checks a caller of paddle_fm3.flashmask_attention meets first are Python's
// (paddle_fm3/_checks.py); these are for what Python cannot see (a static graph's unknown dims) and
// for callers of the op or of paddle_fm3.kernels itself.
#pragma once
#include <climits>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fm3/mask.h"
#include "fm3/params.h"

namespace fm3 {

// A tensor's element type, as a binding reads it.
enum class Elem { kFloat32, kFloat16, kBFloat16, kInt32, kOther };

// One tensor argument, borrowed (the binding keeps the tensor alive): the name the caller knows it
// by, its data, shape and strides (in elements).
struct TensorArg {
  std::string name;
  void* data = nullptr;
  std::vector<int64_t> shape, strides;
  Elem elem = Elem::kOther;
};

// An argument out of contract: each binding raises it as TypeError (type: a dtype) or ValueError.
struct ArgError : std::runtime_error {
  ArgError(bool type, const std::string& msg) : std::runtime_error(msg), type(type) {}
  bool type;
};

// The forward's tensors; the masks and the sink are optional.
struct AttnTensors {
  TensorArg q, k, v, out, lse;
  std::optional<TensorArg> startend_row_indices, block_mask, learnable_sink;
};

// The backward's own: dout, dq, dk, dv, shaped and strided like out, q, k, v; the sink's gradient.
struct GradTensors {
  TensorArg dout, dq, dk, dv;
  std::optional<TensorArg> dlearnable_sink;
};

inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

// What a tensor argument must be, worded once for both bindings (the messages name it).
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline void expect_ndim(const TensorArg& t, size_t ndim, const char* layout) {
  if (t.shape.size() != ndim)
    throw ArgError(false, t.name + " must be " + std::to_string(ndim) + "-D " + layout + ", got shape " +
                              shape_str(t.shape));
}

inline void expect_shape(const TensorArg& t, const std::vector<int64_t>& want, const char* layout) {
  if (t.shape != want)
    throw ArgError(false,
                   t.name + " must have shape " + shape_str(want) + " " + layout + ", got " + shape_str(t.shape));
}

inline void expect_elem(const TensorArg& t, Elem elem, const char* what) {
  if (t.elem != elem) throw ArgError(true, t.name + " must be " + what);
}

inline void expect_contiguous(const TensorArg& t) {
  const std::vector<int64_t> want = contiguous_strides(t.shape);
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (t.shape[i] != 1 && t.strides[i] != want[i]) throw ArgError(false, t.name + " must be contiguous");
}

// The float32 [num_heads] contiguous sink, or its gradient (the shape worded as Python's
// _checks.check_learnable_sink_shape words it).
inline void expect_sink(const TensorArg& t, int64_t num_heads) {
  expect_elem(t, Elem::kFloat32, "float32");
  if (t.shape != std::vector<int64_t>{num_heads})
    throw ArgError(false, t.name + " must have shape [num_heads=" + std::to_string(num_heads) +
                              "] (one logit per query head), got " + shape_str(t.shape));
  expect_contiguous(t);
}

// An int32 contiguous 4-D mask.
inline void expect_mask(const TensorArg& t, const char* layout) {
  expect_ndim(t, 4, layout);
  expect_elem(t, Elem::kInt32, "int32");
  expect_contiguous(t);
}

namespace fill_detail {

constexpr const char* kQ = "[batch, seqlen_q, num_heads, head_dim]";
constexpr const char* kK = "[batch, seqlen_k, num_heads_k, head_dim]";
constexpr const char* kV = "[batch, seqlen_k, num_heads_k, head_dim_v]";
constexpr const char* kOut = "[batch, seqlen_q, num_heads, head_dim_v]";
constexpr const char* kLse = "[batch, num_heads, seqlen_q]";
constexpr const char* kMask = "[batch, mask_heads, seqlen_k, C]";
constexpr const char* kBlockMask = "[batch, mask_heads, ceil(seqlen_q/128), ceil(seqlen_k/128)]";

inline int fm3_dtype_of(Elem e) {
  switch (e) {
    case Elem::kFloat32: return FM3_FLOAT32;
    case Elem::kFloat16: return FM3_FLOAT16;
    case Elem::kBFloat16: return FM3_BFLOAT16;
    default: return -1;
  }
}

// Both entries' params; g: the backward's tensors, or nullptr for the forward.
inline fm3_fwd_params fill(const AttnTensors& t, const GradTensors* g, float softmax_scale, bool causal, bool gpu) {
  const TensorArg &q = t.q, &k = t.k, &v = t.v, &out = t.out, &lse = t.lse;
  expect_ndim(q, 4, kQ);
  expect_ndim(k, 4, kK);
  expect_ndim(v, 4, kV);
  const int64_t B = q.shape[0], Sq = q.shape[1], H = q.shape[2], D = q.shape[3];
  const int64_t Sk = k.shape[1], Hk = k.shape[2], Dv = v.shape[3];
  expect_shape(k, {B, Sk, Hk, D}, kK);
  expect_shape(v, {B, Sk, Hk, Dv}, kV);
  expect_shape(out, {B, Sq, H, Dv}, kOut);
  // The backward's gradients: each shaped (and strided, below) like its counterpart.
  std::vector<std::pair<const TensorArg*, const TensorArg*>> grads;  // (gradient, counterpart)
  if (g != nullptr) grads = {{&g->dout, &out}, {&g->dq, &q}, {&g->dk, &k}, {&g->dv, &v}};
  const char* grad_layouts[] = {kOut, kQ, kK, kV};
  for (size_t i = 0; i < grads.size(); ++i) expect_shape(*grads[i].first, grads[i].second->shape, grad_layouts[i]);
  expect_shape(lse, {B, H, Sq}, kLse);
  // Before they are narrowed to the params' int (their lower bounds: fm3_check_params).
  const std::pair<const char*, int64_t> sizes[] = {{"batch", B},   {"seqlen_q", Sq},    {"num_heads", H},
                                                   {"head_dim", D}, {"seqlen_k", Sk},   {"num_heads_k", Hk},
                                                   {"head_dim_v", Dv}};
  for (const auto& [name, n] : sizes)
    if (n > INT_MAX) throw ArgError(false, std::string(name) + " must be <= 2147483647, got " + std::to_string(n));
  std::vector<const TensorArg*> like_q = {&q, &k, &v, &out};
  for (const auto& [grad, counterpart] : grads) like_q.push_back(grad);
  char err[256] = {0};
  for (const TensorArg* x : like_q) {
    if (fm3_check_dtype(x->name.c_str(), fm3_dtype_of(x->elem), gpu ? 1 : 0, err, sizeof err) != 0)
      throw ArgError(true, err);
    if (x->elem != q.elem) throw ArgError(true, x->name + " must have q's dtype");
  }
  expect_elem(lse, Elem::kFloat32, "float32");
  for (const TensorArg* x : like_q)
    if (x->strides[3] != 1) throw ArgError(false, x->name + " must have a unit stride in head_dim");
  expect_contiguous(lse);
  for (const auto& [grad, counterpart] : grads)
    if (grad->strides != counterpart->strides)
      throw ArgError(false, grad->name + " must have the same strides as " + counterpart->name);
  if (t.learnable_sink) expect_sink(*t.learnable_sink, H);
  if (g != nullptr && g->dlearnable_sink) expect_sink(*g->dlearnable_sink, H);

  fm3_fwd_params p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.softmax_lse = static_cast<float*>(lse.data);
  p.q_batch_stride = q.strides[0], p.q_row_stride = q.strides[1], p.q_head_stride = q.strides[2];
  p.k_batch_stride = k.strides[0], p.k_row_stride = k.strides[1], p.k_head_stride = k.strides[2];
  p.v_batch_stride = v.strides[0], p.v_row_stride = v.strides[1], p.v_head_stride = v.strides[2];
  p.o_batch_stride = out.strides[0], p.o_row_stride = out.strides[1], p.o_head_stride = out.strides[2];
  p.batch = static_cast<int>(B), p.seqlen_q = static_cast<int>(Sq), p.seqlen_k = static_cast<int>(Sk);
  p.num_heads = static_cast<int>(H), p.num_heads_k = static_cast<int>(Hk);
  p.head_dim = static_cast<int>(D), p.head_dim_v = static_cast<int>(Dv);
  p.softmax_scale = softmax_scale;
  p.causal = causal ? 1 : 0;
  p.dtype = static_cast<fm3_dtype>(fm3_dtype_of(q.elem));
  p.learnable_sink = t.learnable_sink ? static_cast<const float*>(t.learnable_sink->data) : nullptr;
  p.mask_heads = 1;
  // The masks' shapes in full (the params keep only their mask heads and C).
  if (const auto& s = t.startend_row_indices) {
    expect_mask(*s, kMask);
    if (fm3_check_mask_shape(s->shape.data(), B, Sk, H, Hk, causal ? 1 : 0, err, sizeof err) != 0)
      throw ArgError(false, err);
    p.startend_row_indices = static_cast<const int32_t*>(s->data);
    p.mask_heads = static_cast<int>(s->shape[1]);
    p.mask_cols = static_cast<int>(s->shape[3]);
  }
  if (const auto& bm = t.block_mask) {
    expect_mask(*bm, kBlockMask);
    const int64_t Hm = t.startend_row_indices ? t.startend_row_indices->shape[1] : bm->shape[1];
    if (Hm > INT_MAX) throw ArgError(false, "block_mask.shape[1] must be <= 2147483647, got " + std::to_string(Hm));
    expect_shape(*bm, {B, Hm, block_mask_blocks(Sq), block_mask_blocks(Sk)}, kBlockMask);
    p.block_mask = static_cast<const int32_t*>(bm->data);
    p.mask_heads = static_cast<int>(Hm);
    // Values are checked where they are on the host (CPU kernels), in dynamic and static graphs alike;
    // for GPU tensors it would be a synchronizing copy per call, and the kernels read nonzero as 1.
    if (!gpu) {
      const int64_t n = bm->shape[0] * bm->shape[1] * bm->shape[2] * bm->shape[3];
      for (int64_t i = 0; i < n; ++i)
        if (p.block_mask[i] != 0 && p.block_mask[i] != 1)
          throw ArgError(false, "block_mask values must be 0 (masked) or 1 (kept), got " +
                                    std::to_string(p.block_mask[i]));
    }
  }
  if (fm3_check_params(&p, err, sizeof err) != 0) throw ArgError(false, err);
  return p;
}

}  // namespace fill_detail

// out's shape, [batch, seqlen_q, num_heads, head_dim_v] (v's head dim: MLA's 128 under q's 192).
inline std::vector<int64_t> out_shape(const TensorArg& q, const TensorArg& v) {
  expect_ndim(q, 4, fill_detail::kQ);
  expect_ndim(v, 4, fill_detail::kV);
  return {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
}

// The forward's params from its tensors (gpu: for the GPU kernels, which take float16 and bfloat16
// only). Throws ArgError.
inline fm3_fwd_params fill_fwd_params(const AttnTensors& t, float softmax_scale, bool causal, bool gpu) {
  return fill_detail::fill(t, nullptr, softmax_scale, causal, gpu);
}

// The backward's params: the forward's, and the gradients. Throws ArgError.
inline fm3_bwd_params fill_bwd_params(const AttnTensors& t, const GradTensors& g, float softmax_scale, bool causal,
                                      bool gpu, bool deterministic) {
  fm3_bwd_params bp{};
  bp.fwd = fill_detail::fill(t, &g, softmax_scale, causal, gpu);
  bp.dout = g.dout.data;
  bp.dq = g.dq.data;
  bp.dk = g.dk.data;
  bp.dv = g.dv.data;
  bp.dlearnable_sink = g.dlearnable_sink ? static_cast<float*>(g.dlearnable_sink->data) : nullptr;
  bp.deterministic = deterministic ? 1 : 0;
  char err[256] = {0};
  if (fm3_check_bwd_params(&bp, err, sizeof err) != 0) throw ArgError(false, err);
  return bp;
}

}  // namespace fm3
