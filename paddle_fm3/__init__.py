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
load on first use. Where Paddle is installed, importing the package registers
the compiled ops with Paddle (``_register_ops``), so that a model saved with
``paddle.jit.save`` loads (``paddle.jit.load``, Paddle Inference) in a process
that has not called the op.
"""

from . import masks, reference

__all__ = ["flashmask_attention", "block_classify", "masks", "reference", "patch_paddle", "unpatch_paddle"]
__version__ = "0.1.0"

_LAZY = {"flashmask_attention": ("api", "flashmask_attention"), "block_classify": ("blocks", "block_classify"),
         "patch_paddle": ("_patch", "patch_paddle"), "unpatch_paddle": ("_patch", "unpatch_paddle")}


def _import(module: str, wanted: str):
    """Imports a submodule; one that needs Paddle says so when Paddle is missing (Paddle is no
    dependency of the package: CPU and GPU users install different distributions of it)."""
    import importlib

    try:
        return importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "paddle":
            raise
        raise ImportError(
            f"paddle_fm3.{wanted} needs PaddlePaddle 3.x, which is not installed: pip install paddlepaddle "
            "(CPU) or paddlepaddle-gpu (CUDA), then reinstall paddle_fm3 (README, Install). "
            "paddle_fm3.masks, paddle_fm3.reference and paddle_fm3.kernels work without Paddle.") from e


def __getattr__(name):
    if name in ("kernels", "distributed", "integrations"):  # subpackages, imported on first use
        return _import(name, name)
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(_import(module, name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_ops() -> None:
    """Load the compiled ops into Paddle's op registry when Paddle is installed: a saved program
    names the op, and Paddle looks it up in the registry when the program is loaded, so it must be
    there before any call of ours (without it ``paddle.jit.load`` crashes and a predictor raises
    ``PreconditionNotMet: op [] kernel output args (0) defs should equal op outputs (2)``). Without
    Paddle, or when the ops do not load (not built, as in the source tree), the numpy-only modules
    still import and the Paddle-facing names say why on first use."""
    try:
        import paddle  # noqa: F401, PLC0415
    except ImportError:
        return
    try:
        from . import _ops  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - not built, or built for another Paddle: the first use raises it again
        return


_register_ops()
