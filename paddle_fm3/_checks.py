"""Argument checks shared by the whole package (numpy only, no Paddle): each raises a TypeError or
ValueError naming the argument and what was expected. The one Python home of the rules that the
masks, the kernels binding, the API and the CP planner all apply (``_validation`` composes them for
``flashmask_attention``'s Paddle tensors). The C/C++ home of the rules the kernels need is
ops/include/fm3/params.h (``fm3_check_params``, ``fm3_check_mask_shape``), run by the C entries and
by the bindings' filler (fm3/fill_params.h) for what Python cannot see."""

from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import numpy as np

from . import _config

MAX_SEQLEN = 2**31 - 1  # row indices are int32
# The kernels compute scores as (softmax_scale * log2(e) * q) . k in float32.
LOG2E = float(np.log2(np.e))
FLOAT32_MAX = float(np.finfo(np.float32).max)

#: The last dimension C of ``startend_row_indices`` allowed with each ``causal`` flag.
VALID_MASK_COLS = {True: (1, 2), False: (2, 4)}

#: Side of the square blocks that ``block_mask`` addresses (fm3::kBlockMaskSize in mask.h, the C/C++ home).
BLOCK_MASK_SIZE = 128


def block_mask_blocks(seqlen: int) -> int:
    """``block_mask``'s blocks along ``seqlen`` rows or columns: its shape is
    ``[batch, mask_heads, block_mask_blocks(seqlen_q), block_mask_blocks(seqlen_k)]``."""
    return -(-seqlen // BLOCK_MASK_SIZE)


def causal_offset(seqlen_q: int, seqlen_k: int) -> int:
    """Bottom-right aligned causality: key ``j`` is visible to row ``i`` iff
    ``j <= i + causal_offset(seqlen_q, seqlen_k)`` (fm3::causal_offset_of)."""
    return seqlen_k - seqlen_q


def is_int(x) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def is_seq(x) -> bool:
    """A list, tuple or an array of rank >= 1."""
    return isinstance(x, (list, tuple)) or (isinstance(x, np.ndarray) and x.ndim >= 1)


def check_int(name: str, value, *, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """Return ``value`` as a Python int, or raise TypeError/ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r})")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return value


def check_rank(name: str, shape, ndim: int, layout: str = "") -> None:
    """A tensor's rank (ValueError), worded as the bindings' filler words it (fm3::expect_ndim)."""
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D{' ' + layout if layout else ''}, got shape {list(shape)}")


def check_stream(stream) -> None:
    """A raw ``cudaStream_t`` handle: a non-negative int below 2**64 (TypeError)."""
    if not is_int(stream) or not 0 <= stream < 2**64:
        raise TypeError(f"stream must be a non-negative int (a cudaStream_t handle), got {stream!r}")


def check_bool(name: str, value) -> bool:
    """Return ``value`` as a bool (numpy bools accepted), or raise TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return bool(value)


def check_batch_heads(batch, num_heads) -> Tuple[int, int]:
    return check_int("batch", batch, lo=1), check_int("num_heads", num_heads, lo=1)


def check_mask_cols(c, causal: bool, name: str = "startend_row_indices") -> None:
    """The rule of the mask's last dimension C: 1 or 2 when causal, 2 or 4 otherwise (ValueError)."""
    allowed = VALID_MASK_COLS[bool(causal)]
    if c not in allowed:
        raise ValueError(f"{name}.shape[3]: with causal={bool(causal)} the last dimension C must be one of "
                         f"{allowed}, got {c}")


def _known_dim(d) -> bool:
    return is_int(d) and d >= 0  # a static graph's unknown dim is -1 (or not an int)


def check_mask_shape(shape, batch, seqlen_k, num_heads, num_heads_k, causal: bool,
                     name: str = "startend_row_indices") -> None:
    """The shape rule of the masks, worded as its C/C++ home words it (fm3_check_mask_shape_of,
    ops/include/fm3/params.h): ``[batch, mask_heads, seqlen_k, C]`` with ``mask_heads`` in
    ``{1, num_heads_k, num_heads}`` and C as ``check_mask_cols`` says. A size that is unknown
    (negative, or not an int) is not checked.

    Raises:
        ValueError: naming the mask's dim and what was expected.
    """
    b, hm, s, c = shape
    if (_known_dim(batch) and _known_dim(b) and b != batch) or (
            _known_dim(seqlen_k) and _known_dim(s) and s != seqlen_k):
        want_b = f"batch={batch}" if _known_dim(batch) else "batch"
        want_s = f"seqlen_k={seqlen_k}" if _known_dim(seqlen_k) else "seqlen_k"
        raise ValueError(f"{name} must have shape [{want_b}, mask_heads, {want_s}, C], got {list(shape)}")
    if _known_dim(num_heads) and _known_dim(num_heads_k) and _known_dim(hm) and hm not in (1, num_heads_k, num_heads):
        raise ValueError(f"{name}.shape[1] (mask heads) must be 1, num_heads_k ({num_heads_k}) or num_heads "
                         f"({num_heads}), got {hm}")
    if _known_dim(c):
        check_mask_cols(c, causal, name)


def normalize_window_size(window_size) -> Tuple[int, int]:
    """Paddle's ``window_size`` (an int, or a ``(left, right)`` pair of ints) as ``(left, right)``.

    Raises:
        TypeError: not an int or a pair of ints (a 0-d array included).
        ValueError: a negative entry.
    """
    if is_int(window_size):
        w = (int(window_size), int(window_size))
    elif is_seq(window_size) and len(window_size) == 2 and all(is_int(x) for x in window_size):
        w = (int(window_size[0]), int(window_size[1]))
    else:
        raise TypeError(f"window_size must be an int or a (left, right) pair of ints, got {window_size!r}")
    if w[0] < 0 or w[1] < 0:
        raise ValueError(f"window_size must be >= 0 (a non-negative int or a pair of them), got {window_size!r}")
    return w


def check_window_size(window_size, startend_row_indices) -> Tuple[int, int]:
    """``window_size`` as ``(left, right)`` (``normalize_window_size``). It becomes the call's
    ``startend_row_indices``, so it cannot come with one (ValueError)."""
    if startend_row_indices is not None:
        raise ValueError("window_size cannot be combined with startend_row_indices; encode the window in "
                         "startend_row_indices (paddle_fm3.masks.sliding_window) instead")
    return normalize_window_size(window_size)


#: (head_dim, head_dim_v) pairs: those of another value head dim (every path), those with a GPU kernel.
HEAD_DIM_V_PAIRS = tuple(map(tuple, _config.HEAD_DIM_V_PAIRS))
GPU_HEAD_DIMS = tuple(map(tuple, _config.SM90_HEAD_DIMS))


def check_head_dims(head_dim: int, head_dim_k: int, head_dim_v: int, *, gpu: bool) -> None:
    """The rule of the head dims of query, key and value (one home; every entry applies it).

    Key's must equal query's. ``(head_dim, head_dim_v)`` is accepted when equal (CPU: any head dim
    in ``[1, CPU_MAX_HEAD_DIM]``; GPU: a pair in ``SM90_HEAD_DIMS``, those with a Hopper kernel) or
    when it is one of ``HEAD_DIM_V_PAIRS`` (on every path: MLA's (192, 128), DeepSeek-V3's).

    Raises:
        ValueError: any other combination, naming the head dims.
    """
    # No comprehensions here: paddle.jit.to_static converts this function (it runs inside the API's).
    if head_dim_k != head_dim:
        raise ValueError(f"key head_dim {head_dim_k} != query head_dim {head_dim}: query and key must share "
                         f"head_dim (the last dim of [batch, seqlen, num_heads, head_dim])")
    if head_dim_v != head_dim and (head_dim, head_dim_v) not in HEAD_DIM_V_PAIRS:
        raise ValueError(f"value head_dim {head_dim_v} != query/key head_dim {head_dim}: only (head_dim, "
                         f"head_dim_v) = {', '.join(map(str, HEAD_DIM_V_PAIRS)) or 'none'} is supported with a "
                         f"different value head dim; otherwise value must have query's head_dim")
    if not 1 <= head_dim <= _config.CPU_MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {_config.CPU_MAX_HEAD_DIM}], got {head_dim}")
    if gpu and (head_dim, head_dim_v) not in GPU_HEAD_DIMS:
        raise ValueError(f"(head_dim, head_dim_v) = ({head_dim}, {head_dim_v}) has no GPU kernel; supported: "
                         f"{_config.SM90_HEAD_DIMS}")


def check_learnable_sink_shape(shape, num_heads: int) -> None:
    """The rule of ``learnable_sink``'s shape: ``[num_heads]``, one sink logit per query head. A dim
    below 0 (unknown in a static graph) passes; the op checks it again at run time.

    Raises:
        ValueError: any other shape, naming ``learnable_sink``.
    """
    shape = list(shape)
    if len(shape) != 1 or (shape[0] >= 0 and shape[0] != num_heads):
        raise ValueError(f"learnable_sink must have shape [num_heads={num_heads}] (one logit per query head), "
                         f"got {shape}")


def check_softmax_scale(softmax_scale, head_dim: int) -> float:
    """``softmax_scale`` as a float, ``head_dim ** -0.5`` for None (1.0 for a query head dim of 0, a
    zero-size call, as in Paddle).

    Raises:
        TypeError: not a real number (or a bool).
        ValueError: 0 once cast to float32, or so large that the kernels' scale into log2 units,
            ``softmax_scale * log2(e)``, overflows float32.
    """
    if softmax_scale is None:
        return float(head_dim) ** -0.5 if head_dim else 1.0
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    try:
        scale = float(softmax_scale)
    except OverflowError:  # an int beyond float64
        scale = math.inf
    if not (scale >= float(np.finfo(np.float32).tiny) and scale * LOG2E <= FLOAT32_MAX):
        raise ValueError(f"softmax_scale must be a finite float32 > 0 whose scores fit in float32 "
                         f"(softmax_scale * log2(e) <= {FLOAT32_MAX / LOG2E:.3g}; the usual value is "
                         f"head_dim ** -0.5), got {scale:g}")
    return scale
