"""Block classification of (query tile, key block) pairs, the FlashMask block
summary test (arXiv:2410.01359, §4.2), exposed for workload estimates and the
context-parallel plan. The logic itself lives once, in ops/include/fm3/mask.h."""

from __future__ import annotations

import enum

import numpy as np
import paddle

from ._ops import ops


class TileClass(enum.IntEnum):
    FULLY_MASKED = 0  # skipped: no load, no math
    PARTIAL = 1       # per-element mask applied
    UNMASKED = 2      # no mask work


def block_classify(startend_row_indices, *, causal: bool, seqlen_q: int, block_m: int, block_n: int,
                   block_mask=None) -> np.ndarray:
    """Classify every (query tile, key block) pair of a FlashMask mask.

    Args:
        startend_row_indices: int32 ``[batch, H_mask, seqlen_k, C]`` (numpy array or CPU
            paddle.Tensor), meaning as in ``flashmask_attention``.
        causal: whether the causal triangle is part of the mask.
        seqlen_q: number of query rows (values of the mask lie in ``[0, seqlen_q]``).
        block_m, block_n: tile height (query rows) and block width (key columns), > 0.
        block_mask: optional int32 ``[batch, H_mask, ceil(seqlen_q/128), ceil(seqlen_k/128)]``.

    Returns:
        int32 numpy ``[batch, H_mask, ceil(seqlen_q/block_m), ceil(seqlen_k/block_n)]`` of
        ``TileClass`` values.

    Raises:
        ValueError: non-positive sizes or a malformed mask.
    """
    for name, val in (("seqlen_q", seqlen_q), ("block_m", block_m), ("block_n", block_n)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    sri = startend_row_indices
    if not isinstance(sri, paddle.Tensor):
        sri = paddle.to_tensor(np.ascontiguousarray(sri, dtype=np.int32), place=paddle.CPUPlace())
    if sri.dtype != paddle.int32 or len(sri.shape) != 4:
        raise ValueError(f"startend_row_indices must be int32 [B, H_mask, S_k, C], got {sri.dtype} {sri.shape}")
    if sri.shape[3] not in ((1, 2) if causal else (2, 4)):
        raise ValueError(f"startend_row_indices.shape[3]={sri.shape[3]} is not valid for causal={causal}")
    if block_mask is not None and not isinstance(block_mask, paddle.Tensor):
        block_mask = paddle.to_tensor(np.ascontiguousarray(block_mask, dtype=np.int32), place=paddle.CPUPlace())
    out = ops.fm3_block_classify(sri.cpu(), None if block_mask is None else block_mask.cpu(),
                                 int(seqlen_q), int(block_m), int(block_n), bool(causal))
    return out.numpy()
