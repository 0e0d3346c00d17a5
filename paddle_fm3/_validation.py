"""The checks of one ``flashmask_attention`` call on Paddle tensors: a clear ValueError/TypeError
naming the argument and what was expected, raised before any kernel runs. The rules themselves
live in ``_checks`` (numpy only, shared with the kernels binding, the masks and the CP planner);
this module applies them to Paddle tensors, whose dims may be unknown (-1) in a static graph."""

from __future__ import annotations

import math
import numbers

import numpy as np
import paddle

from . import _checks
from ._checks import FLOAT32_MAX, LOG2E, block_mask_blocks

FLOAT_DTYPES = (paddle.float32, paddle.float16, paddle.bfloat16)
QKV_LAYOUT = "[batch, seqlen, num_heads, head_dim]"


def _known(d) -> bool:
    # static graphs may carry -1 (or, under dy2static, a tensor) for unknown dims
    return isinstance(d, int) and d >= 0


def check_tensor(name: str, x, ndim: int | None = None, dtypes=None, layout: str = "") -> None:
    if not isinstance(x, (paddle.Tensor, paddle.pir.Value) if hasattr(paddle, "pir") else paddle.Tensor):
        raise TypeError(f"{name} must be a paddle.Tensor, got {type(x).__name__}")
    if ndim is not None:
        _checks.check_rank(name, x.shape, ndim, layout)
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d).replace("paddle.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {x.dtype}")


def _agree(*dims) -> bool:
    """Dims that must match do: equal, a 0 agreeing with anything. Only a zero-size call has a 0
    (every other call has none), and Paddle returns its zeros without comparing further."""
    nonzero = [x for x in dims if x != 0]
    return all(x == nonzero[0] for x in nonzero)


def check_qkv(q, k, v) -> bool:
    """Check query/key/value; return True when the call is zero-size (any of them has no elements).

    Head dims follow ``check_head_dims``: key's is query's; value's may differ only for the pairs
    of ``_config.HEAD_DIM_V_PAIRS`` (MLA's 192 / 128), and the output then has value's.

    A zero-size call (a 0 in any dim of query, key or value) has a result without a kernel, as in
    Paddle: zeros of shape ``[batch, seqlen_q, num_heads, head_dim_v]`` (``zero_size_output_shape``;
    empty when that has no elements). Its shapes are compared as in any call, except that a 0
    agrees with anything (``_agree``), as Paddle accepts a key or value with no rows, heads, head
    dims or batch whatever the others' are.
    """
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_tensor(name, x, 4, FLOAT_DTYPES, QKV_LAYOUT)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"query, key, value must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    (b, sq, h, d), (bk, sk, hk, dk), (bv, sv, hv, dv) = q.shape, k.shape, v.shape
    if _known(b) and not _agree(b, bk, bv):
        raise ValueError(f"batch size mismatch: query {b}, key {bk}, value {bv} (layout {QKV_LAYOUT})")
    if _known(sk) and not _agree(sk, sv):
        raise ValueError(f"key and value seqlen (shape[1] of {QKV_LAYOUT}) differ: {sk} vs {sv}")
    if not all(_known(x) for x in (h, hk, hv, d, dk, dv)):
        raise ValueError("num_heads and head_dim of query, key, value must be static (known) dims")
    zero_size = any(_known(x) and x == 0 for x in (*q.shape, *k.shape, *v.shape))
    if hk and hv:  # Paddle returns zeros for a key or value with no heads whatever the others' are
        if hk != hv:
            raise ValueError(f"key and value num_heads differ: {hk} vs {hv} (shape[2] of {QKV_LAYOUT})")
        if h % hk != 0:
            raise ValueError(f"num_heads ({h}) must be a multiple of num_heads_k ({hk}) (query's and key's "
                             f"shape[2] of {QKV_LAYOUT}; query {list(q.shape)}, key {list(k.shape)})")
    if d and dk and dv:  # a head dim of 0 agrees with any (zero-size)
        place = getattr(q, "place", None)  # None for static-graph values
        # the GPU's own pairs only when a kernel runs (a zero-size call runs none)
        _checks.check_head_dims(d, dk, dv, gpu=not zero_size and place is not None and not place.is_cpu_place())
    return zero_size


def zero_size_output_shape(q, k, v) -> list:
    """The output shape of a zero-size call, as Paddle gives it: ``[batch, seqlen_q, num_heads,
    head_dim_v]``, batch 0 when key's or value's is (the lse is ``[batch, num_heads, seqlen_q]``)."""
    b, sq, h, _ = q.shape
    return [0 if 0 in (k.shape[0], v.shape[0]) else b, sq, h, v.shape[3]]


def check_startend_row_indices(sri, q, k, causal: bool) -> None:
    check_tensor("startend_row_indices", sri, 4)
    if sri.dtype != paddle.int32:
        raise TypeError(f"startend_row_indices must be int32, got {sri.dtype}")
    b, h = q.shape[0], q.shape[2]
    sk, hk = k.shape[1], k.shape[2]
    _, hm, skm, c = sri.shape
    if not (_known(hm) and _known(c)):
        raise ValueError("startend_row_indices.shape[1] (mask heads) and shape[3] (C) must be static (known) "
                         f"dims, got shape {list(sri.shape)}")
    try:
        _checks.check_mask_shape(sri.shape, b, sk, h, hk, causal)
    except ValueError as e:
        if _known(sk) and _known(skm) and skm != sk and skm == hk:  # the mask's length is key's shape[2]
            raise ValueError(f"{e}; query, key and value are {QKV_LAYOUT}, but key {list(k.shape)} looks like "
                             "[batch, num_heads, seqlen, head_dim]: transpose them with .transpose([0, 2, 1, 3])"
                             ) from None
        raise
    # No value check, so no device-to-host copy: every int32 value has Paddle's meaning, read
    # the same way by every kernel (fm3::load_column clamps to [0, seqlen_q]; above seqlen_q
    # means "to the end", negative means 0, an interval with start > end is empty).


def check_block_mask(block_mask, sri, q, k) -> None:
    if sri is None:
        raise ValueError("block_mask requires startend_row_indices (as in Paddle)")
    check_tensor("block_mask", block_mask, 4)
    if block_mask.dtype != paddle.int32:
        raise TypeError(f"block_mask must be int32, got {block_mask.dtype}")
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    want = [b, sri.shape[1], block_mask_blocks(sq), block_mask_blocks(sk)]
    got = list(block_mask.shape)
    if any(_known(w) and _known(g) and w != g for w, g in zip(want, got)):
        raise ValueError(f"block_mask must have shape {want} [batch, mask_heads, ceil(seqlen_q/128), "
                         f"ceil(seqlen_k/128)], got {got}")
    # Values: checked by the op for CPU tensors (fm3::fill_fwd_params), not for GPU ones.


def check_learnable_sink(learnable_sink, num_heads: int) -> None:
    """A floating tensor ``[num_heads]`` (float32; float16 and bfloat16 are cast to float32 for the
    kernels). Values are not checked (no device-to-host copy)."""
    check_tensor("learnable_sink", learnable_sink, dtypes=FLOAT_DTYPES)
    _checks.check_learnable_sink_shape(learnable_sink.shape, num_heads)


def check_dropout(dropout, training, rng_name) -> None:
    """Dropout is not implemented: with ``training`` it must be 0.0 (NotImplementedError); without,
    it is not applied (as in Paddle), whatever its value in [0, 1). ``rng_name``: a str."""
    if not isinstance(dropout, numbers.Real) or isinstance(dropout, (bool, np.bool_)):
        raise TypeError(f"dropout must be a float, got {type(dropout).__name__}")
    if not 0.0 <= dropout < 1.0:  # NaN too
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout}")
    if _checks.check_bool("training", training) and dropout != 0.0:
        raise NotImplementedError("paddle_fm3.flashmask_attention does not implement dropout: pass dropout=0.0 "
                                  "when training (with training=False dropout is not applied, as in Paddle)")
    if not isinstance(rng_name, str):
        raise TypeError(f"rng_name must be a str, got {type(rng_name).__name__}")


def check_window_size(window_size, startend_row_indices, query, key):
    """``window_size`` as ``(left, right)`` (``_checks.check_window_size``); its mask is built on the
    host, so batch and sequence lengths must be static."""
    window = _checks.check_window_size(window_size, startend_row_indices)
    if not all(_known(d) for d in (query.shape[0], query.shape[1], key.shape[1])):
        raise ValueError("window_size needs static batch and sequence lengths (the mask is built on the "
                         "host); in a static graph with unknown dims pass startend_row_indices instead "
                         "(paddle_fm3.masks.sliding_window / window_to_startend)")
    return window


def check_seed_offset(fixed_seed_offset) -> None:
    check_tensor("fixed_seed_offset", fixed_seed_offset)
    if fixed_seed_offset.dtype != paddle.int64 or list(fixed_seed_offset.shape) != [2]:
        raise ValueError(f"fixed_seed_offset must be an int64 tensor of shape [2] (seed, offset), got "
                         f"{fixed_seed_offset.dtype} {list(fixed_seed_offset.shape)}")


def check_scores_fit_float32(softmax_scale: float, query, key, group_maxima=None) -> None:
    """Reject a softmax_scale whose scores may overflow float32 on these inputs: the bound
    ``softmax_scale * log2(e) * head_dim * max|query| * max|key|`` must fit. Checked in dynamic
    mode for scales above 1 only (two reductions and a host copy; realistic scales are <= 1, and
    with them an overflow would come from the inputs, not the scale). ``group_maxima``: maps this
    process's ``(max|query|, max|key|)`` to the maxima over its group (context parallelism, where
    every rank's query meets every rank's key; every rank of the group must call it)."""
    if softmax_scale <= 1.0 or not paddle.in_dynamic_mode():
        return
    maxima = tuple(float(paddle.abs(x).max().astype("float32")) if x.size else 0.0 for x in (query, key))
    amax_q, amax_k = group_maxima(maxima) if group_maxima is not None else maxima
    if not (math.isfinite(amax_q) and math.isfinite(amax_k)):
        return  # NaN / Inf inputs: not the scale's fault; they propagate as in Paddle (documented)
    bound = softmax_scale * LOG2E * query.shape[-1] * amax_q * amax_k
    if not bound <= FLOAT32_MAX:
        raise ValueError(f"softmax_scale={softmax_scale} is too large for these inputs: the scores can reach "
                         f"softmax_scale * log2(e) * head_dim * max|query| * max|key| = {bound:.3g}, beyond "
                         f"float32's {FLOAT32_MAX:.3g} (the usual value is head_dim ** -0.5)")
