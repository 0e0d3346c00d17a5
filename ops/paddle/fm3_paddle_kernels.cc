// Paddle glue: maps paddle::Tensor onto the framework-free params struct and
// calls the kernels through the C ABI. The registration of these functions as
// ops is generated from yaml/ (fm3_ops_generated.cc). Argument checking with
// user-facing messages lives in paddle_fm3/_validation.py; the shape checks here
// repeat its shape rules at run time, because under paddle.jit.to_static with
// unknown (-1) dimensions the Python checks cannot see the real shapes, and a
// mask shorter than seqlen_k would otherwise be read out of bounds.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "fm3/mask.h"
#include "fm3/params.h"
#include "fm3_ops_generated.h"
#include "paddle/common/enforce.h"

#ifdef FM3_WITH_CUDA
#include <cuda_runtime.h>

#include "paddle/phi/api/include/context_pool.h"
#include "paddle/phi/core/cuda_stream.h"

#include "fm3_cuda.h"
#endif

namespace {

// A shape check that Paddle turns into a ValueError in dynamic and static graphs alike (an
// InvalidArgument EnforceNotMet; a PD_CHECK's exception aborts the process when thrown inside
// a static-graph executor).
#define FM3_CHECK_ARG(cond, msg)                                           \
  do {                                                                     \
    if (!(cond)) PADDLE_THROW(::common::errors::InvalidArgument("%s", msg)); \
  } while (0)

fm3_dtype to_fm3_dtype(paddle::DataType t) {
  switch (t) {
    case paddle::DataType::FLOAT32: return FM3_FLOAT32;
    case paddle::DataType::FLOAT16: return FM3_FLOAT16;
    case paddle::DataType::BFLOAT16: return FM3_BFLOAT16;
    default: PD_THROW("paddle_fm3: q/k/v must be float32, float16 or bfloat16");
  }
}

// Contiguous [batch, seqlen, heads, head_dim] strides, in elements.
void strides_of(const paddle::Tensor& t, int64_t* batch, int64_t* row, int64_t* head) {
  const auto& s = t.shape();
  *head = s[3];
  *row = s[2] * s[3];
  *batch = s[1] * s[2] * s[3];
}

// out (and out_grad): [batch, seqlen_q, num_heads, head_dim_v], v's head dim (MLA: 128 with q's 192).
std::vector<int64_t> out_shape_of(const paddle::Tensor& q, const paddle::Tensor& v) {
  PD_CHECK(q.shape().size() == 4 && v.shape().size() == 4, "q, k, v must be 4-D");
  return {q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]};
}

// The op's learnable_sink input: float32 [num_heads], or empty for none (yaml/ops.yaml says why it
// is not an optional input).
bool has_sink(const paddle::Tensor& learnable_sink) { return learnable_sink.defined() && learnable_sink.numel() > 0; }

fm3_fwd_params make_params(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                           const paddle::Tensor& sri, const paddle::optional<paddle::Tensor>& block_mask,
                           const paddle::Tensor& learnable_sink, const paddle::Tensor& out, paddle::Tensor* lse,
                           float softmax_scale, bool causal) {
  PD_CHECK(q.shape().size() == 4 && k.shape().size() == 4 && v.shape().size() == 4, "q, k, v must be 4-D");
  PD_CHECK(sri.dtype() == paddle::DataType::INT32 && sri.shape().size() == 4,
           "startend_row_indices must be int32 [B, H_mask, S_k, C]");
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape(), &ss = sri.shape();
  const int64_t B = qs[0], H = qs[2], D = qs[3], Sk = ks[1], Hk = ks[2], Dv = vs[3];
  for (int64_t d : {qs[0], qs[1], qs[2], qs[3], ks[2], vs[3], ss[1], ss[3]})
    FM3_CHECK_ARG(d >= 1 && d <= INT32_MAX, "q, k, v and startend_row_indices dimensions must be in [1, 2^31 - 1] "
             "(seqlen_k may be 0)");
  FM3_CHECK_ARG(Sk >= 0 && Sk <= INT32_MAX, "seqlen_k must be in [0, 2^31 - 1]");
  // v may have its own head dim (MLA); which pairs are accepted is the Python API's rule.
  FM3_CHECK_ARG(ks[0] == B && ks[3] == D && vs[0] == B && vs[1] == Sk && vs[2] == Hk,
                "k must have shape [batch, seqlen_k, num_heads_k, head_dim] with q's batch and head_dim, and v "
                "[batch, seqlen_k, num_heads_k, head_dim_v]");
  FM3_CHECK_ARG(out.shape() == out_shape_of(q, v), "out must have shape [batch, seqlen_q, num_heads, head_dim_v]");
  FM3_CHECK_ARG(H % Hk == 0, "num_heads must be a multiple of num_heads_k");
  char err[256] = {0};
  FM3_CHECK_ARG(fm3_check_mask_shape(ss.data(), B, Sk, H, Hk, causal ? 1 : 0, err, sizeof(err)) == 0, err);
  if (block_mask) {
    const auto& bs = block_mask->shape();
    FM3_CHECK_ARG(block_mask->dtype() == paddle::DataType::INT32 && bs.size() == 4 && bs[0] == B && bs[1] == ss[1] &&
                 bs[2] == fm3::block_mask_blocks(qs[1]) && bs[3] == fm3::block_mask_blocks(Sk),
             "block_mask must be int32 [batch, mask_heads, ceil(seqlen_q / 128), ceil(seqlen_k / 128)]");
  }
  if (has_sink(learnable_sink)) {
    FM3_CHECK_ARG(learnable_sink.dtype() == paddle::DataType::FLOAT32 && learnable_sink.shape() ==
                      std::vector<int64_t>{H},
                  "learnable_sink must be float32 [num_heads] (one logit per query head), or empty for none");
  }
  fm3_fwd_params p{};
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = const_cast<void*>(out.data());
  p.softmax_lse = lse->data<float>();
  p.startend_row_indices = sri.data<int32_t>();
  p.block_mask = block_mask ? block_mask->data<int32_t>() : nullptr;
  p.learnable_sink = has_sink(learnable_sink) ? learnable_sink.data<float>() : nullptr;
  strides_of(q, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  strides_of(k, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  strides_of(v, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  strides_of(out, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  p.batch = static_cast<int>(q.shape()[0]);
  p.seqlen_q = static_cast<int>(q.shape()[1]);
  p.num_heads = static_cast<int>(q.shape()[2]);
  p.head_dim = static_cast<int>(q.shape()[3]);
  p.head_dim_v = static_cast<int>(Dv);
  p.seqlen_k = static_cast<int>(k.shape()[1]);
  p.num_heads_k = static_cast<int>(k.shape()[2]);
  p.mask_heads = static_cast<int>(sri.shape()[1]);
  p.mask_cols = static_cast<int>(sri.shape()[3]);
  p.softmax_scale = softmax_scale;
  p.causal = causal ? 1 : 0;
  p.dtype = to_fm3_dtype(q.dtype());
  return p;
}

// FM3_POISON_OUTPUTS=1 (tests) fills outputs with NaN before a kernel runs,
// so any element a kernel fails to write shows up.
paddle::Tensor new_output(const std::vector<int64_t>& shape, paddle::DataType dtype, const paddle::Place& place) {
  static const bool poison = [] {
    const char* v = std::getenv("FM3_POISON_OUTPUTS");
    return v != nullptr && v[0] == '1';
  }();
  return poison ? paddle::full(shape, NAN, dtype, place) : paddle::empty(shape, dtype, place);
}

void raise_on_error(int status, const char* err) {
  if (status != 0) PD_THROW("paddle_fm3 kernel failed: ", err);
}

// Every tensor a kernel reads or writes lives where q does (a kernel given pointers of another
// device, or a CPU kernel given device pointers, would read out of bounds).
void check_same_place(const paddle::Tensor& q, std::initializer_list<std::pair<const char*, const paddle::Tensor*>> ts) {
  for (const auto& [name, t] : ts) {
    if (t == nullptr || !t->defined()) continue;
    if (t->place() != q.place()) {
      PADDLE_THROW(::common::errors::InvalidArgument("%s is on %s but q is on %s: every input must be on q's device",
                                                     name, t->place().DebugString(), q.place().DebugString()));
    }
  }
}

#ifdef FM3_WITH_CUDA
// Runs a Hopper kernel on the inputs' GPU: makes it the current device for the launch (restoring
// the caller's afterwards), so the kernel, its workspace (cudaMallocAsync) and the stream all belong
// to that device, and hands the kernel Paddle's current stream of that place.
class LaunchOnDevice {
 public:
  explicit LaunchOnDevice(const paddle::Place& place) {
    const int device = place.GetDeviceId();
    cudaError_t e = cudaGetDevice(&prev_);
    if (e == cudaSuccess && prev_ != device) {
      e = cudaSetDevice(device);
      restore_ = e == cudaSuccess;
    }
    if (e != cudaSuccess) PD_THROW("paddle_fm3: cannot make GPU ", device, " current: ", cudaGetErrorString(e));
    stream_ = paddle::GetCurrentCUDAStream(place)->raw_stream();
  }
  ~LaunchOnDevice() {
    if (restore_) cudaSetDevice(prev_);
  }
  LaunchOnDevice(const LaunchOnDevice&) = delete;
  LaunchOnDevice& operator=(const LaunchOnDevice&) = delete;
  void* stream() const { return stream_; }

 private:
  int prev_ = 0;
  bool restore_ = false;
  void* stream_ = nullptr;
};
#endif

}  // namespace

std::vector<paddle::Tensor> FlashmaskAttentionForward(const paddle::Tensor& q, const paddle::Tensor& k,
                                                      const paddle::Tensor& v,
                                                      const paddle::Tensor& startend_row_indices,
                                                      const paddle::optional<paddle::Tensor>& block_mask,
                                                      const paddle::Tensor& learnable_sink, float softmax_scale,
                                                      bool causal, bool /*deterministic: for the backward*/) {
  // out has v's head dim: [batch, seqlen_q, num_heads, head_dim_v].
  auto out = new_output(out_shape_of(q, v), q.dtype(), q.place());
  auto lse = new_output({q.shape()[0], q.shape()[2], q.shape()[1]}, paddle::DataType::FLOAT32, q.place());
  if (q.numel() == 0) return {out, lse};
  check_same_place(q, {{"k", &k}, {"v", &v}, {"startend_row_indices", &startend_row_indices},
                       {"block_mask", block_mask ? &*block_mask : nullptr},
                       {"learnable_sink", has_sink(learnable_sink) ? &learnable_sink : nullptr}});
  fm3_fwd_params p = make_params(q, k, v, startend_row_indices, block_mask, learnable_sink, out, &lse,
                                 softmax_scale, causal);
  char err[512] = {0};
  if (q.is_cpu()) {
    raise_on_error(fm3_cpu_fwd(&p, err, sizeof(err)), err);
  } else {
#ifdef FM3_WITH_CUDA
    LaunchOnDevice on_device(q.place());
    p.stream = on_device.stream();
    raise_on_error(fm3_cuda_fwd(&p, err, sizeof(err)), err);
#else
    PD_THROW("paddle_fm3 was built without CUDA kernels; move the tensors to CPU");
#endif
  }
  return {out, lse};
}

std::vector<paddle::Tensor> FlashmaskAttentionBackward(
    const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
    const paddle::Tensor& startend_row_indices, const paddle::optional<paddle::Tensor>& block_mask,
    const paddle::Tensor& learnable_sink, const paddle::Tensor& out, const paddle::Tensor& softmax_lse,
    const paddle::Tensor& out_grad, float softmax_scale, bool causal, bool deterministic) {
  // The sink's gradient: float32 [num_heads], or empty like the sink when there is none.
  const bool sink = has_sink(learnable_sink);
  const std::vector<int64_t> sink_shape = sink ? learnable_sink.shape() : std::vector<int64_t>{0};
  // Empty inputs, or out unused by the loss (only the lse was): zero gradients, no kernel.
  if (q.numel() == 0 || k.numel() == 0 || !out_grad.defined() || !out_grad.initialized()) {
    return {paddle::full(q.shape(), 0, q.dtype(), q.place()), paddle::full(k.shape(), 0, k.dtype(), k.place()),
            paddle::full(v.shape(), 0, v.dtype(), v.place()),
            paddle::full(sink_shape, 0, paddle::DataType::FLOAT32, q.place())};
  }
  // A second backward through a graph that the first one freed does not get the forward's saved
  // tensors back (Paddle 3.3 hands other tensors in their places, e.g. a float one for the mask).
  FM3_CHECK_ARG(startend_row_indices.dtype() == paddle::DataType::INT32 &&
                    softmax_lse.dtype() == paddle::DataType::FLOAT32 && out.shape() == out_shape_of(q, v),
                "the backward of fm3_flashmask_attention did not get the tensors its forward saved, as on a "
                "second backward through a graph that an earlier backward freed: to go through the graph "
                "twice, run the first backward with retain_graph=True");
  auto dq = new_output(q.shape(), q.dtype(), q.place());
  auto dk = new_output(k.shape(), k.dtype(), k.place());
  auto dv = new_output(v.shape(), v.dtype(), v.place());
  auto dsink = sink ? new_output(sink_shape, paddle::DataType::FLOAT32, q.place())
                    : paddle::empty(sink_shape, paddle::DataType::FLOAT32, q.place());
  PD_CHECK(out_grad.dtype() == q.dtype() && out_grad.shape() == out.shape(),
           "out_grad must have out's shape [batch, seqlen_q, num_heads, head_dim_v] and q's dtype");
  PD_CHECK(softmax_lse.dtype() == paddle::DataType::FLOAT32, "softmax_lse must be float32");
  check_same_place(q, {{"k", &k}, {"v", &v}, {"startend_row_indices", &startend_row_indices},
                       {"block_mask", block_mask ? &*block_mask : nullptr},
                       {"learnable_sink", sink ? &learnable_sink : nullptr}, {"out", &out},
                       {"softmax_lse", &softmax_lse}, {"out_grad", &out_grad}});
  paddle::Tensor lse = softmax_lse;
  fm3_bwd_params bp{};
  bp.fwd = make_params(q, k, v, startend_row_indices, block_mask, learnable_sink, out, &lse, softmax_scale, causal);
  bp.dout = out_grad.data();
  bp.dq = dq.data();
  bp.dk = dk.data();
  bp.dv = dv.data();
  bp.dlearnable_sink = sink ? dsink.data<float>() : nullptr;
  bp.deterministic = deterministic ? 1 : 0;  // the GPU kernel's dQ order; the CPU kernel always is deterministic
  char err[512] = {0};
  if (q.is_cpu()) {
    raise_on_error(fm3_cpu_bwd(&bp, err, sizeof(err)), err);
  } else {
#ifdef FM3_WITH_CUDA
    LaunchOnDevice on_device(q.place());
    bp.fwd.stream = on_device.stream();
    // The workspace (fp32 dQ accumulator, row statistics) from Paddle's allocator, on the stream
    // the kernels run on: Paddle accounts for it and reuses it. 256 bytes more, so that its start
    // can be aligned whatever alignment the allocator gives.
    const size_t need = fm3_cuda_bwd_workspace_bytes(&bp);
    auto workspace = paddle::empty({static_cast<int64_t>(need + 256)}, paddle::DataType::UINT8, q.place());
    const uintptr_t ws = reinterpret_cast<uintptr_t>(workspace.data());
    bp.workspace = reinterpret_cast<void*>((ws + 255) & ~static_cast<uintptr_t>(255));
    bp.workspace_bytes = need;
    raise_on_error(fm3_cuda_bwd(&bp, err, sizeof(err)), err);
#else
    PD_THROW("paddle_fm3 was built without CUDA kernels; move the tensors to CPU");
#endif
  }
  return {dq, dk, dv, dsink};
}

std::vector<paddle::Tensor> BlockClassify(const paddle::Tensor& startend_row_indices,
                                          const paddle::optional<paddle::Tensor>& block_mask, int seqlen_q,
                                          int block_m, int block_n, bool causal) {
  PD_CHECK(startend_row_indices.is_cpu(), "fm3_block_classify runs on CPU tensors");
  PD_CHECK(block_m > 0 && block_n > 0, "block_m and block_n must be positive");
  const auto& s = startend_row_indices.shape();
  // 64-bit: seqlen_q + block_m - 1 overflows int near 2^31.
  const int64_t tiles_q = (static_cast<int64_t>(seqlen_q) + block_m - 1) / block_m;
  auto out = paddle::empty({s[0], s[1], tiles_q, (s[2] + block_n - 1) / block_n},
                           paddle::DataType::INT32, paddle::CPUPlace());
  if (out.numel() == 0) return {out};
  char err[512] = {0};
  raise_on_error(fm3_cpu_classify(startend_row_indices.data<int32_t>(),
                                  block_mask ? block_mask->data<int32_t>() : nullptr, static_cast<int>(s[0]),
                                  static_cast<int>(s[1]), seqlen_q, static_cast<int>(s[2]), static_cast<int>(s[3]),
                                  causal ? 1 : 0, block_m, block_n, out.data<int32_t>(), err, sizeof(err)),
                 err);
  return {out};
}

std::vector<paddle::Tensor> SegmentWorkload(const paddle::Tensor& startend_row_indices, int segment_size, int tile,
                                            bool causal) {
  PD_CHECK(startend_row_indices.is_cpu(), "fm3_segment_workload runs on CPU tensors");
  PD_CHECK(segment_size > 0, "segment_size must be positive");
  const auto& s = startend_row_indices.shape();
  PD_CHECK(s.size() == 4, "startend_row_indices must be 4-D [batch, mask_heads, seqlen, C]");
  for (int64_t d : s) PD_CHECK(d >= 1 && d <= INT32_MAX, "startend_row_indices dimensions must be in [1, 2^31 - 1]");
  const int64_t n = s[2] / segment_size;
  auto weights = paddle::empty({n}, paddle::DataType::INT64, paddle::CPUPlace());
  auto needed = paddle::empty({n, n}, paddle::DataType::INT32, paddle::CPUPlace());
  char err[512] = {0};
  raise_on_error(fm3_cpu_segment_workload(startend_row_indices.data<int32_t>(), static_cast<int>(s[0]),
                                          static_cast<int>(s[1]), static_cast<int>(s[2]), static_cast<int>(s[3]),
                                          causal ? 1 : 0, tile, segment_size, weights.data<int64_t>(),
                                          needed.data<int32_t>(), err, sizeof(err)),
                 err);
  return {weights, needed};
}
