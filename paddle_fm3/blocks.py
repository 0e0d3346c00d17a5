"""Block classification of (query tile, key block) pairs, the FlashMask block
summary test (arXiv:2410.01359, §4.2), exposed for workload estimates and the
context-parallel plan. The logic itself lives once, in ops/include/fm3/mask.h."""

from __future__ import annotations

import enum

import numpy as np
import paddle

from . import _checks, mask_semantics
from ._ops import ops


class TileClass(enum.IntEnum):
    FULLY_MASKED = 0  # skipped: no load, no math
    PARTIAL = 1       # per-element mask applied
    UNMASKED = 2      # no mask work


def block_classify(startend_row_indices: np.ndarray | paddle.Tensor, *, causal: bool, seqlen_q: int, block_m: int,
                   block_n: int, block_mask: np.ndarray | paddle.Tensor | None = None) -> np.ndarray:
    """Classify every (query tile, key block) pair of a FlashMask mask.

    Args:
        startend_row_indices: int32 ``[batch, H_mask, seqlen_k, C]`` (numpy array or CPU
            paddle.Tensor), meaning as in ``flashmask_attention``.
        causal: whether the causal triangle is part of the mask.
        seqlen_q: number of query rows (mask values are read clamped to ``[0, seqlen_q]``, as in
            ``flashmask_attention``).
        block_m, block_n: tile height (query rows) and block width (key columns), > 0.
        block_mask: optional int32 ``[batch, H_mask, ceil(seqlen_q/128), ceil(seqlen_k/128)]``.

    Returns:
        int32 numpy ``[batch, H_mask, ceil(seqlen_q/block_m), ceil(seqlen_k/block_n)]`` of
        ``TileClass`` values.

    Raises:
        TypeError / ValueError: non-positive sizes, a malformed mask (shape, dtype) or a
        malformed ``block_mask`` (shape, values other than 0/1).
    """
    for name, val in (("seqlen_q", seqlen_q), ("block_m", block_m), ("block_n", block_n)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(val).__name__}")
        if not 1 <= val <= _checks.MAX_SEQLEN:
            raise ValueError(f"{name} must be an int in [1, 2^31 - 1], got {val!r}")
    sri = startend_row_indices
    arr = sri.numpy() if isinstance(sri, paddle.Tensor) else np.asarray(sri)
    if isinstance(sri, paddle.Tensor) and sri.dtype != paddle.int32:
        raise TypeError(f"startend_row_indices must be int32, got {sri.dtype}")
    arr, _ = mask_semantics.validate_startend_row_indices(arr, causal, int(seqlen_q))  # checks causal too; clamps
    sri = paddle.to_tensor(np.ascontiguousarray(arr, dtype=np.int32), place=paddle.CPUPlace())
    if block_mask is not None:
        bm = block_mask.numpy() if isinstance(block_mask, paddle.Tensor) else np.asarray(block_mask)
        want = (arr.shape[0], arr.shape[1], _checks.block_mask_blocks(int(seqlen_q)),
                _checks.block_mask_blocks(arr.shape[2]))
        if bm.shape != want:
            raise ValueError(f"block_mask must have shape [batch, mask_heads, ceil(seqlen_q/128), "
                             f"ceil(seqlen_k/128)] = {list(want)}, got {list(bm.shape)}")
        if not np.isin(bm, (0, 1)).all():
            raise ValueError("block_mask values must be 0 (masked) or 1 (kept)")
        block_mask = paddle.to_tensor(np.ascontiguousarray(bm, dtype=np.int32), place=paddle.CPUPlace())
    out = ops.fm3_block_classify(sri, block_mask,
                                 int(seqlen_q), int(block_m), int(block_n), bool(causal))
    return out.numpy()
