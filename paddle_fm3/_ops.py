"""Load the compiled custom ops (registration generated from yaml/ at build time).

The shared library is registered with Paddle's op registry and each op gets
the Python API function that Paddle's cpp_extension generates for custom ops
(the same code Paddle's own `load`/`setup` install), found by op name on
``ops``. We load the library ourselves because a wheel install keeps its name
as built, next to Paddle's stub of the same name."""

from __future__ import annotations

import pathlib
import types

import paddle
from paddle.base.framework import _global_flags
from paddle.utils.cpp_extension import extension_utils as _eu

_HERE = pathlib.Path(__file__).resolve().parent


def _load() -> types.SimpleNamespace:
    libs = sorted(_HERE.glob("_fm3_ops*.so"))
    if not libs:
        raise ImportError(
            f"paddle_fm3's compiled ops are missing in {_HERE}: install the package with "
            "`pip install --no-build-isolation .` (needs paddlepaddle) or build in place with "
            "`python setup.py build_ext --inplace`. If it is installed, this is probably the source "
            "tree shadowing it: run from outside the repository root.")
    names = _eu.load_op_meta_info_and_register_op(str(libs[0]))
    namespace: dict = {"__name__": __name__}  # dy2static (SOT) reads the functions' __module__
    for name in names:
        exec(_eu._custom_api_content(name), namespace)  # noqa: S102 - Paddle's generated op API
    return types.SimpleNamespace(**{n: namespace[n] for n in names})


ops = _load()


# dy2static (SOT) calls a function marked unified as it is, instead of tracing into the flag registry.
_unified = getattr(getattr(paddle.jit, "marker", None), "unified", lambda fn: fn)  # not in every Paddle 3.x


@_unified
def deterministic_requested() -> bool:
    """Paddle's switch for deterministic kernels, ``FLAGS_cudnn_deterministic``, which Paddle's own
    flash-attention backward follows too. Set, our GPU backward adds dQ in a fixed order (bitwise
    repeatable, slower); the CPU kernel is deterministic either way. Read when the op is recorded (in a
    static graph: when it is built). A Paddle built without CUDA has no such flag: False (asked of the
    registry that ``paddle.get_flags`` reads, which raises for a flag it lacks)."""
    flags, name = _global_flags(), "FLAGS_cudnn_deterministic"
    return bool(flags.is_public(name) and flags[name])


def sink_input(learnable_sink):
    """The ops' ``learnable_sink`` input: the float32 ``[num_heads]`` sink, or for None an empty
    float32 tensor (the ops take it as a required input; yaml/ops.yaml says why)."""
    return paddle.empty([0], dtype="float32") if learnable_sink is None else learnable_sink


def _unrecorded(*tensors):
    """The op's tensor inputs (None stays None), detached when the grad mode is off in dynamic mode:
    Paddle records a custom op's backward whatever the mode (the built-in ops do not), which would
    keep the inputs alive and, for the backward op, record its own backward."""
    if paddle.in_dynamic_mode() and not paddle.is_grad_enabled():
        return tuple(None if t is None else t.detach() for t in tensors)
    return tensors


def attention_forward(q, k, v, startend_row_indices, block_mask, softmax_scale: float, causal: bool,
                      learnable_sink=None):
    """``ops.fm3_flashmask_attention`` (same arguments, the sink as a float32 ``[num_heads]`` tensor or
    None; returns ``[out, softmax_lse]``; its backward deterministic as ``deterministic_requested()``
    says), recording no backward when the grad mode is off (``_unrecorded``), e.g. inside a PyLayer's
    forward."""
    q, k, v, learnable_sink = _unrecorded(q, k, v, learnable_sink)
    return ops.fm3_flashmask_attention(q, k, v, startend_row_indices, block_mask, sink_input(learnable_sink),
                                       softmax_scale, causal, deterministic_requested())


def attention_backward(q, k, v, startend_row_indices, block_mask, out, softmax_lse, out_grad, softmax_scale: float,
                       causal: bool, deterministic: bool, learnable_sink=None):
    """``ops.fm3_flashmask_attention_bwd`` with the sink as a float32 ``[num_heads]`` tensor or None:
    returns ``dq, dk, dv, dsink`` (``dsink`` None without a sink). dq, dk, dv see the sink only through
    ``softmax_lse``; ``dsink`` depends only on ``out``, ``out_grad`` and ``softmax_lse``. Its own
    backward is an error (no second derivative, yaml/backward.yaml), recorded only when the grad mode
    is on (a PyLayer's backward under ``create_graph=True``; ``_unrecorded``)."""
    q, k, v, out, out_grad, learnable_sink = _unrecorded(q, k, v, out, out_grad, learnable_sink)
    dq, dk, dv, dsink = ops.fm3_flashmask_attention_bwd(q, k, v, startend_row_indices, block_mask,
                                                        sink_input(learnable_sink), out, softmax_lse, out_grad,
                                                        softmax_scale, causal, deterministic)
    return dq, dk, dv, (None if learnable_sink is None else dsink)


__all__ = ["ops", "attention_forward", "attention_backward", "deterministic_requested", "sink_input"]
