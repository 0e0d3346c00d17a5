"""Moving ``[B, S, ...]`` Paddle tensors between global order and one rank's segments.

``dispatch`` keeps this rank's rows (``take_rows``); ``undispatch`` all-gathers every rank's
rows and restores global order, and its backward keeps this rank's slice of the incoming gradient
(each rank is assumed to compute the same loss on the global tensor). ``CPPlan.dispatch`` /
``CPPlan.undispatch`` call these.
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle.autograd import PyLayer

__all__ = ["dispatch", "undispatch", "take_rows"]


def take_rows(x, index, axis: int = 1):
    """``paddle.index_select(x, index, axis)`` (differentiable) for every dtype of the CP path: on
    the CPU Paddle's index_select has no float16 kernel, so there float16 rows are selected in
    float32 (exact both ways: every float16 is a float32) and the gradient comes back in float16.
    The one row selection of CP (dispatch, undispatch, the executor's KV rows)."""
    if x.dtype == paddle.float16 and x.place.is_cpu_place():
        return paddle.index_select(x.astype("float32"), index, axis=axis).astype(x.dtype)
    return paddle.index_select(x, index, axis=axis)


def _check_axis(fn: str, x, axis) -> int:
    if not isinstance(x, paddle.Tensor):
        raise TypeError(f"{fn}: x must be a paddle.Tensor, got {type(x).__name__}")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -len(x.shape) <= axis < len(x.shape):
        raise ValueError(f"{fn}: axis must be an int in [-{len(x.shape)}, {len(x.shape)}), got {axis!r}")
    return axis % len(x.shape)


def _cached_index(plan, key, place, rows_fn):
    """An int64 index tensor on ``place``, cached in the plan."""
    key = (key, str(place))
    if key not in plan._cache:
        plan._cache[key] = paddle.to_tensor(rows_fn(), dtype="int64", place=place)
    return plan._cache[key]


def _local_index(plan, place):
    return _cached_index(plan, "idx", place, lambda: plan.kv_rows("local"))


def _inverse_index(plan, place):
    def rows():
        order = plan._rows(plan.layout.segments.reshape(-1))  # global row of each gathered row
        inv = np.empty_like(order)
        inv[order] = np.arange(order.size)
        return inv

    return _cached_index(plan, "inv", place, rows)


def dispatch(plan, x, axis: int = 1):
    """Global ``x`` (``x.shape[axis] == S``, identical on every rank) -> this rank's segments in
    ascending order (``x.shape[axis] == S / P``). Differentiable (``take_rows``).

    Raises:
        TypeError: ``x`` is not a paddle.Tensor. ValueError: a bad ``axis`` or ``x.shape[axis] != S``.
    """
    axis = _check_axis("dispatch", x, axis)
    if x.shape[axis] != plan.layout.seqlen:
        raise ValueError(f"dispatch: x.shape[{axis}] must be the global seqlen {plan.layout.seqlen}, "
                         f"got {x.shape[axis]}")
    return take_rows(x, _local_index(plan, x.place), axis=axis)


class _Undispatch(PyLayer):
    @staticmethod
    def forward(ctx, x, plan, axis):
        ctx.plan, ctx.axis = plan, axis
        parts = plan.comm.all_gather(x.contiguous())
        full = paddle.concat(parts, axis=axis)
        return take_rows(full, _inverse_index(plan, x.place), axis=axis)

    @staticmethod
    def backward(ctx, dy):
        return take_rows(dy, _local_index(ctx.plan, dy.place), axis=ctx.axis)


def undispatch(plan, x, axis: int = 1):
    """This rank's ``x`` (``x.shape[axis] == S / P``) -> the global tensor on every rank (all-gather,
    which every rank of the group must call).

    Raises:
        TypeError: ``x`` is not a paddle.Tensor. ValueError: a bad ``axis`` or ``x.shape[axis] != S / P``.
        RuntimeError: on every rank, when the ranks' ``x`` differ in shape or dtype.
    """
    axis = _check_axis("undispatch", x, axis)
    if x.shape[axis] != plan.local_seqlen:
        raise ValueError(f"undispatch: x.shape[{axis}] must be the local seqlen {plan.local_seqlen}, "
                         f"got {x.shape[axis]}")
    # Ranks gathering different shapes or dtypes once aborted the process inside gloo.
    plan.check_call_agreement("undispatch [axis, shape, dtype]", [axis, list(x.shape), str(x.dtype)])
    return _Undispatch.apply(x, plan, axis)
