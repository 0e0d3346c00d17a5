// pybind11 binding of the Hopper kernels' C ABI (ops/hopper/fm3_cuda.h) for
// any tensor that implements __dlpack__ (torch, paddle, cupy, jax; numpy for
// host-resident masks). Knows no framework: it reads DLPack capsules, checks
// shapes/dtypes/devices/strides (TypeError / ValueError naming the argument),
// fills fm3_fwd_params and calls fm3_cuda_fwd. Also binds the CPU CP planning
// kernel fm3_cpu_segment_workload (ops/cpu/segment_workload.cc, compiled in) on
// numpy arrays, so CP plans can be built where Paddle is absent.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cfloat>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fm3/mask.h"
#include "fm3/params.h"
#include "fm3_cuda.h"

namespace py = pybind11;

// DLPack (v0.8 ABI, unversioned capsule "dltensor"); only what is read here.
extern "C" {
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
}

namespace {

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

// A borrowed view of one argument; the capsule (and so the tensor) stays alive with it.
struct View {
  std::string name;
  py::object capsule;
  const DLTensor* t = nullptr;
  std::vector<int64_t> shape, strides;

  void* data() const { return static_cast<char*>(t->data) + t->byte_offset; }
  bool on_gpu() const { return t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged; }
  bool on_host() const { return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost; }
  std::string shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
  bool contiguous() const {
    int64_t expect = 1;
    for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
};

View view(const std::string& name, const py::object& obj) {
  if (!py::hasattr(obj, "__dlpack__"))
    throw py::type_error(name + " must implement __dlpack__ (a torch/paddle/cupy/numpy tensor), got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  View v;
  v.name = name;
  v.capsule = obj.attr("__dlpack__")();
  PyObject* cap = v.capsule.ptr();
  if (!PyCapsule_IsValid(cap, "dltensor"))
    throw py::type_error(name + ".__dlpack__() did not return an unconsumed 'dltensor' capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  v.t = &m->dl_tensor;
  v.shape.assign(v.t->shape, v.t->shape + v.t->ndim);
  v.strides.resize(v.t->ndim);
  int64_t s = 1;
  for (int i = v.t->ndim - 1; i >= 0; --i) {
    v.strides[i] = v.t->strides ? v.t->strides[i] : s;
    s *= v.shape[i];
  }
  return v;
}

fm3_dtype float_dtype(const View& v) {
  const DLDataType d = v.t->dtype;
  if (d.lanes == 1 && d.bits == 16 && d.code == kDLFloat) return FM3_FLOAT16;
  if (d.lanes == 1 && d.bits == 16 && d.code == kDLBfloat) return FM3_BFLOAT16;
  throw py::type_error(v.name + " must be float16 or bfloat16");
}

void expect_ndim(const View& v, int ndim, const char* layout) {
  if (v.t->ndim != ndim)
    throw py::value_error(v.name + " must be " + std::to_string(ndim) + "-D " + layout + ", got shape " + v.shape_str());
}

void expect_shape(const View& v, const std::vector<int64_t>& want, const char* layout) {
  if (v.shape != want) {
    View w;
    w.shape = want;
    throw py::value_error(v.name + " must have shape " + w.shape_str() + " " + layout + ", got " + v.shape_str());
  }
}

void expect_gpu(const View& v) {
  if (!v.on_gpu()) throw py::value_error(v.name + " must be a CUDA tensor");
}

void expect_int32(const View& v) {
  const DLDataType d = v.t->dtype;
  if (!(d.code == kDLInt && d.bits == 32 && d.lanes == 1)) throw py::type_error(v.name + " must be int32");
}

// An int32 mask argument (startend_row_indices, block_mask, block summary): int32 and contiguous.
void expect_int32_contiguous(const View& v) {
  expect_int32(v);
  if (!v.contiguous()) throw py::value_error(v.name + " must be contiguous");
}

// fm3_check_mask_shape (params.h) of a 4-D startend_row_indices; a negative expected size is not checked.
void expect_mask_shape(const int64_t* shape, int64_t batch, int64_t seqlen_k, int64_t num_heads, int64_t num_heads_k,
                       bool causal) {
  char err[256] = {0};
  if (fm3_check_mask_shape(shape, batch, seqlen_k, num_heads, num_heads_k, causal ? 1 : 0, err, sizeof err) != 0)
    throw py::value_error(err);
}

// A 4-D startend_row_indices whose dimensions must fit the C ABI's int.
void expect_mask_dims(const int64_t* shape) {
  for (int d = 0; d < 4; ++d)
    if (shape[d] < 1 || shape[d] > INT32_MAX)
      throw py::value_error("startend_row_indices dimensions must be in [1, 2^31 - 1], got dimension " +
                            std::to_string(d) + " = " + std::to_string(shape[d]));
}

// A float32 [num_heads] contiguous CUDA tensor: the learnable sink and its gradient.
void expect_sink(const View& v, int64_t num_heads) {
  if (!(v.t->dtype.code == kDLFloat && v.t->dtype.bits == 32 && v.t->dtype.lanes == 1))
    throw py::type_error(v.name + " must be float32");
  expect_shape(v, {num_heads}, "[num_heads]");
  if (!v.contiguous()) throw py::value_error(v.name + " must be contiguous");
  expect_gpu(v);
}

// An int32 mask argument: a device pointer, uploading host-resident ones for the call.
struct MaskArg {
  const int32_t* ptr = nullptr;
  void* owned = nullptr;
  void* stream = nullptr;
  ~MaskArg() {
    if (owned) {
      char err[256];
      fm3_cuda_free(owned, stream, err, sizeof err);
    }
  }
};

// v: checked by expect_int32_contiguous.
void stage_mask(const View& v, MaskArg& m, void* stream) {
  m.stream = stream;
  if (v.on_gpu()) {
    m.ptr = static_cast<const int32_t*>(v.data());
    return;
  }
  if (!v.on_host()) throw py::value_error(v.name + " must be a CUDA or host tensor");
  int64_t n = 1;
  for (int64_t d : v.shape) n *= d;
  char err[512] = {0};
  if (fm3_cuda_upload(v.data(), static_cast<size_t>(n) * 4, stream, &m.owned, err, sizeof err) != 0)
    throw std::runtime_error(std::string("fm3_cuda_upload: ") + err);
  m.ptr = static_cast<const int32_t*>(m.owned);
}

// What the forward and backward entries share: the views of q, k, v, out, lse, their checks, the
// staged masks and the forward params they fill. Built in place by prepare(); the staged masks
// (host uploads) live as long as it does, i.e. across the kernel call.
struct AttnCall {
  View q, k, v, out, lse, sink;
  MaskArg sri, bm;
  fm3_fwd_params p{};
};

// Checks every argument of one call (TypeError / ValueError naming it) and fills c.p.
// grads: the backward's {dout, dq, dk, dv} (empty for the forward), each checked like its
// counterpart {out, q, k, v} and required to share its strides (the C ABI has one set).
// block_n_of / kind: whether the head dims (q/k, v) have a kernel of this kind ("" or "backward ").
void prepare(AttnCall& c, py::object q_, py::object k_, py::object v_, py::object out_, py::object lse_,
             py::object sri_, py::object block_mask_, py::object sink_, bool causal, double softmax_scale, void* stream,
             const std::vector<const View*>& grads, int (*block_n_of)(int, int), const char* kind) {
  c.q = view("q", q_), c.k = view("k", k_), c.v = view("v", v_), c.out = view("out", out_), c.lse = view("lse", lse_);
  const View &q = c.q, &k = c.k, &v = c.v, &out = c.out, &lse = c.lse;
  const char* qlay = "[batch, seqlen_q, num_heads, head_dim]";
  const char* klay = "[batch, seqlen_k, num_heads_k, head_dim]";
  const char* vlay = "[batch, seqlen_k, num_heads_k, head_dim_v]";
  const char* olay = "[batch, seqlen_q, num_heads, head_dim_v]";
  expect_ndim(q, 4, qlay);
  expect_ndim(k, 4, klay);
  expect_ndim(v, 4, vlay);
  const int64_t B = q.shape[0], Sq = q.shape[1], H = q.shape[2], D = q.shape[3];
  const int64_t Sk = k.shape[1], Hk = k.shape[2], Dv = v.shape[3];
  expect_shape(k, {B, Sk, Hk, D}, klay);
  expect_shape(v, {B, Sk, Hk, Dv}, vlay);
  expect_shape(out, {B, Sq, H, Dv}, olay);
  const View* like[] = {&out, &q, &k, &v};  // grads[i] is shaped and strided like like[i]
  const char* like_lay[] = {olay, qlay, klay, vlay};
  for (size_t i = 0; i < grads.size(); ++i)
    expect_shape(*grads[i], like[i]->shape, like_lay[i]);
  expect_shape(lse, {B, H, Sq}, "[batch, num_heads, seqlen_q]");
  // Before any arithmetic on them (H % Hk) and before they are narrowed to the C ABI's int.
  const std::pair<const char*, int64_t> dims[] = {{"batch", B}, {"seqlen_q", Sq}, {"num_heads", H},
                                                  {"head_dim", D}, {"seqlen_k", Sk}, {"num_heads_k", Hk},
                                                  {"head_dim_v", Dv}};
  for (const auto& [dim, n] : dims)
    if (n < 1 || n > INT32_MAX)
      throw py::value_error(std::string("q, k, v: ") + dim + " must be in [1, 2^31 - 1], got " + std::to_string(n));
  std::vector<const View*> same_dtype = {&k, &v, &out}, gpu = {&q, &k, &v, &out, &lse}, unit = {&q, &k, &v, &out};
  for (const View* g : grads) same_dtype.push_back(g), gpu.push_back(g), unit.push_back(g);
  const fm3_dtype dt = float_dtype(q);
  for (const View* t : same_dtype)
    if (float_dtype(*t) != dt) throw py::type_error(t->name + " must have q's dtype");
  if (!(lse.t->dtype.code == kDLFloat && lse.t->dtype.bits == 32 && lse.t->dtype.lanes == 1))
    throw py::type_error("lse must be float32");
  for (const View* t : gpu) expect_gpu(*t);
  for (const View* t : unit)
    if (t->strides[3] != 1) throw py::value_error(t->name + " must have a unit stride in head_dim");
  if (!lse.contiguous()) throw py::value_error("lse must be contiguous");
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i]->strides != like[i]->strides)
      throw py::value_error(grads[i]->name + " must have the same strides as " + like[i]->name);
  if (H % Hk != 0)
    throw py::value_error("num_heads (" + std::to_string(H) + ") must be a multiple of num_heads_k (" + std::to_string(Hk) + ")");
  if (block_n_of(static_cast<int>(D), static_cast<int>(Dv)) == 0)
    throw py::value_error("head_dim " + std::to_string(D) + " (q, k) with head_dim_v " + std::to_string(Dv) +
                          " (v) has no sm90 " + kind + "kernel (see yaml/kernel_configs.yaml)");
  if (!(softmax_scale > 0 && softmax_scale <= FLT_MAX && static_cast<float>(softmax_scale) > 0))
    throw py::value_error("softmax_scale must be a finite float32 > 0, got " + std::to_string(softmax_scale));
  // What the kernels' 16-byte vector and TMA accesses need (the C ABI checks it too, as a RuntimeError).
  for (const View* t : unit) {
    if (reinterpret_cast<uintptr_t>(t->data()) % 16 != 0)
      throw py::value_error(t->name + " must be 16-byte aligned");
    for (int d = 0; d < 3; ++d)
      if (t->strides[d] % 8 != 0)
        throw py::value_error(t->name + "'s batch, row and head strides must be multiples of 8 elements, got strides " +
                              std::to_string(t->strides[0]) + ", " + std::to_string(t->strides[1]) + ", " +
                              std::to_string(t->strides[2]));
  }

  fm3_fwd_params& p = c.p;
  p.q = q.data(); p.k = k.data(); p.v = v.data(); p.out = out.data();
  p.softmax_lse = static_cast<float*>(lse.data());
  p.q_batch_stride = q.strides[0]; p.q_row_stride = q.strides[1]; p.q_head_stride = q.strides[2];
  p.k_batch_stride = k.strides[0]; p.k_row_stride = k.strides[1]; p.k_head_stride = k.strides[2];
  p.v_batch_stride = v.strides[0]; p.v_row_stride = v.strides[1]; p.v_head_stride = v.strides[2];
  p.o_batch_stride = out.strides[0]; p.o_row_stride = out.strides[1]; p.o_head_stride = out.strides[2];
  p.batch = static_cast<int>(B); p.seqlen_q = static_cast<int>(Sq); p.seqlen_k = static_cast<int>(Sk);
  p.num_heads = static_cast<int>(H); p.num_heads_k = static_cast<int>(Hk); p.head_dim = static_cast<int>(D);
  p.head_dim_v = static_cast<int>(Dv);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = causal ? 1 : 0;
  p.dtype = dt;
  p.stream = stream;
  p.mask_heads = 1;
  p.mask_cols = 0;
  if (!sink_.is_none()) {
    c.sink = view("learnable_sink", sink_);
    expect_sink(c.sink, H);
    p.learnable_sink = static_cast<const float*>(c.sink.data());
  }

  int64_t Hm = -1;
  View sri_view;
  if (!sri_.is_none()) {
    View s = view("startend_row_indices", sri_);
    expect_ndim(s, 4, "[batch, mask_heads, seqlen_k, C]");
    Hm = s.shape[1];
    const int64_t C = s.shape[3];
    expect_mask_shape(s.shape.data(), B, Sk, H, Hk, causal);
    expect_int32_contiguous(s);
    sri_view = std::move(s);
    p.mask_heads = static_cast<int>(Hm);
    p.mask_cols = static_cast<int>(C);
  }
  View bmv;
  if (!block_mask_.is_none()) {
    bmv = view("block_mask", block_mask_);
    expect_ndim(bmv, 4, "[batch, mask_heads, ceil(seqlen_q/128), ceil(seqlen_k/128)]");
    const int64_t want_h = Hm > 0 ? Hm : bmv.shape[1];
    if (Hm < 0 && want_h != 1 && want_h != Hk && want_h != H)
      throw py::value_error("block_mask.shape[1] must be 1, num_heads_k or num_heads");
    expect_shape(bmv, {B, want_h, fm3::block_mask_blocks(Sq), fm3::block_mask_blocks(Sk)},
                 "[batch, mask_heads, ceil(seqlen_q/128), ceil(seqlen_k/128)]");
    expect_int32_contiguous(bmv);
    p.mask_heads = static_cast<int>(want_h);
  }
  // Every argument is checked: now the (possibly host-resident) masks go to the device.
  if (sri_view.t) {
    stage_mask(sri_view, c.sri, stream);
    p.startend_row_indices = c.sri.ptr;
  }
  if (bmv.t) {
    stage_mask(bmv, c.bm, stream);
    p.block_mask = c.bm.ptr;
  }
}

void fwd(py::object q_, py::object k_, py::object v_, py::object sri_, py::object out_, py::object lse_,
         py::object block_mask_, py::object sink_, bool causal, double softmax_scale, uintptr_t stream_handle) {
  AttnCall c;
  prepare(c, q_, k_, v_, out_, lse_, sri_, block_mask_, sink_, causal, softmax_scale,
          reinterpret_cast<void*>(stream_handle), {}, fm3_cuda_block_n, "");
  char err[1024] = {0};
  if (fm3_cuda_fwd(&c.p, err, sizeof err) != 0) throw std::runtime_error(std::string("fm3_cuda_fwd: ") + err);
}

// Backward: the forward's checks (plus dout, dq, dk, dv) fill c and bp.
struct BwdCall {
  AttnCall c;
  View dsink;
  fm3_bwd_params bp{};
};

void prepare_bwd(BwdCall& b, py::object q_, py::object k_, py::object v_, py::object out_, py::object lse_,
                 py::object dout_, py::object sri_, py::object dq_, py::object dk_, py::object dv_,
                 py::object block_mask_, py::object sink_, py::object dsink_, bool causal, double softmax_scale,
                 bool deterministic, uintptr_t stream_handle) {
  View dout = view("dout", dout_), dq = view("dq", dq_), dk = view("dk", dk_), dv = view("dv", dv_);
  prepare(b.c, q_, k_, v_, out_, lse_, sri_, block_mask_, sink_, causal, softmax_scale,
          reinterpret_cast<void*>(stream_handle), {&dout, &dq, &dk, &dv}, fm3_cuda_bwd_block_n, "backward ");
  b.bp.fwd = b.c.p;
  b.bp.dout = dout.data();
  b.bp.dq = dq.data();
  b.bp.dk = dk.data();
  b.bp.dv = dv.data();
  b.bp.deterministic = deterministic ? 1 : 0;
  if (!dsink_.is_none()) {
    if (sink_.is_none()) throw py::value_error("dlearnable_sink needs learnable_sink (the sink the forward ran with)");
    b.dsink = view("dlearnable_sink", dsink_);
    expect_sink(b.dsink, b.c.q.shape[2]);
    b.bp.dlearnable_sink = static_cast<float*>(b.dsink.data());
  }
}

// The backward; workspace: None (the library's pool) or a contiguous uint8 tensor on the GPU of
// at least bwd_workspace_bytes, 256-byte aligned.
void bwd(py::object q_, py::object k_, py::object v_, py::object out_, py::object lse_, py::object dout_,
         py::object sri_, py::object dq_, py::object dk_, py::object dv_, py::object block_mask_,
         py::object sink_, py::object dsink_, bool causal, double softmax_scale, bool deterministic,
         uintptr_t stream_handle, py::object workspace_) {
  BwdCall b;
  prepare_bwd(b, q_, k_, v_, out_, lse_, dout_, sri_, dq_, dk_, dv_, block_mask_, sink_, dsink_, causal,
              softmax_scale, deterministic, stream_handle);
  View ws;
  if (!workspace_.is_none()) {
    ws = view("workspace", workspace_);
    expect_gpu(ws);
    if (!(ws.t->dtype.code == kDLUInt && ws.t->dtype.bits == 8 && ws.t->dtype.lanes == 1) || ws.shape.size() != 1 ||
        !ws.contiguous())
      throw py::type_error("workspace must be a contiguous 1-D uint8 tensor, got shape " + ws.shape_str());
    const size_t need = fm3_cuda_bwd_workspace_bytes(&b.bp);
    if (static_cast<size_t>(ws.shape[0]) < need || reinterpret_cast<uintptr_t>(ws.data()) % 256 != 0)
      throw py::value_error("workspace must hold at least " + std::to_string(need) +
                            " bytes (bwd_workspace_bytes) at a 256-byte aligned address, got " +
                            std::to_string(ws.shape[0]) + " bytes");
    b.bp.workspace = ws.data();
    b.bp.workspace_bytes = static_cast<size_t>(ws.shape[0]);
  }
  char err[1024] = {0};
  if (fm3_cuda_bwd(&b.bp, err, sizeof err) != 0) throw std::runtime_error(std::string("fm3_cuda_bwd: ") + err);
}

// The workspace bytes bwd with these arguments takes.
size_t bwd_workspace_bytes(py::object q_, py::object k_, py::object v_, py::object out_, py::object lse_,
                           py::object dout_, py::object sri_, py::object dq_, py::object dk_, py::object dv_,
                           py::object block_mask_, py::object sink_, py::object dsink_, bool causal,
                           double softmax_scale, bool deterministic, uintptr_t stream_handle) {
  BwdCall b;
  prepare_bwd(b, q_, k_, v_, out_, lse_, dout_, sri_, dq_, dk_, dv_, block_mask_, sink_, dsink_, causal,
              softmax_scale, deterministic, stream_handle);
  return fm3_cuda_bwd_workspace_bytes(&b.bp);
}

void release_workspace() {
  char err[512] = {0};
  if (fm3_cuda_release_workspace(err, sizeof err) != 0)
    throw std::runtime_error(std::string("fm3_cuda_release_workspace: ") + err);
}

void block_summary(py::object sri_, py::object out_, bool causal, int seqlen_q, int block_n, uintptr_t stream_handle) {
  View s = view("startend_row_indices", sri_), o = view("out", out_);
  expect_ndim(s, 4, "[batch, mask_heads, seqlen_k, C]");
  expect_gpu(s);
  expect_gpu(o);
  expect_int32_contiguous(s);
  expect_int32_contiguous(o);
  if (block_n < 1) throw py::value_error("block_n must be >= 1, got " + std::to_string(block_n));
  expect_mask_shape(s.shape.data(), -1, -1, -1, -1, causal);
  if (seqlen_q < 1) throw py::value_error("seqlen_q must be >= 1, got " + std::to_string(seqlen_q));
  expect_mask_dims(s.shape.data());
  const int64_t nb = (s.shape[2] + block_n - 1) / block_n;
  expect_shape(o, {s.shape[0], s.shape[1], nb, 8}, "[batch, mask_heads, ceil(seqlen_k/block_n), 8]");
  char err[1024] = {0};
  if (fm3_cuda_block_summary(static_cast<const int32_t*>(s.data()), static_cast<int>(s.shape[0]), static_cast<int>(s.shape[1]),
                             seqlen_q, static_cast<int>(s.shape[2]), static_cast<int>(s.shape[3]), causal ? 1 : 0, block_n,
                             static_cast<int32_t*>(o.data()), reinterpret_cast<void*>(stream_handle), err, sizeof err) != 0)
    throw std::runtime_error(std::string("fm3_cuda_block_summary: ") + err);
}

// CP workload summary on the host (the fm3_segment_workload op's kernel): (weights int64 [n],
// needed int32 [n, n]) with n = seqlen / segment_size.
py::tuple segment_workload(py::array_t<int32_t, py::array::c_style | py::array::forcecast> sri, int segment_size,
                           int tile, bool causal) {
  if (sri.ndim() != 4)
    throw py::value_error("startend_row_indices must be 4-D [batch, mask_heads, seqlen, C], got " +
                          std::to_string(sri.ndim()) + "-D");
  const int64_t C = sri.shape(3);
  const int64_t shape[4] = {sri.shape(0), sri.shape(1), sri.shape(2), sri.shape(3)};
  expect_mask_shape(shape, -1, -1, -1, -1, causal);
  if (segment_size < 1) throw py::value_error("segment_size must be positive, got " + std::to_string(segment_size));
  expect_mask_dims(shape);
  const int64_t n = sri.shape(2) / segment_size;
  py::array_t<int64_t> weights(n);
  py::array_t<int32_t> needed({n, n});
  char err[512] = {0};
  int rc;
  {
    py::gil_scoped_release release;
    rc = fm3_cpu_segment_workload(sri.data(), static_cast<int>(sri.shape(0)), static_cast<int>(sri.shape(1)),
                                  static_cast<int>(sri.shape(2)), static_cast<int>(C), causal ? 1 : 0, tile,
                                  segment_size, weights.mutable_data(), needed.mutable_data(), err, sizeof err);
  }
  if (rc != 0) throw py::value_error(std::string("fm3_cpu_segment_workload: ") + err);
  return py::make_tuple(weights, needed);
}

}  // namespace

PYBIND11_MODULE(_fm3_dlpack, m) {
  m.doc() = "DLPack binding of the FlashMask Hopper kernels (libfm3_cuda.so)";
  m.def("fwd", &fwd, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("startend_row_indices"), py::arg("out"),
        py::arg("lse"), py::arg("block_mask"), py::arg("learnable_sink"), py::arg("causal"), py::arg("softmax_scale"),
        py::arg("stream"));
  m.def("block_summary", &block_summary, py::arg("startend_row_indices"), py::arg("out"), py::arg("causal"),
        py::arg("seqlen_q"), py::arg("block_n"), py::arg("stream"));
  m.def("block_n", &fm3_cuda_block_n, py::arg("head_dim"), py::arg("head_dim_v"));
  m.def("bwd", &bwd, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("dout"),
        py::arg("startend_row_indices"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("block_mask"),
        py::arg("learnable_sink"), py::arg("dlearnable_sink"), py::arg("causal"), py::arg("softmax_scale"),
        py::arg("deterministic"), py::arg("stream"), py::arg("workspace") = py::none());
  m.def("bwd_workspace_bytes", &bwd_workspace_bytes, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("dout"), py::arg("startend_row_indices"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
        py::arg("block_mask"), py::arg("learnable_sink"), py::arg("dlearnable_sink"), py::arg("causal"),
        py::arg("softmax_scale"), py::arg("deterministic"), py::arg("stream"));
  m.def("release_workspace", &release_workspace);
  m.def("bwd_block_n", &fm3_cuda_bwd_block_n, py::arg("head_dim"), py::arg("head_dim_v"));
  m.def("segment_workload", &segment_workload, py::arg("startend_row_indices"), py::arg("segment_size"),
        py::arg("tile"), py::arg("causal"));
}
