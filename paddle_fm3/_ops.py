"""The compiled custom ops (generated from yaml/ at build time)."""

try:
    from . import _fm3_ops as ops
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "paddle_fm3's compiled ops are missing: install the package with "
        "`pip install --no-build-isolation .` (needs paddlepaddle) or build in place with "
        "`python setup.py build_ext --inplace`") from e

__all__ = ["ops"]
