"""The DLPack binding's argument checks (ops/dlpack/fm3_dlpack.cc), on CPU: every check before the
device check runs on numpy arrays, and the later ones on numpy arrays whose capsule claims CUDA
(CudaTagged), so CI (which builds the module, no GPU) guards the error each bad argument gets in
the forward and the backward entry. The kernels themselves: tests/gpu."""
import ctypes

import numpy as np
import pytest

from paddle_fm3 import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="paddle_fm3.kernels not built "
                                "(scripts/run_tests.sh builds it into the installed package)")

B, S, H, D = 1, 64, 2, 64


def t(*shape, dtype=np.float16):
    return np.zeros(shape, dtype)


def good():
    return dict(q=t(B, S, H, D), k=t(B, S, H, D), v=t(B, S, H, D), out=t(B, S, H, D),
                lse=t(B, H, S, dtype=np.float32), dout=t(B, S, H, D), dq=t(B, S, H, D), dk=t(B, S, H, D),
                dv=t(B, S, H, D))


def fwd(**kw):
    a = {**good(), **kw}
    kernels._ext().fwd(a["q"], a["k"], a["v"], None, a["out"], a["lse"], None, None, True, 0.1, 0)


def bwd(**kw):
    a = {**good(), **kw}
    kernels._ext().bwd(a["q"], a["k"], a["v"], a["out"], a["lse"], a["dout"], None, a["dq"], a["dk"], a["dv"],
                       None, None, None, True, 0.1, False, 0)


CASES = [
    (dict(q=t(B, S, H)), ValueError, r"q must be 4-D \[batch, seqlen_q, num_heads, head_dim\]"),
    (dict(k=t(B, S, H, 32)), ValueError, r"k must have shape \[1, 64, 2, 64\]"),
    (dict(out=t(B, S, 1, D)), ValueError, r"out must have shape \[1, 64, 2, 64\]"),
    (dict(lse=t(B, H, 3, dtype=np.float32)), ValueError, r"lse must have shape \[1, 2, 64\]"),
    (dict(k=t(B, S, H, D, dtype=np.int8)), TypeError, "k must be float16 or bfloat16"),
    (dict(lse=t(B, H, S, dtype=np.float64)), TypeError, "lse must be float32"),
    # zero kv heads: once a division by zero (SIGFPE) in the H % Hk check
    (dict(k=t(B, S, 0, D), v=t(B, S, 0, D), dk=t(B, S, 0, D), dv=t(B, S, 0, D)), ValueError,
     r"num_heads_k must be >= 1, got 0"),
    # a dimension past int32 (a stride-0 view): once narrowed silently to 128 for the C ABI
    (dict(k=np.lib.stride_tricks.as_strided(t(1), (B, 2**32 + S, H, D), (0, 0, 0, 0)),
          v=np.lib.stride_tricks.as_strided(t(1), (B, 2**32 + S, H, D), (0, 0, 0, 0)),
          dk=np.lib.stride_tricks.as_strided(t(1), (B, 2**32 + S, H, D), (0, 0, 0, 0)),
          dv=np.lib.stride_tricks.as_strided(t(1), (B, 2**32 + S, H, D), (0, 0, 0, 0))),
     ValueError, r"seqlen_k must be <= 2147483647, got 4294967360"),
    ({}, ValueError, "q must be a CUDA tensor"),
]
BWD_ONLY = [
    (dict(dq=t(B, S, 1, D)), ValueError, r"dq must have shape \[1, 64, 2, 64\] \[batch, seqlen_q"),
    (dict(dk=t(B, 3, H, D)), ValueError, r"dk must have shape \[1, 64, 2, 64\] \[batch, seqlen_k"),
    (dict(dout=t(B, S, H, D, dtype=np.int8)), TypeError, "dout must be float16 or bfloat16"),
    # a gradient's shape is checked before lse's
    (dict(lse=t(B, H, 3, dtype=np.float32), dq=t(B, S, 1, D)), ValueError, "dq must have shape"),
]


@pytest.mark.parametrize("kw,exc,match", CASES)
def test_forward_argument_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        fwd(**kw)


@pytest.mark.parametrize("kw,exc,match", CASES + BWD_ONLY)
def test_backward_argument_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        bwd(**kw)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(softmax_scale=float("inf")), ValueError, "softmax_scale must be a finite float32 > 0"),
    (dict(softmax_scale=1e39), ValueError, "softmax_scale must be a finite float32 > 0"),
    (dict(causal="False"), TypeError, "causal must be a bool"),
    (dict(stream=2**64), TypeError, "stream must be a non-negative int"),
])
def test_python_entry_errors(kw, exc, match):
    a = good()
    with pytest.raises(exc, match=match):
        kernels.flashmask_fwd(a["q"], a["k"], a["v"], None, a["out"], a["lse"], **{"causal": True, **kw})


def test_head_dim_zero_is_a_value_error():
    """Once a ZeroDivisionError from the default scale D ** -0.5."""
    z = t(B, S, H, 0)
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        kernels.flashmask_fwd(z, z, z, None, z, t(B, H, S, dtype=np.float32), causal=True)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(block_n=0), ValueError, "block_n must be >= 1"),  # once a SIGFPE
    (dict(seqlen_q=0), ValueError, "seqlen_q must be >= 1"),
    (dict(causal="False"), TypeError, "causal must be a bool"),  # once read as True
])
def test_block_summary_errors(kw, exc, match):
    sri, out = t(1, 1, S, 1, dtype=np.int32), t(1, 1, 1, 8, dtype=np.int32)
    with pytest.raises(exc, match=match):
        kernels.block_summary(sri, out, **{"causal": True, "seqlen_q": S, "block_n": 64, **kw})


def test_block_n_queries():
    assert kernels.block_n(128) > 0 and kernels.bwd_block_n(128) > 0 and kernels.block_n(7) == 0
    # Head-dim pairs: MLA's (192, 128) has kernels, a value head dim of its own elsewhere has none.
    assert kernels.block_n(192, 128) > 0 and kernels.bwd_block_n(192, 128) > 0
    assert kernels.block_n(128, 96) == 0 and kernels.bwd_block_n(128, 96) == 0
    assert kernels.block_n(96) == kernels.block_n(96, 96) > 0
    with pytest.raises(ValueError, match="head_dim must be <= 2147483647"):  # once a pybind11 TypeError
        kernels.block_n(2**40)
    with pytest.raises(TypeError, match="head_dim must be an integer"):
        kernels.bwd_block_n(1.5)


class CudaTagged:
    """A numpy array whose DLPack capsule claims device CUDA, to reach the checks that run after the
    device check (nothing is ever launched: every case below fails before any CUDA call)."""

    class _DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    def __init__(self, arr):
        self.arr, self.shape = arr, arr.shape

    def __dlpack__(self, *args, **kwargs):
        cap = self.arr.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        # DLTensor: void* data, then DLDevice {int32 device_type, int32 device_id}
        dev = self._DLDevice.from_address(get(cap, b"dltensor") + ctypes.sizeof(ctypes.c_void_p))
        dev.device_type = 2  # kDLCUDA
        return cap

    def __dlpack_device__(self):
        return (2, 0)


def test_block_summary_checks_mask_columns_against_causal():
    """C=1 with causal=False once reached the kernel, which reads 4 columns per key (out of bounds)."""
    sri, out = CudaTagged(t(1, 1, S, 1, dtype=np.int32)), CudaTagged(t(1, 1, 1, 8, dtype=np.int32))
    with pytest.raises(ValueError, match=r"shape\[3\]: with causal=False the last dimension C must be one of"):
        kernels.block_summary(sri, out, causal=False, seqlen_q=S, block_n=64)


def test_misaligned_rows_are_value_errors():
    """Strides that are not multiples of 8 once failed only in the C ABI (RuntimeError)."""
    a = good()
    q = CudaTagged(np.zeros((B, S, H, D + 4), np.float16)[..., :D])
    cuda = {n: CudaTagged(x) for n, x in a.items()}
    with pytest.raises(ValueError, match="strides must be multiples of 8"):
        kernels.flashmask_fwd(q, cuda["k"], cuda["v"], None, cuda["out"], cuda["lse"], causal=True)
    with pytest.raises(ValueError, match="softmax_scale must be a finite float32 > 0"):  # 0 once cast to float32
        kernels.flashmask_fwd(cuda["q"], cuda["k"], cuda["v"], None, cuda["out"], cuda["lse"], causal=True,
                              softmax_scale=1e-300)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(learnable_sink=CudaTagged(t(H, dtype=np.float16))), TypeError, "learnable_sink must be float32"),
    (dict(learnable_sink=CudaTagged(t(H + 1, dtype=np.float32))), ValueError,
     r"learnable_sink must have shape \[num_heads=2\] \(one logit per query head\), got \[3\]"),
    (dict(learnable_sink=CudaTagged(t(1, H, dtype=np.float32))), ValueError, "learnable_sink must have shape"),
    (dict(learnable_sink=CudaTagged(t(2 * H, dtype=np.float32)[::2])), ValueError,
     "learnable_sink must be contiguous"),
    (dict(learnable_sink=t(H, dtype=np.float32)), ValueError, "learnable_sink must be a CUDA tensor"),
    (dict(learnable_sink=[0.0, 1.0]), TypeError, "learnable_sink must implement __dlpack__"),
    (dict(dlearnable_sink=CudaTagged(t(H, dtype=np.float32))), ValueError, "dlearnable_sink needs learnable_sink"),
    (dict(learnable_sink=CudaTagged(t(H, dtype=np.float32)), dlearnable_sink=CudaTagged(t(H, dtype=np.float64))),
     TypeError, "dlearnable_sink must be float32"),
    (dict(learnable_sink=CudaTagged(t(H, dtype=np.float32)), dlearnable_sink=CudaTagged(t(1, dtype=np.float32))),
     ValueError, "dlearnable_sink must have shape"),
])
def test_sink_argument_errors(kw, exc, match):
    """The learnable sink and its gradient, checked before any CUDA call (the other tensors pass)."""
    cuda = {n: CudaTagged(x) for n, x in good().items()}
    if "dlearnable_sink" not in kw:  # the forward takes the sink alone
        with pytest.raises(exc, match=match):
            kernels.flashmask_fwd(cuda["q"], cuda["k"], cuda["v"], None, cuda["out"], cuda["lse"], causal=True, **kw)
    with pytest.raises(exc, match=match):
        kernels.flashmask_bwd(cuda["q"], cuda["k"], cuda["v"], cuda["out"], cuda["lse"], cuda["dout"], None,
                              cuda["dq"], cuda["dk"], cuda["dv"], causal=True, **kw)
