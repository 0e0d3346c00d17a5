// Paddle glue: maps paddle::Tensor onto the framework-free params struct through the filler the
// DLPack module shares (fm3/fill_params.h) and calls the kernels through the C ABI. The registration
// of these functions as ops is generated from yaml/ (fm3_ops_generated.cc). A call through
// paddle_fm3.flashmask_attention meets Python's checks first (paddle_fm3/_checks.py); the filler's
// run again at run time, because under paddle.jit.to_static with unknown (-1) dimensions the Python
// checks cannot see the real shapes, and a mask shorter than seqlen_k would otherwise be read out of
// bounds.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "fm3/fill_params.h"
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

// A check that Paddle turns into a ValueError in dynamic and static graphs alike (an
// InvalidArgument EnforceNotMet; a PD_CHECK's exception aborts the process when thrown inside
// a static-graph executor).
#define FM3_CHECK_ARG(cond, msg)                                           \
  do {                                                                     \
    if (!(cond)) PADDLE_THROW(::common::errors::InvalidArgument("%s", msg)); \
  } while (0)

fm3::Elem elem_of(paddle::DataType t) {
  switch (t) {
    case paddle::DataType::FLOAT32: return fm3::Elem::kFloat32;
    case paddle::DataType::FLOAT16: return fm3::Elem::kFloat16;
    case paddle::DataType::BFLOAT16: return fm3::Elem::kBFloat16;
    case paddle::DataType::INT32: return fm3::Elem::kInt32;
    default: return fm3::Elem::kOther;
  }
}

// A tensor as the filler's argument (the op's tensors are contiguous).
fm3::TensorArg arg(const char* name, const paddle::Tensor& t) {
  fm3::TensorArg a;
  a.name = name;
  a.data = const_cast<void*>(t.data());
  a.shape = t.shape();
  a.strides = fm3::contiguous_strides(a.shape);
  a.elem = elem_of(t.dtype());
  return a;
}

// The filler's errors as Paddle's: InvalidType (TypeError) or InvalidArgument (ValueError), as
// FM3_CHECK_ARG's.
[[noreturn]] void raise_arg_error(const fm3::ArgError& e) {
  if (e.type) PADDLE_THROW(::common::errors::InvalidType("%s", e.what()));
  PADDLE_THROW(::common::errors::InvalidArgument("%s", e.what()));
}

// The op's learnable_sink input: float32 [num_heads], or empty for none (yaml/ops.yaml says why it
// is not an optional input).
bool has_sink(const paddle::Tensor& learnable_sink) { return learnable_sink.defined() && learnable_sink.numel() > 0; }

// The forward's tensors (the backward's inputs): the op's names for them.
fm3::AttnTensors attn_tensors(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                              const paddle::Tensor& sri, const paddle::optional<paddle::Tensor>& block_mask,
                              const paddle::Tensor& learnable_sink, const paddle::Tensor& out,
                              const paddle::Tensor& lse) {
  fm3::AttnTensors t{arg("q", q), arg("k", k), arg("v", v), arg("out", out), arg("softmax_lse", lse)};
  t.startend_row_indices = arg("startend_row_indices", sri);
  if (block_mask) t.block_mask = arg("block_mask", *block_mask);
  if (has_sink(learnable_sink)) t.learnable_sink = arg("learnable_sink", learnable_sink);
  return t;
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
  std::vector<int64_t> out_shape;  // [batch, seqlen_q, num_heads, head_dim_v]: v's head dim
  try {
    out_shape = fm3::out_shape(arg("q", q), arg("v", v));
  } catch (const fm3::ArgError& e) {
    raise_arg_error(e);
  }
  auto out = new_output(out_shape, q.dtype(), q.place());
  auto lse = new_output({q.shape()[0], q.shape()[2], q.shape()[1]}, paddle::DataType::FLOAT32, q.place());
  if (q.numel() == 0) return {out, lse};
  check_same_place(q, {{"k", &k}, {"v", &v}, {"startend_row_indices", &startend_row_indices},
                       {"block_mask", block_mask ? &*block_mask : nullptr},
                       {"learnable_sink", has_sink(learnable_sink) ? &learnable_sink : nullptr}});
  fm3_fwd_params p;
  try {
    p = fm3::fill_fwd_params(attn_tensors(q, k, v, startend_row_indices, block_mask, learnable_sink, out, lse),
                             softmax_scale, causal, !q.is_cpu());
  } catch (const fm3::ArgError& e) {
    raise_arg_error(e);
  }
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
  const bool saved = startend_row_indices.dtype() == paddle::DataType::INT32 &&
                     softmax_lse.dtype() == paddle::DataType::FLOAT32 && q.shape().size() == 4 &&
                     v.shape().size() == 4 &&
                     out.shape() == std::vector<int64_t>{q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]};
  FM3_CHECK_ARG(saved, "the backward of fm3_flashmask_attention did not get the tensors its forward saved, as on a "
                       "second backward through a graph that an earlier backward freed: to go through the graph "
                       "twice, run the first backward with retain_graph=True");
  auto dq = new_output(q.shape(), q.dtype(), q.place());
  auto dk = new_output(k.shape(), k.dtype(), k.place());
  auto dv = new_output(v.shape(), v.dtype(), v.place());
  auto dsink = sink ? new_output(sink_shape, paddle::DataType::FLOAT32, q.place())
                    : paddle::empty(sink_shape, paddle::DataType::FLOAT32, q.place());
  check_same_place(q, {{"k", &k}, {"v", &v}, {"startend_row_indices", &startend_row_indices},
                       {"block_mask", block_mask ? &*block_mask : nullptr},
                       {"learnable_sink", sink ? &learnable_sink : nullptr}, {"out", &out},
                       {"softmax_lse", &softmax_lse}, {"out_grad", &out_grad}});
  fm3::GradTensors g{arg("out_grad", out_grad), arg("q_grad", dq), arg("k_grad", dk), arg("v_grad", dv)};
  if (sink) g.dlearnable_sink = arg("learnable_sink_grad", dsink);
  fm3_bwd_params bp;
  try {
    // deterministic: the GPU kernel's dQ order; the CPU kernel always is deterministic
    bp = fm3::fill_bwd_params(attn_tensors(q, k, v, startend_row_indices, block_mask, learnable_sink, out,
                                           softmax_lse), g, softmax_scale, causal, !q.is_cpu(), deterministic);
  } catch (const fm3::ArgError& e) {
    raise_arg_error(e);
  }
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

// The kernel of the grad ops of the gradients (backward.yaml): there is no second derivative, and
// differentiating a gradient taken with create_graph=True is an error (NotImplementedError), not a
// silent constant.
std::vector<paddle::Tensor> FlashmaskAttentionNoSecondDerivative(const paddle::Tensor&, const paddle::Tensor&,
                                                                 const paddle::Tensor&, const paddle::Tensor&,
                                                                 const paddle::Tensor&, const paddle::Tensor&) {
  PADDLE_THROW(::common::errors::Unimplemented(
      "paddle_fm3.flashmask_attention has no second derivative: a gradient taken with create_graph=True "
      "cannot be differentiated again (e.g. in a gradient penalty)"));
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
