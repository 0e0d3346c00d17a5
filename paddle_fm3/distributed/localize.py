"""Localization of a global FlashMask to one rank's query rows (numpy only, zero communication).

Context parallelism, localization (docs/design.md, "Context parallelism"). A rank owns the query
rows of its segments ``s_0 < s_1 < ... < s_{m-1}`` (each ``segment_size`` rows), stacked in that
order. A global row bound ``r`` maps to the number of the rank's rows below it,

    local(r) = max_b ( b * C + clip(r - s_b * C, 0, C) )   over segments with a positive clip
             (0 if there is none),

which is monotone, so every masked interval ``[a, e)`` of global rows becomes the interval
``[local(a), local(e))`` of local rows holding exactly the rank's rows of ``[a, e)``. Applied
elementwise (clip, shift, max) to LTS/LTE/UTS/UTE. Key columns stay global.

The mask is first normalized to its four vectors by :func:`paddle_fm3.mask_semantics.column_bounds`
(the mirror of ``fm3::load_column``): a causal triangle becomes ``UTS = 0, UTE[j] = j`` (S_q == S_k),
because after re-ordering the local row order no longer follows the key order. The result is
always a non-causal ``C = 4`` mask.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, mask_semantics

__all__ = ["explicit_four_column", "local_row_bound", "localize"]


def explicit_four_column(startend_row_indices, causal: bool) -> np.ndarray:
    """Rewrite any FlashMask as the equivalent non-causal ``C = 4`` mask (LTS, LTE, UTS, UTE).

    Args:
        startend_row_indices: integer ``[B, H_mask, S, C]`` with ``S_q == S_k == S``.
        causal: the ``causal`` flag the mask goes with (C in {1, 2} if True, {2, 4} if False).

    Returns:
        int64 ``[B, H_mask, S, 4]``; for causal masks ``UTS = 0, UTE[j] = j``.

    Raises:
        TypeError / ValueError: as :func:`paddle_fm3.masks.validate_startend_row_indices` (not an
            integer array, wrong rank or C, non-bool causal). Values are read clamped to ``[0, S]``.
    """
    a, s = mask_semantics.validate_startend_row_indices(startend_row_indices, causal)
    return mask_semantics._column_bounds(a, bool(causal), s)  # noqa: SLF001 - the package's one normalizer


def local_row_bound(r, segments, segment_size: int) -> np.ndarray:
    """``local(r)``: number of the rank's rows (segments in ascending order) below global row ``r``.

    Vectorized clip-shift-max: the last segment starting below ``r`` contributes
    ``b * C + clip(r - s_b * C, 0, C)``; rows below every segment map to 0.

    Args:
        r: integer array of global row bounds in ``[0, S]``.
        segments: ascending segment indices owned by the rank.
        segment_size: rows per segment (C).

    Returns:
        int64 array shaped like ``r`` with values in ``[0, len(segments) * C]``.

    Raises:
        TypeError / ValueError: ``segment_size`` not an int >= 1; ``segments`` not a non-empty,
            1-D, strictly ascending list of integer indices >= 0.
    """
    segment_size = _checks.check_int("segment_size", segment_size, lo=1)
    segs = np.asarray(segments)
    if segs.dtype == np.bool_ or not np.issubdtype(segs.dtype, np.integer):
        raise TypeError(f"segments must be integer segment indices, got dtype {segs.dtype}")
    segs = segs.astype(np.int64)
    if segs.ndim != 1 or segs.size == 0 or segs[0] < 0 or np.any(np.diff(segs) <= 0):
        raise ValueError("segments must be a non-empty 1-D strictly ascending list of segment indices >= 0, "
                         f"got {segments!r}")
    r = np.asarray(r, dtype=np.int64)
    starts = segs * segment_size
    b = np.searchsorted(starts, r, side="left") - 1  # last segment with start < r
    bc = np.maximum(b, 0)
    val = bc * segment_size + np.clip(r - starts[bc], 0, segment_size)
    return np.where(b >= 0, val, 0)


def localize(startend_row_indices, causal: bool, segments, segment_size: int) -> np.ndarray:
    """The rank-local mask: the global mask restricted to the rank's query rows.

    Args:
        startend_row_indices: global integer ``[B, H_mask, S, C]`` (``S_q == S_k == S``).
        causal: its causal flag.
        segments: ascending segment indices owned by the rank.
        segment_size: rows per segment.

    Returns:
        int32 ``[B, H_mask, S, 4]``: a non-causal C=4 mask over **global** key columns whose values
        are **local** query rows in ``[0, len(segments) * segment_size]``. Local row ``b*C + t`` is
        global row ``segments[b]*C + t``, and
        ``to_dense(result, False, L) == to_dense(global, causal)[:, :, rows_of_rank, :]``.

    Raises:
        TypeError / ValueError: a bad mask (as :func:`explicit_four_column`) or bad ``segments`` /
            ``segment_size`` (as :func:`local_row_bound`), or segments past the end of the sequence.
    """
    return _localize(explicit_four_column(startend_row_indices, causal), segments, segment_size)


def _localize_checked(startend_row_indices: np.ndarray, causal: bool, segments, segment_size: int) -> np.ndarray:
    """:func:`localize` of a mask that already passed validation (the CP plan checks it once)."""
    four = mask_semantics._column_bounds(startend_row_indices, bool(causal), startend_row_indices.shape[2])  # noqa: SLF001
    return _localize(four, segments, segment_size)


def _localize(four: np.ndarray, segments, segment_size: int) -> np.ndarray:
    s = four.shape[2]
    segment_size = _checks.check_int("segment_size", segment_size, lo=1, hi=s)
    if s % segment_size:
        raise ValueError(f"segment_size ({segment_size}) must divide the sequence length {s}")
    segs = np.asarray(segments)
    if segs.size and segs.ndim == 1 and np.issubdtype(segs.dtype, np.integer) and segs.max() >= s // segment_size:
        raise ValueError(f"segments must be < {s // segment_size} (the number of segments), got {segments!r}")
    return local_row_bound(four, segments, segment_size).astype(np.int32)
