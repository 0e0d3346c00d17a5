"""The CP attention executor: a PyLayer that overlaps the pruned KV exchange with local attention.

Forward (FlashMask-3 CP step 4): post the exchange of the KV segments that the plan says are
needed (one message per peer, K and V packed together), compute attention of the local queries on
the local KV meanwhile, then fold in each peer's KV as it arrives, merging the partial outputs by
log-sum-exp in fp32 (stable form: shift by the larger lse, so no exponent is positive).

Backward mirrors it: with the merged (out, lse), ``fm3_flashmask_attention_bwd`` on each KV chunk
gives exact partial gradients (dQ sums over chunks; dK/dV per chunk). The partial dK/dV of remote
chunks are computed first and sent back (fp32) only to the ranks that own those keys, while the
local chunk's backward runs; each owner adds what it receives into its own dK/dV.

The received remote KV is kept from forward to backward (no second exchange; memory: the pruned
remote KV of one layer).
"""

from __future__ import annotations

import paddle
from paddle.autograd import PyLayer

from .. import _validation as V
from .._ops import ops
from .plan import CPPlan

__all__ = ["cp_flashmask_attention"]


def _lse_merge(o1, l1, o2, l2):
    """Merge two partial attention results. o: fp32 [B, L, H, D]; l: fp32 [B, H, L] (natural log,
    -inf where a row saw nothing). Returns the merged (o, l)."""
    mx = paddle.maximum(l1, l2)
    none = paddle.isinf(mx)  # both -inf: the row has seen no key yet
    zero = paddle.zeros_like(mx)
    shift = paddle.where(none, zero, mx)
    # exp of -inf is taken as exactly 0 (Paddle's vectorized CPU exp/log are not exact there)
    e1 = paddle.where(paddle.isinf(l1), zero, paddle.exp(l1 - shift))
    e2 = paddle.where(paddle.isinf(l2), zero, paddle.exp(l2 - shift))
    tot = paddle.where(none, paddle.ones_like(mx), e1 + e2)  # >= 1 where some key was seen
    w1 = (e1 / tot).transpose([0, 2, 1]).unsqueeze(-1)
    w2 = (e2 / tot).transpose([0, 2, 1]).unsqueeze(-1)
    lse = paddle.where(none, paddle.full_like(mx, float("-inf")), shift + paddle.log(tot))
    return o1 * w1 + o2 * w2, lse


def _pack_kv(k, v, rows=None):
    kv = paddle.concat([k, v], axis=-1)
    if rows is not None:
        kv = paddle.index_select(kv, paddle.to_tensor(rows, dtype="int64", place=k.place), axis=1)
    return kv.contiguous()


class _CPAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, plan, scale):
        comm, lay = plan.comm, plan.layout
        b, _, hk, d = k.shape
        c = lay.segment_size
        sends = [(p, _pack_kv(k, v, plan.send_rows(p))) for p in plan.send_peers]
        recvs = [(p, paddle.empty([b, len(lay.recv[plan.rank][p]) * c, hk, 2 * d], dtype=k.dtype))
                 for p in plan.recv_peers]
        pending = comm.exchange(sends, recvs)
        out, lse = ops.fm3_flashmask_attention(q, k, v, plan.mask_for("local"), None, scale, False)
        acc = out.astype("float32")
        remote = []
        for i, (p, buf) in enumerate(recvs):
            pending.wait_recv(i)
            kp, vp = buf[..., :d], buf[..., d:]
            o2, l2 = ops.fm3_flashmask_attention(q, kp, vp, plan.mask_for(p), None, scale, False)
            acc, lse = _lse_merge(acc, lse, o2.astype("float32"), l2)
            remote.append((p, kp.contiguous(), vp.contiguous()))
        pending.wait_all()
        out = acc.astype(q.dtype)
        ctx.plan, ctx.scale, ctx.remote = plan, scale, remote
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        q, k, v, out, lse = ctx.saved_tensor()
        plan, scale = ctx.plan, ctx.scale
        dout = dout.astype(q.dtype).contiguous()
        dq = paddle.zeros(q.shape, dtype="float32")
        grad_sends = []
        for p, kp, vp in ctx.remote:  # remote partials first, so their transfer overlaps local work
            dq_p, dk_p, dv_p = ops.fm3_flashmask_attention_bwd(
                q, kp, vp, plan.mask_for(p), None, out, lse, dout, scale, False)
            dq = dq + dq_p.astype("float32")
            grad_sends.append((p, paddle.concat([dk_p.astype("float32"), dv_p.astype("float32")], -1)))
        b, _, hk, d = k.shape
        c = plan.layout.segment_size
        grad_recvs = [(p, paddle.empty([b, len(plan.layout.recv[p][plan.rank]) * c, hk, 2 * d], "float32"))
                      for p in plan.send_peers]
        pending = plan.comm.exchange(grad_sends, grad_recvs)
        dq_l, dk_l, dv_l = ops.fm3_flashmask_attention_bwd(
            q, k, v, plan.mask_for("local"), None, out, lse, dout, scale, False)
        dq = dq + dq_l.astype("float32")
        dkv = paddle.concat([dk_l.astype("float32"), dv_l.astype("float32")], -1)
        pending.wait_all()
        for p, buf in grad_recvs:
            idx = paddle.to_tensor(plan.send_rows(p), dtype="int64", place=k.place)
            dkv = paddle.index_add(dkv, idx, 1, buf)
        ctx.remote = None
        return dq.astype(q.dtype), dkv[..., :d].astype(k.dtype), dkv[..., d:].astype(v.dtype)


class _Undispatch(PyLayer):
    @staticmethod
    def forward(ctx, x, plan, axis):
        ctx.plan, ctx.axis = plan, axis
        parts = plan.comm.all_gather(x.contiguous())
        full = paddle.concat(parts, axis=axis)
        return paddle.index_select(full, plan._inverse_index(x.place), axis=axis)

    @staticmethod
    def backward(ctx, dy):
        return paddle.index_select(dy, ctx.plan._index(dy.place), axis=ctx.axis)


def cp_flashmask_attention(q_local, k_local, v_local, plan, *, softmax_scale=None, return_softmax_lse=False):
    """Context-parallel FlashMask attention on this rank's segments.

    Args:
        q_local: ``[batch, S/P, num_heads, head_dim]``: ``plan.dispatch(q)``.
        k_local, v_local: ``[batch, S/P, num_heads_k, head_dim]``: ``plan.dispatch(k)``, ``plan.dispatch(v)``.
        plan: from :func:`make_cp_plan` (the mask is in the plan).
        softmax_scale: default ``head_dim ** -0.5``.
        return_softmax_lse: also return the fp32 ``[batch, num_heads, S/P]`` log-sum-exp of the
            local rows (natural log; -inf on fully masked rows). It carries no gradient.

    Returns:
        ``out`` (``[batch, S/P, num_heads, head_dim]``, dtype of ``q_local``), or ``[out, lse]``;
        ``plan.undispatch(out)`` equals single-process ``flashmask_attention`` on the global
        sequence, and so do the gradients (through ``dispatch``).

    Raises:
        TypeError / ValueError: bad tensors, a ``plan`` that is not a :class:`CPPlan`, a non-bool
            ``return_softmax_lse``, or shapes that do not match the plan.
    """
    if not isinstance(plan, CPPlan):
        raise TypeError(f"plan must be a CPPlan (make_cp_plan), got {type(plan).__name__}")
    return_softmax_lse = V.check_bool("return_softmax_lse", return_softmax_lse)
    V.check_qkv(q_local, k_local, v_local)
    L = plan.local_seqlen
    for name, x in (("q_local", q_local), ("k_local", k_local), ("v_local", v_local)):
        if x.shape[1] != L:
            raise ValueError(f"{name}.shape[1] must be the local seqlen {L} (S/P), got {x.shape[1]}: "
                             f"pass plan.dispatch(x)")
    b, hm = plan.local_mask.shape[:2]
    if q_local.shape[0] != b:
        raise ValueError(f"batch size {q_local.shape[0]} does not match the plan's mask batch {b}")
    if hm not in (1, k_local.shape[2], q_local.shape[2]):
        raise ValueError(f"mask heads {hm} must be 1, num_heads_k or num_heads")
    scale = V.check_softmax_scale(softmax_scale, q_local.shape[-1])
    out, lse = _CPAttention.apply(q_local, k_local, v_local, plan, scale)
    return [out, lse] if return_softmax_lse else out
