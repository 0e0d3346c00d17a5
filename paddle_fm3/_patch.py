"""patch_paddle / unpatch_paddle: route Paddle's own flashmask_attention to paddle_fm3's."""

from __future__ import annotations

import paddle.nn.functional as F
import paddle.nn.functional.flash_attention as _flash_attention

from .api import flashmask_attention

# Paddle exposes the function under both names; code may import it from either.
_TARGETS = (F, _flash_attention)
_originals: dict = {}  # module -> Paddle's function, while patched


def patch_paddle() -> None:
    """Make ``paddle.nn.functional.flashmask_attention`` and
    ``paddle.nn.functional.flash_attention.flashmask_attention`` call
    ``paddle_fm3.flashmask_attention`` (same signature). Idempotent.

    Import-order rule: this replaces the two module attributes, so it reaches code that looks
    the function up at call time (``F.flashmask_attention(...)``) and code that runs
    ``from paddle.nn.functional.flash_attention import flashmask_attention`` *after* the patch.
    A module that imported the name before keeps Paddle's function: call ``patch_paddle()``
    before importing such code. PaddleFormers imports it when its attention module loads, so
    for PaddleFormers use ``paddle_fm3.integrations.paddleformers.install()`` instead, which
    works in either order.
    """
    for module in _TARGETS:
        current = module.flashmask_attention
        if current is not flashmask_attention:
            _originals[module] = current
            module.flashmask_attention = flashmask_attention


def unpatch_paddle() -> None:
    """Restore Paddle's own ``flashmask_attention`` under both names. Idempotent; a no-op when
    not patched."""
    for module, original in list(_originals.items()):
        if module.flashmask_attention is flashmask_attention:
            module.flashmask_attention = original
        del _originals[module]
