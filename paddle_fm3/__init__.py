"""paddle_fm3: FlashMask-3 mask-aware attention for PaddlePaddle.

- ``flashmask_attention``: drop-in for ``paddle.nn.functional.flashmask_attention``
  (CPU kernels; Hopper kernels where built).
- ``masks``: builders of ``startend_row_indices`` for the standard mask families.
- ``reference``: float64 dense forward/backward, the test oracle.
- ``distributed``: context parallelism over ``paddle.distributed``.
"""

from . import masks, reference
from .api import flashmask_attention
from .blocks import block_classify

__all__ = ["flashmask_attention", "block_classify", "masks", "reference"]
__version__ = "0.1.0"
