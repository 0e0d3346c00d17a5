"""Framework-neutral entry to the Hopper (sm90a) FlashMask kernels, through DLPack.

Every tensor argument is any object implementing ``__dlpack__`` (torch, paddle, cupy, jax);
``startend_row_indices`` / ``block_mask`` may also be host arrays (numpy), uploaded for the call.
The compiled pieces are ``libfm3_cuda.so`` (the kernels behind the C ABI of
``ops/hopper/fm3_cuda.h``) and the pybind11 module ``_fm3_dlpack`` beside this file, built by
``scripts/gpu_build.sh`` and ``scripts/build_dlpack_ext.sh``. The module also carries the CPU
kernel of CP planning, which runs without a GPU (its entry: :func:`paddle_fm3.distributed.plan.segment_workload`).
Importing this package needs neither Paddle nor the compiled module; calling a kernel needs the
module (else ``ImportError`` saying how to build it).

Algorithm: FlashAttention-2 online softmax (Dao, 2023) with FlashMask block skipping
(Wang et al., arXiv:2410.01359, section 4).
"""

from __future__ import annotations

import importlib
from typing import Optional

from .. import _checks, mask_builders  # numpy only: importing them needs no Paddle

__all__ = ["flashmask_fwd", "flashmask_bwd", "bwd_workspace_bytes", "release_workspace", "block_summary", "block_n",
           "bwd_block_n", "available"]

_EXT = None


def _ext():
    global _EXT
    if _EXT is None:
        try:
            _EXT = importlib.import_module("._fm3_dlpack", __name__)
        except ImportError as e:  # pragma: no cover - depends on the build
            raise ImportError(
                "paddle_fm3.kernels: the compiled module _fm3_dlpack is not built; run "
                "scripts/gpu_build.sh && scripts/build_dlpack_ext.sh on a machine with nvcc "
                f"and pybind11 ({e})") from e
    return _EXT


def available() -> bool:
    """True if the compiled module (and libfm3_cuda.so) can be loaded."""
    try:
        _ext()
        return True
    except ImportError:
        return False


def block_n(head_dim: int, head_dim_v: Optional[int] = None) -> int:
    """Key-block width (columns) the forward kernel uses for head dims ``head_dim`` (q, k) and
    ``head_dim_v`` (v; default ``head_dim``); 0 if unsupported."""
    return int(_ext().block_n(*_head_dims(head_dim, head_dim_v)))


def _head_dim(head_dim) -> int:
    return _checks.check_int("head_dim", head_dim, lo=0, hi=_checks.MAX_SEQLEN)


def _head_dims(head_dim, head_dim_v) -> tuple:
    """(head_dim, head_dim_v) checked, head_dim_v defaulting to head_dim (the block-width queries)."""
    d = _head_dim(head_dim)
    return d, (d if head_dim_v is None else _head_dim(head_dim_v))


def _shape(name, x, layout):
    """The shape of a 4-D tensor argument that this module reads (for the defaults it computes)."""
    if not hasattr(x, "__dlpack__") or getattr(x, "shape", None) is None:
        raise TypeError(f"{name} must implement __dlpack__ (a torch/paddle/cupy/numpy tensor), got "
                        f"{type(x).__name__}")
    shape = tuple(int(s) for s in x.shape)
    _checks.check_rank(name, shape, 4, layout)
    return shape


def _common_args(q, k, startend_row_indices, causal, softmax_scale, window_size, stream):
    """The Python arguments of the forward and backward entries, checked (``_checks``), and the
    defaults that need q's (and with a window k's) shape: returns (startend_row_indices, causal,
    scale), the window converted to startend_row_indices as Paddle does. The tensors themselves are
    checked by the binding (ops/include/fm3/fill_params.h, then the C ABI's check_attn_params)."""
    causal = _checks.check_bool("causal", causal)
    _checks.check_stream(stream)
    qs = _shape("q", q, "[batch, seqlen_q, num_heads, head_dim]")
    softmax_scale = _checks.check_softmax_scale(softmax_scale, qs[3])
    if window_size is not None:
        window = _checks.check_window_size(window_size, startend_row_indices)
        ks = _shape("k", k, "[batch, seqlen_k, num_heads_k, head_dim]")
        startend_row_indices = mask_builders.window_to_startend(window, qs[1], ks[1], qs[0], causal)
    return startend_row_indices, causal, softmax_scale


def flashmask_fwd(q, k, v, startend_row_indices, out, lse, *, causal: bool,
                  softmax_scale: Optional[float] = None, window_size=None, block_mask=None,
                  learnable_sink=None, stream: int = 0) -> None:
    """FlashMask attention forward on the GPU, written into caller-allocated ``out`` and ``lse``.

    Args:
        q: ``[B, S_q, H, D]`` float16/bfloat16 CUDA tensor, unit stride in ``D``; other strides
            multiples of 8 elements. ``(D, D_v)`` one of the sm90 configs of
            ``yaml/kernel_configs.yaml`` (``_config.SM90_HEAD_DIMS``: 64, 80, 96, 128, 192, 256, and
            the MLA pair D = 192, D_v = 128).
        k: ``[B, S_k, H_k, D]``, same dtype, ``H % H_k == 0`` (GQA/MQA); v: ``[B, S_k, H_k, D_v]``.
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` (``H_mask in {1, H_k, H}``; C = 1|2
            if causal, 2|4 otherwise; see :mod:`paddle_fm3.masks`), or None (no mask beyond
            ``causal``, or the mask of ``window_size``).
        out: ``[B, S_q, H, D_v]``, q's dtype, written.
        lse: float32 contiguous ``[B, H, S_q]``, written: natural-log log-sum-exp (including the
            sink's ``exp(learnable_sink[h])``); ``-inf`` for a row with no visible key and no sink
            (its ``out`` row is 0).
        causal: causal flag (bottom-right aligned when ``S_q != S_k``).
        softmax_scale: default ``D ** -0.5``; must be > 0.
        window_size: int or (left, right); converted with :func:`paddle_fm3.masks.window_to_startend`
            (Paddle's rule); only when ``startend_row_indices`` is None.
        block_mask: optional int32 ``[B, H_mask, ceil(S_q/128), ceil(S_k/128)]``, 1 = keep.
        learnable_sink: optional float32 contiguous CUDA ``[H]``: one sink logit per query head, a
            virtual key of that score (the scaled scores' units) and value 0 in every row's
            softmax (gpt-oss; :mod:`paddle_fm3.reference` defines it).
        stream: raw ``cudaStream_t`` handle (int); 0 = the default stream.

    Raises:
        TypeError: non-tensor argument, wrong dtype, non-bool ``causal``.
        ValueError: shapes, strides, devices, head_dim or scale out of contract.
        RuntimeError: a CUDA error from the kernel launch.
    """
    startend_row_indices, causal, softmax_scale = _common_args(
        q, k, startend_row_indices, causal, softmax_scale, window_size, stream)
    _ext().fwd(q, k, v, startend_row_indices, out, lse, block_mask, learnable_sink, causal, softmax_scale,
               int(stream))


def bwd_block_n(head_dim: int, head_dim_v: Optional[int] = None) -> int:
    """Key-block width (columns per CTA) of the backward kernel for head dims ``head_dim`` and
    ``head_dim_v`` (default ``head_dim``); 0 if unsupported."""
    return int(_ext().bwd_block_n(*_head_dims(head_dim, head_dim_v)))


def flashmask_bwd(q, k, v, out, lse, dout, startend_row_indices, dq, dk, dv, *, causal: bool,
                  softmax_scale: Optional[float] = None, window_size=None, block_mask=None,
                  learnable_sink=None, dlearnable_sink=None, deterministic: bool = False, stream: int = 0,
                  workspace=None) -> None:
    """FlashMask attention backward on the GPU, written into caller-allocated ``dq``, ``dk``, ``dv``.

    Column-parallel FlashAttention-2 backward (Dao, 2023, Alg. 2) with FlashMask block skipping
    (Wang et al., arXiv:2410.01359, section 4.2): fully masked (query tile, key block) pairs are
    never loaded, partial ones are masked per element, dK/dV accumulate on chip (summed over the
    query heads of a GQA group), dQ accumulates in fp32 by bulk reductions into a workspace (the
    FlashAttention-3 backward, Shah et al., 2024; with ``deterministic=True`` each query tile's sum
    is formed in key-block order, bitwise repeatable).

    Args:
        q, k, v, startend_row_indices, causal, softmax_scale, window_size, block_mask, stream: as
            in :func:`flashmask_fwd` (the same values the forward ran with).
        out: ``[B, S_q, H, D]`` forward output (q's dtype).
        lse: float32 contiguous ``[B, H, S_q]`` forward log-sum-exp (natural log; ``-inf`` for rows
            with no visible key, whose gradients are 0).
        dout: ``[B, S_q, H, D]`` gradient of the loss w.r.t. ``out``; same strides as ``out``.
        dq: ``[B, S_q, H, D]``, written; same strides as ``q``.
        dk, dv: ``[B, S_k, H_k, D]``, written; same strides as ``k`` / ``v``.
        learnable_sink: the forward's (its ``lse`` includes the sink, which is all dq, dk, dv need).
        dlearnable_sink: optional float32 contiguous CUDA ``[H]``, written with the sink's gradient
            ``-sum over batch and rows of exp(sink[h] - lse) * sum(dout * out)`` (in a fixed order,
            bitwise repeatable); needs ``learnable_sink``.
        deterministic: order the dQ accumulation (bitwise repeatable, slower).
        workspace: ``None`` (the library's workspace pool, which keeps its memory between calls:
            :func:`release_workspace`), or a contiguous 1-D uint8 GPU tensor of at least
            :func:`bwd_workspace_bytes` bytes, 256-byte aligned (memory from the caller's allocator).

    Raises:
        TypeError: non-tensor argument, wrong dtype, non-bool ``causal``/``deterministic``.
        ValueError: shapes, strides, devices, head_dim or scale out of contract.
        RuntimeError: a CUDA error from the kernel launch.
    """
    _ext().bwd(*_bwd_args(q, k, v, out, lse, dout, startend_row_indices, dq, dk, dv, causal, softmax_scale,
                          window_size, block_mask, learnable_sink, dlearnable_sink, deterministic, stream), workspace)


def bwd_workspace_bytes(q, k, v, out, lse, dout, startend_row_indices, dq, dk, dv, *, causal: bool,
                        softmax_scale: Optional[float] = None, window_size=None, block_mask=None,
                        learnable_sink=None, dlearnable_sink=None, deterministic: bool = False,
                        stream: int = 0) -> int:
    """Bytes of GPU workspace :func:`flashmask_bwd` takes with these arguments: the fp32 dQ
    accumulator (4 bytes per element of ``q``, rows padded to 128), lse2 and delta rows, the block
    summary with ``startend_row_indices``, and with ``deterministic=True`` the dQ order's counters
    (``ops/hopper/flash_bwd_launch.cu``, ``workspace_layout``).

    Args: as :func:`flashmask_bwd` (same shapes, dtypes and devices).

    Raises: as :func:`flashmask_bwd`'s checks (TypeError, ValueError), before any kernel.
    """
    return int(_ext().bwd_workspace_bytes(*_bwd_args(q, k, v, out, lse, dout, startend_row_indices, dq, dk, dv,
                                                     causal, softmax_scale, window_size, block_mask, learnable_sink,
                                                     dlearnable_sink, deterministic, stream)))


def _bwd_args(q, k, v, out, lse, dout, startend_row_indices, dq, dk, dv, causal, softmax_scale, window_size,
              block_mask, learnable_sink, dlearnable_sink, deterministic, stream):
    """The backward's arguments checked and in the extension's order (its bwd and bwd_workspace_bytes)."""
    deterministic = _checks.check_bool("deterministic", deterministic)
    startend_row_indices, causal, softmax_scale = _common_args(
        q, k, startend_row_indices, causal, softmax_scale, window_size, stream)
    return (q, k, v, out, lse, dout, startend_row_indices, dq, dk, dv, block_mask, learnable_sink, dlearnable_sink,
            causal, softmax_scale, deterministic, int(stream))


def release_workspace() -> None:
    """Hands the memory the library's workspace pool keeps between calls back to the driver (every
    device; what enqueued work still uses stays)."""
    _ext().release_workspace()


def block_summary(startend_row_indices, out, *, causal: bool, seqlen_q: int, block_n: int,
                  stream: int = 0) -> None:
    """Per-key-block min/max of the four boundary vectors, on the GPU (O(S_k)).

    ``startend_row_indices``: int32 contiguous CUDA ``[B, H_mask, S_k, C]`` (C 1|2 if causal, 2|4
    otherwise; unlike the attention entries, no host arrays). ``out``: int32 CUDA
    ``[B, H_mask, ceil(S_k/block_n), 8]`` in the order lts_min, lts_max, lte_min, lte_max, uts_min,
    uts_max, ute_min, ute_max (``fm3::BlockSummary``, mask.h).

    Raises:
        TypeError: non-bool ``causal``, non-integer sizes, non-int32 tensors.
        ValueError: shapes, devices or C out of contract; ``seqlen_q`` or ``block_n`` < 1.
    """
    causal = _checks.check_bool("causal", causal)
    seqlen_q = _checks.check_int("seqlen_q", seqlen_q, lo=1, hi=_checks.MAX_SEQLEN)
    block_n = _checks.check_int("block_n", block_n, lo=1, hi=_checks.MAX_SEQLEN)
    _checks.check_stream(stream)
    _ext().block_summary(startend_row_indices, out, causal, seqlen_q, block_n, int(stream))
