"""One context-parallel attention step (docs/design.md, "Context parallelism"), independent of the framework.

The schedule, written once for every caller (the Paddle PyLayer in ``executor.py``; the torch
backends of ``backends/torch.py``, run by ``tools/cp_torch_run.py`` and ``tools/cp_rank_compute.py``):

Forward: post the exchange of the KV segments that the plan says are needed (one message per
peer, K and V packed together), compute attention of the local queries on the local KV meanwhile,
then fold in each peer's KV as it arrives, merging the partial outputs by log-sum-exp in fp32.
A learnable sink joins that merge once, after the last chunk (a partial of value 0 whose lse is
the sink's logit): the kernels run without it on every chunk.

Backward mirrors it: with the merged (out, lse), the attention backward on each KV chunk gives
exact partial gradients (dQ sums over chunks; dK/dV per chunk). The partial dK/dV of remote chunks
are computed first and sent back (fp32) to the ranks that own those keys, while the local chunk's
backward runs; each owner adds what it receives into its own dK/dV. The received remote KV is kept
from forward to backward (no second exchange).

Tensors and kernels come from an :class:`AttentionBackend`, communication from a
:class:`~paddle_fm3.distributed.comm.Communicator`; the plan (a :class:`~.plan.CPPlan`) says what
moves where. When no rank of the layout exchanges anything, the exchange is skipped on every rank
(the layout is the same everywhere, so the ranks agree).
"""

from __future__ import annotations

import abc
from typing import List, Tuple

import numpy as np

__all__ = ["AttentionBackend", "forward", "backward"]


class AttentionBackend(abc.ABC):
    """The kernels and the few tensor operations a CP step needs, in one framework.

    Shapes: ``q`` ``[B, L, H, D]``, ``k`` ``[B, L_k, H_k, D]``; ``v`` ``[B, L_k, H_k, D_v]``, ``out, dout``
    ``[B, L, H, D_v]`` (``D_v``: value's head dim, ``D`` but for MLA's 192 / 128); ``lse`` fp32
    ``[B, H, L]`` (natural log, -inf on rows that see no key). ``name`` keys the plan's cache of
    prepared masks (two backends with the same name must prepare masks the same way).
    """

    name: str

    @abc.abstractmethod
    def prepare_mask(self, local_mask: np.ndarray, seqlen_q: int):
        """A localized mask (non-causal, C = 4, int32 ``[B, H_mask, L_k, 4]`` over ``seqlen_q`` local
        query rows) in the form ``fwd`` / ``bwd`` take."""

    @abc.abstractmethod
    def fwd(self, q, k, v, mask, scale: float) -> Tuple[object, object]:
        """Attention forward: ``(out, lse)``."""

    @abc.abstractmethod
    def bwd(self, q, k, v, out, lse, dout, mask, scale: float) -> Tuple[object, object, object]:
        """Attention backward with the row's merged ``out`` / ``lse``: ``(dq, dk, dv)``."""

    @abc.abstractmethod
    def index(self, rows: np.ndarray, like):
        """int64 index tensor of ``rows`` on the device of ``like``."""

    @abc.abstractmethod
    def take_rows(self, x, index):
        """``x[:, index]`` (contiguous)."""

    @abc.abstractmethod
    def cat_last(self, a, b):
        """``a`` and ``b`` concatenated along the last axis (contiguous)."""

    @abc.abstractmethod
    def split_last(self, x, d: int):
        """``(x[..., :d], x[..., d:])``, each contiguous."""

    @abc.abstractmethod
    def empty(self, shape, like, float32: bool = False):
        """An uninitialized tensor on the device of ``like``, of its dtype (or fp32)."""

    @abc.abstractmethod
    def zeros_f32(self, shape, like):
        """fp32 zeros on the device of ``like``."""

    @abc.abstractmethod
    def f32(self, x):
        """``x`` as fp32."""

    @abc.abstractmethod
    def cast_like(self, x, like):
        """``x`` in the dtype of ``like``."""

    @abc.abstractmethod
    def index_add_rows(self, x, index, src):
        """``x`` with ``src`` added to its rows ``index`` along axis 1 (may update ``x`` in place)."""

    @abc.abstractmethod
    def lse_merge(self, o1, l1, o2, l2):
        """Merge two partial results (o fp32, l fp32; -inf: the row saw nothing) -> ``(o, l)``."""


def forward(plan, backend: AttentionBackend, q, k, v, scale: float, comm=None, sink_lse=None):
    """This rank's CP attention forward.

    Args:
        plan: the rank's :class:`~.plan.CPPlan`; ``comm`` (default ``plan.comm``) carries its exchange.
        q, k, v: the rank's rows (``plan.dispatch`` order), ``[B, L, H(_k), D]`` (v: ``D_v``).
        sink_lse: optional fp32 ``[B, H, L]``, each row's learnable sink logit ``sink[h]``: merged
            once into the rows' result after every chunk, as a partial of output 0 and lse
            ``sink[h]`` (so ``lse = logaddexp(lse, sink)``, ``out *= exp(lse_old - lse)``; a row that
            saw no key gets out 0 and lse ``sink[h]``).

    Returns:
        ``(out, lse, remote)``: out in q's dtype, lse fp32 ``[B, H, L]`` (with the sink when given)
        and ``remote``, the received KV ``[(peer, k, v)]`` that :func:`backward` needs.
    """
    comm = plan.comm if comm is None else comm
    lay = plan.layout
    b, _, hk, d = k.shape
    dv = v.shape[-1]  # K and V travel packed on the last axis: d + dv columns (MLA: 192 + 128)
    c = lay.segment_size
    sends = [(p, backend.take_rows(backend.cat_last(k, v), backend.index(plan.send_rows(p), k)))
             for p in plan.send_peers]
    recvs = [(p, backend.empty([b, len(lay.recv[plan.rank][p]) * c, hk, d + dv], k)) for p in plan.recv_peers]
    pending = comm.exchange(sends, recvs) if lay.any_exchange else None
    out, lse = backend.fwd(q, k, v, plan.prepared_mask(backend, "local"), scale)
    acc = backend.f32(out)
    remote = []
    for i, (p, buf) in enumerate(recvs):
        pending.wait_recv(i)
        kp, vp = backend.split_last(buf, d)
        o2, l2 = backend.fwd(q, kp, vp, plan.prepared_mask(backend, p), scale)
        acc, lse = backend.lse_merge(acc, lse, backend.f32(o2), l2)
        remote.append((p, kp, vp))
    if pending is not None:
        pending.wait_all()
    if sink_lse is not None:  # once per row, in fp32, before the cast to q's dtype
        acc, lse = backend.lse_merge(acc, lse, backend.zeros_f32(acc.shape, acc), sink_lse)
    return backend.cast_like(acc, q), lse, remote


def backward(plan, backend: AttentionBackend, q, k, v, out, lse, dout, remote: List, scale: float, comm=None):
    """This rank's CP attention backward (the mirror of :func:`forward`, whose outputs it takes).
    With a sink, ``out`` and ``lse`` are forward's final ones (the sink merged in), which is all
    the kernels need for exact dq, dk, dv; the sink's own gradient is the caller's (``executor``).

    Returns:
        ``(dq, dkv)``: fp32 ``[B, L, H, D]`` and fp32 ``[B, L, H_k, D + D_v]`` (dK and dV of the rank's
        keys, concatenated on the last axis, including the partials its peers sent back).
    """
    comm = plan.comm if comm is None else comm
    lay = plan.layout
    dq = backend.zeros_f32(q.shape, q)
    grad_sends = []
    for p, kp, vp in remote:  # remote partials first, so their transfer overlaps local work
        dq_p, dk_p, dv_p = backend.bwd(q, kp, vp, out, lse, dout, plan.prepared_mask(backend, p), scale)
        dq = dq + backend.f32(dq_p)
        grad_sends.append((p, backend.cat_last(backend.f32(dk_p), backend.f32(dv_p))))
    b, _, hk, d = k.shape
    c = lay.segment_size
    grad_recvs = [(p, backend.empty([b, len(lay.recv[p][plan.rank]) * c, hk, d + v.shape[-1]], k, float32=True))
                  for p in plan.send_peers]
    pending = comm.exchange(grad_sends, grad_recvs) if lay.any_exchange else None
    dq_l, dk_l, dv_l = backend.bwd(q, k, v, out, lse, dout, plan.prepared_mask(backend, "local"), scale)
    dq = dq + backend.f32(dq_l)
    dkv = backend.cat_last(backend.f32(dk_l), backend.f32(dv_l))
    if pending is not None:
        pending.wait_all()
    for p, buf in grad_recvs:
        dkv = backend.index_add_rows(dkv, backend.index(plan.send_rows(p), k), buf)
    return dq, dkv
