"""The CP attention of Paddle users: a PyLayer over the framework-neutral CP step (``step.py``)
with the Paddle ops as its attention backend.

Forward runs :func:`step.forward` (the pruned KV exchange overlapped with local attention, the
partials merged by log-sum-exp in fp32); backward runs :func:`step.backward` on the saved tensors
and the remote KV kept from forward (memory: the pruned remote KV of one layer).
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle.autograd import PyLayer

from .. import _checks
from .. import _validation as V
from .._ops import attention_backward, attention_forward, deterministic_requested
from . import step
from .dispatch import take_rows
from .plan import CPPlan

__all__ = ["cp_flashmask_attention", "PaddleAttention"]


class PaddleAttention(step.AttentionBackend):
    """The compiled Paddle ops (``fm3_flashmask_attention`` / ``_bwd``: Hopper kernels on GPU, the
    CPU kernel on CPU) and Paddle tensor ops. Masks stay on the CPU (the op moves them)."""

    name = "paddle"

    def prepare_mask(self, local_mask, seqlen_q):
        return paddle.to_tensor(local_mask, dtype="int32", place=paddle.CPUPlace())

    def fwd(self, q, k, v, mask, scale):
        return attention_forward(q, k, v, mask, None, scale, False)  # in a PyLayer's forward: records no backward

    def bwd(self, q, k, v, out, lse, dout, mask, scale):
        return attention_backward(q, k, v, mask, None, out, lse, dout, scale, False, deterministic_requested())[:3]

    def index(self, rows, like):
        return paddle.to_tensor(np.asarray(rows, dtype=np.int64), dtype="int64", place=like.place)

    def take_rows(self, x, index):
        return take_rows(x, index, axis=1).contiguous()

    def cat_last(self, a, b):
        return paddle.concat([a, b], axis=-1).contiguous()

    def split_last(self, x, d):
        return x[..., :d].contiguous(), x[..., d:].contiguous()

    def empty(self, shape, like, float32=False):
        return paddle.empty(list(shape), dtype="float32" if float32 else like.dtype)

    def zeros_f32(self, shape, like):
        return paddle.zeros(list(shape), dtype="float32")

    def f32(self, x):
        return x.astype("float32")

    def cast_like(self, x, like):
        return x.astype(like.dtype)

    def index_add_rows(self, x, index, src):
        return paddle.index_add(x, index, 1, src)

    def lse_merge(self, o1, l1, o2, l2):
        return _lse_merge(o1, l1, o2, l2)


_BACKEND = PaddleAttention()


def _lse_merge(o1, l1, o2, l2):
    """Merge two partial attention results. o: fp32 [B, L, H, D_v]; l: fp32 [B, H, L] (natural log,
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


def _sink_grad(sink, out, lse, dout):
    """The sink's gradient from this rank's query rows: ``dsink[h] = -sum over batch and rows of
    exp(sink[h] - lse_row) * sum(dout_row * out_row)``, with the final (sink-merged) ``out`` and
    ``lse``. fp32 ``[H]``."""
    d_row = (dout.astype("float32") * out.astype("float32")).sum(-1).transpose([0, 2, 1])  # [B, H, L]
    logit = sink.reshape([1, -1, 1]) - lse
    # a row with lse = -inf (possible only with a sink of -inf) has out 0: it adds nothing
    p_sink = paddle.where(paddle.isinf(lse), paddle.zeros_like(lse), paddle.exp(logit))
    return -(p_sink * d_row).sum([0, 2])


class _CPAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, plan, scale, *sink):
        # sink: () or (the fp32 [H] learnable sink,); PyLayer returns one gradient per tensor input
        sink_lse = None
        if sink:
            b, l, h = q.shape[0], q.shape[1], q.shape[2]
            sink_lse = sink[0].reshape([1, h, 1]).expand([b, h, l])
        out, lse, remote = step.forward(plan, _BACKEND, q, k, v, scale, sink_lse=sink_lse)
        ctx.plan, ctx.scale, ctx.remote = plan, scale, remote
        ctx.needs_grad = [not x.stop_gradient for x in (q, k, v, *sink)]  # PyLayer wants None for the others
        ctx.save_for_backward(q, k, v, out, lse, *sink)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        if ctx.remote is None:  # freed by the first backward (the KV rows received from the peers)
            raise NotImplementedError(
                "cp_flashmask_attention's backward ran twice through one graph (create_graph=True, or a "
                "second backward): there is no second derivative, and the first backward freed the KV rows "
                "it received from the other ranks")
        q, k, v, out, lse, *sink = ctx.saved_tensor()
        dout = dout.astype(q.dtype).contiguous()
        dq, dkv = step.backward(ctx.plan, _BACKEND, q, k, v, out, lse, dout, ctx.remote, ctx.scale)
        ctx.remote = None
        d = k.shape[-1]  # dkv: dK's d columns, then dV's (v's head dim)
        grads = (dq.astype(q.dtype), dkv[..., :d].astype(k.dtype), dkv[..., d:].astype(v.dtype))
        if sink:  # this rank's rows only: the grad sync of replicated weights reduces it over the CP group
            grads += (_sink_grad(sink[0], out, lse, dout),)
        return tuple(g if needs else None for g, needs in zip(grads, ctx.needs_grad))


def cp_flashmask_attention(q_local, k_local, v_local, plan, *, softmax_scale=None, return_softmax_lse=False,
                           learnable_sink=None):
    """Context-parallel FlashMask attention on this rank's segments.

    Args:
        q_local: ``[batch, S/P, num_heads, head_dim]``: ``plan.dispatch(q)``.
        k_local, v_local: ``[batch, S/P, num_heads_k, head_dim]`` and ``[batch, S/P, num_heads_k,
            head_dim_v]``: ``plan.dispatch(k)``, ``plan.dispatch(v)``; head dims as in
            :func:`paddle_fm3.flashmask_attention` (``head_dim_v`` differs for MLA's 192 / 128).
        plan: from :func:`make_cp_plan` (the mask is in the plan).
        softmax_scale: default ``head_dim ** -0.5``.
        return_softmax_lse: also return the fp32 ``[batch, num_heads, S/P]`` log-sum-exp of the
            local rows (natural log; -inf on fully masked rows; with a sink it includes
            ``exp(learnable_sink[h])`` and is ``learnable_sink[h]`` on fully masked rows). It carries
            no gradient.
        learnable_sink: optional ``[num_heads]`` tensor, one sink logit per query head, as in
            :func:`paddle_fm3.flashmask_attention` (a virtual key of score ``learnable_sink[h]`` and
            value 0 in every row's softmax); float32, or float16/bfloat16 (computed in float32, its
            gradient in its own dtype). The same values on every rank of the CP group: a replicated
            parameter. The kernels run without it on every KV chunk; it joins each row's
            log-sum-exp once, after the last merge. Its gradient here is this rank's share, the
            sum over the rank's own query rows; the sum over the CP group is the single-process
            gradient. That sum is what the framework's gradient sync of any replicated weight does:
            under fleet's ``sep`` axis, ``HybridParallelOptimizer.step`` all-reduces the gradients
            of non-sharded parameters over the sep group with SUM, unscaled (over the dp x sep group,
            scaled by ``1 / dp_degree``, when ``dp_degree > 1``; ``fused_allreduce_gradients`` in
            Paddle 3.3.1); under its ``cp_degree`` axis, which Paddle carves out of ``sharding``,
            the sharding optimizer's ``reduce_gradients`` averages over the whole sharding group
            (the context ranks included), as it does for every other weight. So the sink needs
            nothing beyond the sync its model's other weights already get; without any sync (a
            hand-written loop), all-reduce its gradient (SUM) over the CP group.

    Returns:
        ``out`` (``[batch, S/P, num_heads, head_dim_v]``, dtype of ``q_local``), or ``[out, lse]``;
        ``plan.undispatch(out)`` equals single-process ``flashmask_attention`` on the global
        sequence, and so do the gradients (through ``dispatch``).

    Raises:
        TypeError / ValueError: bad tensors, a ``plan`` that is not a :class:`CPPlan`, a non-bool
            ``return_softmax_lse``, shapes that do not match the plan, a ``learnable_sink`` that
            is not a floating tensor of shape ``[num_heads]``, or a ``softmax_scale`` whose scores
            overflow float32 (as :func:`paddle_fm3.flashmask_attention`, on the group's inputs).
        RuntimeError: on every rank, when the ranks' calls differ in shapes, dtype, softmax_scale
            or sink (checked once per plan and distinct call: :meth:`CPPlan.check_call_agreement`).
    """
    if not isinstance(plan, CPPlan):
        raise TypeError(f"plan must be a CPPlan (make_cp_plan), got {type(plan).__name__}")
    return_softmax_lse = _checks.check_bool("return_softmax_lse", return_softmax_lse)
    V.check_qkv(q_local, k_local, v_local)
    dims = [x.shape[3] for x in (q_local, k_local, v_local)]
    if 0 in dims:  # flashmask_attention's zero-size result is for one process; here every head dim counts
        raise ValueError(f"q_local, k_local, v_local must have head_dim >= 1, got {dims}")
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
    scale = _checks.check_softmax_scale(softmax_scale, q_local.shape[-1])
    plan.check_call_agreement(
        "[batch, num_heads, num_heads_k, head_dim, head_dim_v, dtype, softmax_scale, learnable_sink]",
        [*q_local.shape[:3], k_local.shape[2], q_local.shape[3], v_local.shape[3], str(q_local.dtype), scale,
         learnable_sink is not None])

    def group_maxima(maxima):
        if plan.comm.world_size == 1:
            return maxima
        gathered = plan.comm.all_gather(paddle.to_tensor(maxima, dtype="float32"))
        return np.max([m.numpy() for m in gathered], axis=0).tolist()

    V.check_scores_fit_float32(scale, q_local, k_local, group_maxima)  # flashmask_attention's check, group-wide
    sink = ()
    if learnable_sink is not None:
        V.check_learnable_sink(learnable_sink, q_local.shape[2])  # the rule of flashmask_attention's sink
        sink = (learnable_sink.astype("float32"),)  # the cast takes the gradient back to the sink's dtype
    out, lse = _CPAttention.apply(q_local, k_local, v_local, plan, scale, *sink)
    return [out, lse] if return_softmax_lse else out
