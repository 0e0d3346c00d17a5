// pybind11 binding of the Hopper kernels' C ABI (ops/hopper/fm3_cuda.h) for
// any tensor that implements __dlpack__ (torch, paddle, cupy, jax; numpy for
// host-resident masks). Knows no framework: it reads DLPack capsules, maps them
// onto fm3_fwd_params with the filler the Paddle op shares (fm3/fill_params.h),
// checks where they live, runs the Hopper entries' own check (check_attn_params)
// so that every argument error is a TypeError / ValueError naming the argument
// before anything reaches the GPU, and calls fm3_cuda_fwd / fm3_cuda_bwd. Also
// binds the CPU CP planning kernel fm3_cpu_segment_workload
// (ops/cpu/segment_workload.cc, compiled in) on numpy arrays, so CP plans can be
// built where Paddle is absent.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn_checks.h"
#include "fm3/fill_params.h"
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
  fm3::Elem elem() const {
    const DLDataType d = t->dtype;
    if (d.lanes != 1) return fm3::Elem::kOther;
    if (d.code == kDLFloat && d.bits == 32) return fm3::Elem::kFloat32;
    if (d.code == kDLFloat && d.bits == 16) return fm3::Elem::kFloat16;
    if (d.code == kDLBfloat && d.bits == 16) return fm3::Elem::kBFloat16;
    if (d.code == kDLInt && d.bits == 32) return fm3::Elem::kInt32;
    return fm3::Elem::kOther;
  }
  // The filler's view of it.
  fm3::TensorArg arg() const { return {name, data(), shape, strides, elem()}; }
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

std::optional<View> optional_view(const std::string& name, const py::object& obj) {
  if (obj.is_none()) return std::nullopt;
  return view(name, obj);
}

void expect_gpu(const View& v) {
  if (!v.on_gpu()) throw py::value_error(v.name + " must be a CUDA tensor");
}

// An argument of the C ABI's own checks (attn_checks.h), raised as ValueError.
void expect_ok(int rc, const char* err) {
  if (rc != 0) throw py::value_error(err);
}

// softmax_scale as the params' float: out of float's range, inf (or NaN), which the params' check rejects.
float scale_of(double s) {
  return std::fabs(s) <= FLT_MAX ? static_cast<float>(s) : s > 0 ? INFINITY : s < 0 ? -INFINITY : NAN;
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

// v: on the GPU or the host (checked), int32 and contiguous (the filler checked).
void stage_mask(const View& v, MaskArg& m, void* stream) {
  m.stream = stream;
  if (v.on_gpu()) {
    m.ptr = static_cast<const int32_t*>(v.data());
    return;
  }
  int64_t n = 1;
  for (int64_t d : v.shape) n *= d;
  char err[512] = {0};
  if (fm3_cuda_upload(v.data(), static_cast<size_t>(n) * 4, stream, &m.owned, err, sizeof err) != 0)
    throw std::runtime_error(std::string("fm3_cuda_upload: ") + err);
  m.ptr = static_cast<const int32_t*>(m.owned);
}

// What the forward and backward entries share: the views of their forward arguments and the staged
// masks, which (host uploads) live as long as it does, i.e. across the kernel call.
struct AttnCall {
  View q, k, v, out, lse;
  std::optional<View> sri, bm, sink;
  MaskArg sri_staged, bm_staged;

  AttnCall(const py::object& q_, const py::object& k_, const py::object& v_, const py::object& out_,
           const py::object& lse_, const py::object& sri_, const py::object& bm_, const py::object& sink_)
      : q(view("q", q_)), k(view("k", k_)), v(view("v", v_)), out(view("out", out_)), lse(view("lse", lse_)),
        sri(optional_view("startend_row_indices", sri_)), bm(optional_view("block_mask", bm_)),
        sink(optional_view("learnable_sink", sink_)) {}

  fm3::AttnTensors tensors() const {
    fm3::AttnTensors t{q.arg(), k.arg(), v.arg(), out.arg(), lse.arg()};
    if (sri) t.startend_row_indices = sri->arg();
    if (bm) t.block_mask = bm->arg();
    if (sink) t.learnable_sink = sink->arg();
    return t;
  }

  // Where the tensors live: the kernels' on the GPU (more: the backward's), the masks on the GPU or
  // the host (uploaded for the call).
  void expect_devices(const std::vector<const View*>& more) const {
    std::vector<const View*> gpu = {&q, &k, &v, &out, &lse};
    if (sink) gpu.push_back(&*sink);
    gpu.insert(gpu.end(), more.begin(), more.end());
    for (const View* t : gpu) expect_gpu(*t);
    for (const std::optional<View>* m : {&sri, &bm})
      if (*m && !(*m)->on_gpu() && !(*m)->on_host())
        throw py::value_error((*m)->name + " must be a CUDA or host tensor");
  }

  // Every argument is checked: now the (possibly host-resident) masks go to the device.
  void stage_masks(fm3_fwd_params& p, void* stream) {
    p.stream = stream;
    if (sri) {
      stage_mask(*sri, sri_staged, stream);
      p.startend_row_indices = sri_staged.ptr;
    }
    if (bm) {
      stage_mask(*bm, bm_staged, stream);
      p.block_mask = bm_staged.ptr;
    }
  }
};

void fwd(py::object q_, py::object k_, py::object v_, py::object sri_, py::object out_, py::object lse_,
         py::object block_mask_, py::object sink_, bool causal, double softmax_scale, uintptr_t stream_handle) {
  AttnCall c(q_, k_, v_, out_, lse_, sri_, block_mask_, sink_);
  fm3_fwd_params p = fm3::fill_fwd_params(c.tensors(), scale_of(softmax_scale), causal, /*gpu=*/true);
  c.expect_devices({});
  char err[1024] = {0};
  expect_ok(fm3::hopper::check_attn_params(&p, fm3_cuda_block_n(p.head_dim, p.head_dim_v) != 0, err, sizeof err), err);
  c.stage_masks(p, reinterpret_cast<void*>(stream_handle));
  if (fm3_cuda_fwd(&p, err, sizeof err) != 0) throw std::runtime_error(std::string("fm3_cuda_fwd: ") + err);
}

// Backward: the forward's arguments, and dout, dq, dk, dv (and the sink's gradient) in bp.
struct BwdCall {
  View dout, dq, dk, dv;
  std::optional<View> dsink;
  AttnCall c;
  fm3_bwd_params bp{};

  BwdCall(py::object q_, py::object k_, py::object v_, py::object out_, py::object lse_, py::object dout_,
          py::object sri_, py::object dq_, py::object dk_, py::object dv_, py::object block_mask_, py::object sink_,
          py::object dsink_, bool causal, double softmax_scale, bool deterministic, uintptr_t stream_handle)
      : dout(view("dout", dout_)), dq(view("dq", dq_)), dk(view("dk", dk_)), dv(view("dv", dv_)),
        dsink(optional_view("dlearnable_sink", dsink_)), c(q_, k_, v_, out_, lse_, sri_, block_mask_, sink_) {
    fm3::GradTensors g{dout.arg(), dq.arg(), dk.arg(), dv.arg()};
    if (dsink) g.dlearnable_sink = dsink->arg();
    bp = fm3::fill_bwd_params(c.tensors(), g, scale_of(softmax_scale), causal, /*gpu=*/true, deterministic);
    std::vector<const View*> more = {&dout, &dq, &dk, &dv};
    if (dsink) more.push_back(&*dsink);
    c.expect_devices(more);
    char err[1024] = {0};
    const int has_config = fm3_cuda_bwd_block_n(bp.fwd.head_dim, bp.fwd.head_dim_v) != 0;
    expect_ok(fm3::hopper::check_attn_params(&bp.fwd, has_config, err, sizeof err), err);
    expect_ok(fm3::hopper::check_attn_grads(&bp, err, sizeof err), err);
    c.stage_masks(bp.fwd, reinterpret_cast<void*>(stream_handle));
  }
};

// The backward; workspace: None (the library's pool) or a contiguous uint8 tensor on the GPU of
// at least bwd_workspace_bytes, 256-byte aligned.
void bwd(py::object q_, py::object k_, py::object v_, py::object out_, py::object lse_, py::object dout_,
         py::object sri_, py::object dq_, py::object dk_, py::object dv_, py::object block_mask_,
         py::object sink_, py::object dsink_, bool causal, double softmax_scale, bool deterministic,
         uintptr_t stream_handle, py::object workspace_) {
  BwdCall b(q_, k_, v_, out_, lse_, dout_, sri_, dq_, dk_, dv_, block_mask_, sink_, dsink_, causal, softmax_scale,
            deterministic, stream_handle);
  View ws;
  if (!workspace_.is_none()) {
    ws = view("workspace", workspace_);
    expect_gpu(ws);
    if (!(ws.t->dtype.code == kDLUInt && ws.t->dtype.bits == 8 && ws.t->dtype.lanes == 1) || ws.shape.size() != 1 ||
        (ws.shape[0] != 1 && ws.strides[0] != 1))
      throw py::type_error("workspace must be a contiguous 1-D uint8 tensor, got shape " + fm3::shape_str(ws.shape));
    // The C ABI checks this too (as a failed call): here it is a ValueError before anything runs.
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
  BwdCall b(q_, k_, v_, out_, lse_, dout_, sri_, dq_, dk_, dv_, block_mask_, sink_, dsink_, causal, softmax_scale,
            deterministic, stream_handle);
  return fm3_cuda_bwd_workspace_bytes(&b.bp);
}

void release_workspace() {
  char err[512] = {0};
  if (fm3_cuda_release_workspace(err, sizeof err) != 0)
    throw std::runtime_error(std::string("fm3_cuda_release_workspace: ") + err);
}

// The mask's C against causal (fm3_check_mask_shape, params.h), for the entries that take a mask
// alone; a ValueError before the C entry computes with it.
void expect_mask_cols(const int64_t* shape, bool causal) {
  char err[256] = {0};
  if (fm3_check_mask_shape(shape, -1, -1, -1, -1, causal ? 1 : 0, err, sizeof err) != 0) throw py::value_error(err);
}

// A 4-D startend_row_indices whose dimensions must fit the C ABI's int.
void expect_mask_dims(const int64_t* shape) {
  for (int d = 0; d < 4; ++d)
    if (shape[d] < 1 || shape[d] > INT32_MAX)
      throw py::value_error("startend_row_indices dimensions must be in [1, 2^31 - 1], got dimension " +
                            std::to_string(d) + " = " + std::to_string(shape[d]));
}

void block_summary(py::object sri_, py::object out_, bool causal, int seqlen_q, int block_n, uintptr_t stream_handle) {
  View s = view("startend_row_indices", sri_), o = view("out", out_);
  fm3::expect_mask(s.arg(), "[batch, mask_heads, seqlen_k, C]");
  expect_gpu(s);
  expect_gpu(o);
  fm3::expect_elem(o.arg(), fm3::Elem::kInt32, "int32");
  fm3::expect_contiguous(o.arg());
  if (block_n < 1) throw py::value_error("block_n must be >= 1, got " + std::to_string(block_n));  // divides below
  expect_mask_cols(s.shape.data(), causal);
  if (seqlen_q < 1) throw py::value_error("seqlen_q must be >= 1, got " + std::to_string(seqlen_q));
  expect_mask_dims(s.shape.data());
  const int64_t nb = (s.shape[2] + block_n - 1) / block_n;
  fm3::expect_shape(o.arg(), {s.shape[0], s.shape[1], nb, 8}, "[batch, mask_heads, ceil(seqlen_k/block_n), 8]");
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
  expect_mask_cols(shape, causal);
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
  // The filler's argument errors (fm3/fill_params.h) as Python's.
  py::register_exception_translator([](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const fm3::ArgError& a) {
      PyErr_SetString(a.type ? PyExc_TypeError : PyExc_ValueError, a.what());
    }
  });
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
