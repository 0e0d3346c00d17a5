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


def attention_forward(q, k, v, startend_row_indices, block_mask, softmax_scale: float, causal: bool):
    """``ops.fm3_flashmask_attention`` (same arguments, returns ``[out, softmax_lse]``), recording no
    backward when the grad mode is off: Paddle records one for a custom op whatever the mode (the
    built-in ops do not), which would keep q, k, v alive, e.g. inside a PyLayer's forward."""
    if paddle.in_dynamic_mode() and not paddle.is_grad_enabled():
        q, k, v = q.detach(), k.detach(), v.detach()
    return ops.fm3_flashmask_attention(q, k, v, startend_row_indices, block_mask, softmax_scale, causal)


__all__ = ["ops", "attention_forward"]
