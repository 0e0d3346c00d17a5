"""Dense float64 numpy reference ("oracle") for FlashMask attention, forward and backward.

Computes ``softmax(scale * Q K^T + M) V`` with the FlashMask ``M`` expanded to a dense mask by
:func:`paddle_fm3.masks.to_dense` (the single definition of the dense semantics), optionally AND-ed
with Paddle's 128x128 ``block_mask``. O(S_q * S_k) memory: for tests, not for production.

Semantics follow ``paddle.nn.functional.flashmask_attention`` (Paddle >= 3.0) and the FlashMask
paper (arXiv:2410.01359):

- layout ``[batch, seqlen, num_heads, head_dim]``;
- GQA / MQA: query head ``h`` uses kv head ``h // (H // H_k)``;
- mask heads ``H_mask in {1, H_k, H}``: 1 broadcasts; ``H_mask == H`` maps head ``h`` to mask
  head ``h``; otherwise (``H_mask == H_k``) to ``h // (H // H_k)``;
- causal with ``S_q != S_k`` is bottom-right aligned;
- a query row with no visible key gets output 0 and lse ``-inf``; its gradients are 0 (no NaN,
  no floating-point warnings);
- a learnable sink (gpt-oss; FlashAttention-4's ``learnable_sink``) is one logit ``sink[h]`` per query
  head: a virtual key of score ``sink[h]`` and value 0 in every row's softmax. The output sums over
  the real keys only, the lse includes the sink, and a row that sees no key gives output 0 and
  lse ``sink[h]``.

Only numpy is imported (the GPU test machine has no Paddle).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _checks
from . import masks as _masks

__all__ = ["attention_forward", "attention_backward", "dense_visibility"]


def _as_float_array(name: str, x, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)) \
            or arr.dtype == np.bool_:
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D [batch, seqlen, num_heads, head_dim], got shape {arr.shape}")
    return arr.astype(np.float64)


def _expand_heads(arr: np.ndarray, num_heads: int, num_heads_k: int, name: str) -> np.ndarray:
    """[B, H_mask, ...] -> [B, num_heads, ...] following the H_mask in {1, H_k, H} rule."""
    hm = arr.shape[1]
    if hm == num_heads:
        return arr
    if hm == num_heads_k:
        return np.repeat(arr, num_heads // num_heads_k, axis=1)
    if hm == 1:
        return np.broadcast_to(arr, (arr.shape[0], num_heads) + arr.shape[2:])
    raise ValueError(f"{name}: head dimension (dim 1) must be 1, num_heads_k={num_heads_k} or "
                     f"num_heads={num_heads}, got {hm}")


def dense_visibility(batch: int, seqlen_q: int, seqlen_k: int, num_heads: int, num_heads_k: int,
                     startend_row_indices=None, *, causal: bool = False,
                     block_mask=None) -> np.ndarray:
    """Dense visibility ``[batch, num_heads, seqlen_q, seqlen_k]`` (bool, True = visible).

    Combines the FlashMask (or plain causality when ``startend_row_indices`` is None) with the
    optional ``block_mask`` (int ``[B, H_mask, ceil(S_q/128), ceil(S_k/128)]``, 1 = keep).

    Raises:
        TypeError / ValueError: malformed ``startend_row_indices`` or ``block_mask`` (wrong shape,
        batch, head count or values).
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if startend_row_indices is None:
        vis = np.ones((batch, 1, seqlen_q, seqlen_k), dtype=bool)
        if causal:
            i = np.arange(seqlen_q)[:, None]
            j = np.arange(seqlen_k)[None, :]
            vis &= (j <= i + _checks.causal_offset(seqlen_q, seqlen_k))[None, None]
    else:
        sri = np.asarray(startend_row_indices)
        if sri.ndim != 4:
            raise ValueError(f"startend_row_indices must be 4-D [B, H_mask, S_k, C], got shape {sri.shape}")
        if sri.shape[0] != batch:
            raise ValueError(f"startend_row_indices.shape[0] must equal batch={batch}, got {sri.shape[0]}")
        if sri.shape[2] != seqlen_k:
            raise ValueError(f"startend_row_indices.shape[2] must equal seqlen_k={seqlen_k}, got {sri.shape[2]}")
        vis = _masks.to_dense(sri, bool(causal), seqlen_q)
    vis = _expand_heads(vis, num_heads, num_heads_k, "startend_row_indices")
    if block_mask is not None:
        bm = np.asarray(block_mask)
        if bm.dtype != np.bool_ and not np.issubdtype(bm.dtype, np.integer):
            raise TypeError(f"block_mask must be an integer (int32) array, got dtype {bm.dtype}")
        nq, nk = _checks.block_mask_blocks(seqlen_q), _checks.block_mask_blocks(seqlen_k)
        if bm.ndim != 4 or bm.shape[0] != batch or bm.shape[2] != nq or bm.shape[3] != nk:
            raise ValueError(f"block_mask must have shape [batch={batch}, H_mask, ceil(S_q/128)={nq}, "
                             f"ceil(S_k/128)={nk}], got {bm.shape}")
        if startend_row_indices is not None and bm.shape[1] != np.shape(startend_row_indices)[1]:
            raise ValueError(f"block_mask.shape[1] must equal startend_row_indices.shape[1]="
                             f"{np.shape(startend_row_indices)[1]}, got {bm.shape[1]}")
        if bm.size and not np.isin(bm, (0, 1)).all():
            raise ValueError("block_mask values must be 0 (masked) or 1 (kept)")
        side = _checks.BLOCK_MASK_SIZE
        keep = np.repeat(np.repeat(bm.astype(bool), side, axis=2), side, axis=3)
        keep = keep[:, :, :seqlen_q, :seqlen_k]
        vis = vis & _expand_heads(keep, num_heads, num_heads_k, "block_mask")
    return np.broadcast_to(vis, (batch, num_heads, seqlen_q, seqlen_k))


def _as_sink(learnable_sink, num_heads: int):
    """float64 ``[1, H, 1, 1]`` of the sink logits (None: no sink)."""
    if learnable_sink is None:
        return None
    sink = np.asarray(learnable_sink)
    _checks.check_learnable_sink_shape(sink.shape, num_heads)
    sink = _as_float_array("learnable_sink", sink, 1)
    return sink.reshape(1, num_heads, 1, 1)


def _prepare(q, k, v, startend_row_indices, causal, softmax_scale, block_mask, learnable_sink=None):
    q = _as_float_array("q", q, 4)
    k = _as_float_array("k", k, 4)
    v = _as_float_array("v", v, 4)
    b, sq, h, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"q, k, v must share the batch size, got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree in [batch, seqlen_k, num_heads_k], got {k.shape} and {v.shape}")
    if k.shape[3] != d:
        raise ValueError(f"q and k must have the same head_dim, got {d} and {k.shape[3]}")
    sk, hk = k.shape[1], k.shape[2]
    if min(sq, sk, h, hk, d) < 1:
        raise ValueError(f"empty dimension in q {q.shape} or k {k.shape}")
    if h % hk != 0:
        raise ValueError(f"num_heads={h} must be a multiple of num_heads_k={hk}")
    if softmax_scale is None:
        scale = d ** -0.5
    else:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
            raise TypeError(f"softmax_scale must be a real number or None, got {type(softmax_scale).__name__}")
        scale = float(softmax_scale)
        if not np.isfinite(scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    vis = dense_visibility(b, sq, sk, h, hk, startend_row_indices, causal=causal, block_mask=block_mask)
    sink = _as_sink(learnable_sink, h)
    g = h // hk
    kh = np.repeat(k, g, axis=2)  # [B, S_k, H, D], head h -> kv head h // g
    vh = np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kh) * scale
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)  # exp(-inf) == 0 exactly, no warning
    l = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        l = l + np.exp(sink - m)  # the sink's share of the denominator; its value is 0
    has = l > 0
    l_safe = np.where(has, l, 1.0)
    p = p / l_safe
    lse = np.where(has, m + np.log(l_safe), -np.inf)[..., 0]
    return q, kh, vh, p, lse, scale, hk, g, sink


def attention_forward(q, k, v, startend_row_indices=None, *, causal: bool = False,
                      softmax_scale: Optional[float] = None,
                      block_mask=None, learnable_sink=None) -> Tuple[np.ndarray, np.ndarray]:
    """Reference FlashMask attention forward, in float64.

    Args:
        q: ``[B, S_q, H, D]``, any real dtype (computed in float64).
        k: ``[B, S_k, H_k, D]``, ``H % H_k == 0``.
        v: ``[B, S_k, H_k, D_v]``.
        startend_row_indices: optional integer ``[B, H_mask, S_k, C]``, ``H_mask in {1, H_k, H}``
            (see :mod:`paddle_fm3.masks`); None = no mask beyond ``causal``.
        causal: causal flag (bottom-right aligned when ``S_q != S_k``).
        softmax_scale: default ``D ** -0.5``.
        block_mask: optional integer ``[B, H_mask, ceil(S_q/128), ceil(S_k/128)]``, 1 = keep the
            128x128 block, 0 = mask it; AND-ed with the FlashMask.
        learnable_sink: optional real ``[H]``, one sink logit per query head (see the module
            docstring); None = no sink.

    Returns:
        ``(out, lse)``: out float64 ``[B, S_q, H, D_v]``; lse float64 ``[B, H, S_q]`` (natural log
        of the sum of ``exp(scale * q.k)`` over visible keys, plus ``exp(sink[h])`` with a sink;
        ``-inf`` for fully masked rows without a sink; such rows' ``out`` is 0).

    Raises:
        TypeError / ValueError: bad shapes/dtypes of any argument (named in the message).
    """
    _, _, vh, p, lse, _, _, _, _ = _prepare(q, k, v, startend_row_indices, causal, softmax_scale, block_mask,
                                            learnable_sink)
    out = np.einsum("bhqk,bkhd->bqhd", p, vh)
    return out, lse


def attention_backward(q, k, v, dout, startend_row_indices=None, *, causal: bool = False,
                       softmax_scale: Optional[float] = None,
                       block_mask=None, learnable_sink=None, out=None) -> Tuple[np.ndarray, ...]:
    """Reference FlashMask attention backward, in float64.

    Args:
        q, k, v, startend_row_indices, causal, softmax_scale, block_mask, learnable_sink: as in
            :func:`attention_forward`.
        dout: ``[B, S_q, H, D_v]``, gradient of the loss w.r.t. ``out``.
        out: optional ``[B, S_q, H, D_v]``, the forward output a kernel's backward is given. ``D_row =
            sum(dout * out)`` is then taken from it, as the kernels take it (``params.h``), so the result
            is what they compute up to their own rounding. It differs from the default by what a
            half-precision ``out``'s rounding does to D_row, which on a row that sees few keys can exceed
            that dtype's tolerance. None: the exact forward's output.

    Returns:
        ``(dq, dk, dv)`` float64 with the shapes of q, k, v, and with ``learnable_sink`` also
        ``dsink`` float64 ``[H]``: ``-sum over batch and rows of p_sink * D_row``, ``p_sink =
        exp(sink[h] - lse_row)``, ``D_row = sum(dout * out)``. With GQA/MQA, ``dk``/``dv`` sum the
        contributions of all query heads of a group. Fully masked query rows contribute 0.

    Raises:
        TypeError / ValueError: bad shapes/dtypes (named in the message).
    """
    qf, kh, vh, p, lse, scale, hk, g, sink = _prepare(q, k, v, startend_row_indices, causal, softmax_scale,
                                                      block_mask, learnable_sink)
    do = _as_float_array("dout", dout, 4)
    b, sq, h, _ = qf.shape
    if do.shape != (b, sq, h, vh.shape[3]):
        raise ValueError(f"dout must have shape {(b, sq, h, vh.shape[3])}, got {do.shape}")
    sk = kh.shape[1]
    dv_h = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vh)
    if out is None:
        delta = (p * dp).sum(axis=-1, keepdims=True)  # = rowsum(dO * O)
    else:
        o = _as_float_array("out", out, 4)
        if o.shape != do.shape:
            raise ValueError(f"out must have shape {do.shape}, got {o.shape}")
        delta = np.einsum("bqhd,bqhd->bhq", do, o)[..., None]
    ds = p * (dp - delta)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kh) * scale
    dk_h = np.einsum("bhqk,bqhd->bkhd", ds, qf) * scale
    dk = dk_h.reshape(b, sk, hk, g, -1).sum(axis=3)
    dv = dv_h.reshape(b, sk, hk, g, -1).sum(axis=3)
    if sink is None:
        return dq, dk, dv
    # the sink's value is 0, so the rows' D term is all its softmax gradient has
    dsink = -(np.exp(sink - lse[..., None]) * delta).sum(axis=(0, 2, 3))
    return dq, dk, dv, dsink
