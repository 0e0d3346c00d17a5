"""paddle_fm3: FlashMask-3 mask-aware attention for PaddlePaddle.

- ``flashmask_attention``: drop-in for ``paddle.nn.functional.flashmask_attention``
  (CPU kernels; Hopper kernels where built).
- ``masks``: builders of ``startend_row_indices`` for the standard mask families.
- ``reference``: float64 dense forward/backward, the test oracle.
- ``block_classify``: the (query tile, key block) classification.
- ``kernels``: framework-neutral DLPack binding of the Hopper kernels.
- ``distributed``: context parallelism over ``paddle.distributed``.
- ``integrations.paddleformers``: ``install()`` runs PaddleFormers' flashmask attention on paddle_fm3.
- ``patch_paddle`` / ``unpatch_paddle``: route Paddle's own ``flashmask_attention`` to ours.

``masks``, ``reference`` and ``kernels`` need only numpy, so that machines
without Paddle (the GPU test machines) can import them; the Paddle-facing names
load on first use.
"""

from . import masks, reference

__all__ = ["flashmask_attention", "block_classify", "masks", "reference", "patch_paddle", "unpatch_paddle"]
__version__ = "0.1.0"

_LAZY = {"flashmask_attention": ("api", "flashmask_attention"), "block_classify": ("blocks", "block_classify"),
         "patch_paddle": ("_patch", "patch_paddle"), "unpatch_paddle": ("_patch", "unpatch_paddle")}


def __getattr__(name):
    if name in ("kernels", "distributed", "integrations"):  # subpackages, imported on first use
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
