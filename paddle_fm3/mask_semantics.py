"""The meaning of a FlashMask (numpy only): the container, the check of a
``startend_row_indices`` array, and the one normalizer of its values (:func:`column_bounds`, the
Python mirror of ``fm3::load_column`` in ops/include/fm3/mask.h) from which the dense form, the
density and the CP localization derive. The semantics table is in :mod:`paddle_fm3.masks`.

Imports nothing but numpy at module level (the GPU test machine has no Paddle);
:meth:`FlashMask.to_paddle` imports Paddle lazily.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from ._checks import MAX_SEQLEN, causal_offset, check_bool, check_int, check_mask_cols

__all__ = ["FlashMask", "validate_startend_row_indices", "column_bounds", "to_dense", "from_dense", "density",
           "document_lengths"]


class FlashMask(NamedTuple):
    """A FlashMask: ``startend_row_indices`` plus the ``causal`` flag it goes with.

    Fields:
        startend_row_indices: ``np.ndarray`` int32 ``[B, H_mask, S_k, C]``.
        causal: ``bool``, the ``causal`` argument to pass to the attention op.
    """

    startend_row_indices: np.ndarray
    causal: bool

    def to_paddle(self):
        """Return ``startend_row_indices`` as a Paddle int32 tensor (imports paddle lazily).

        Raises:
            TypeError: a non-integer array (a float would be truncated).
            ValueError: a value outside int32 (it would wrap). The attention op checks the rest.
        """
        import paddle  # noqa: PLC0415 - deliberately lazy

        arr = np.asarray(self.startend_row_indices)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"startend_row_indices must be an integer array, got dtype {arr.dtype}")
        if arr.size and (int(arr.min()) < -MAX_SEQLEN - 1 or int(arr.max()) > MAX_SEQLEN):
            raise ValueError(f"startend_row_indices values must fit int32, "
                             f"got min {int(arr.min())}, max {int(arr.max())}")
        arr = np.ascontiguousarray(arr, dtype=np.int32)
        return paddle.to_tensor(arr, dtype="int32")

    def to_dense(self, seqlen_q: Optional[int] = None) -> np.ndarray:
        """Dense boolean visibility ``[B, H_mask, S_q, S_k]``; see :func:`to_dense`."""
        return to_dense(self.startend_row_indices, self.causal, seqlen_q)

    def density(self, seqlen_q: Optional[int] = None) -> float:
        """Fraction of visible (query, key) pairs; see :func:`density`."""
        return density(self.startend_row_indices, self.causal, seqlen_q)



def validate_startend_row_indices(startend_row_indices, causal: bool, seqlen_q: Optional[int] = None,
                                  name: str = "startend_row_indices") -> Tuple[np.ndarray, int]:
    """Check a ``startend_row_indices`` array's type and shape; return ``(values, seqlen_q)``.

    The one host-side reading of a mask, shared by ``to_dense``/``density``, ``block_classify``,
    the CP localization and plan. Every integer value has Paddle's meaning (its kernels compare
    row indices against the raw values): a value above ``seqlen_q`` acts as ``seqlen_q`` ("to the
    end"), a negative one as 0, and an interval whose start is past its end (LTS > LTE,
    UTS > UTE) is empty. ``values`` is the array clamped to ``[0, seqlen_q]`` as int64, the same
    clamp as ``fm3::load_column`` (ops/include/fm3/mask.h) applies in every kernel.

    Raises:
        TypeError: not an integer array; ``causal`` not a bool.
        ValueError: not 4-D; C not in {1, 2} (causal) / {2, 4} (non-causal); S_k == 0;
        ``seqlen_q`` not in ``[1, 2^31 - 1]``; a value outside int32.
    """
    causal = check_bool("causal", causal)
    arr = np.asarray(startend_row_indices)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be an integer (int32) array, got dtype {arr.dtype}")
    if arr.ndim != 4:
        raise ValueError(f"{name} must be 4-D [B, H_mask, S_k, C], got shape {arr.shape}")
    check_mask_cols(arr.shape[-1], causal, name)
    if arr.shape[2] < 1:
        raise ValueError(f"{name}: S_k (dimension 2) must be >= 1, got shape {arr.shape}")
    sq = arr.shape[2] if seqlen_q is None else check_int("seqlen_q", seqlen_q, lo=1, hi=MAX_SEQLEN)
    if arr.size and arr.dtype.itemsize >= 4 and (int(arr.min()) < -MAX_SEQLEN - 1 or int(arr.max()) > MAX_SEQLEN):
        raise ValueError(f"{name}: values must fit int32 (Paddle's mask dtype), got min {int(arr.min())}, "
                         f"max {int(arr.max())}")
    return np.clip(arr.astype(np.int64, copy=False), 0, sq), sq


def _causal_first_row(sq: int, sk: int) -> np.ndarray:
    """First query row allowed by bottom-right aligned causality, per key column ([S_k])."""
    return np.clip(np.arange(sk, dtype=np.int64) - causal_offset(sq, sk), 0, sq)


def column_bounds(startend_row_indices, causal: bool, seqlen_q: Optional[int] = None) -> np.ndarray:
    """Each key column's masked query rows as two intervals ``[LTS, LTE) U [UTS, UTE)``.

    The Python mirror of ``fm3::load_column`` (ops/include/fm3/mask.h), which every kernel reads
    the mask through: values clamped to ``[0, S_q]``; the vectors C leaves out filled in
    (causal C=1: ``LTE = S_q``; non-causal C=2: ``LTE = S_q, UTS = 0``); with ``causal``, the
    causal triangle of column ``j`` (rows ``[0, j - (S_k - S_q))``, clamped) as the upper interval.
    :func:`to_dense`, :func:`density` and the CP localization derive from it.

    Args: as :func:`to_dense`.

    Returns:
        int64 ``[B, H_mask, S_k, 4]`` (LTS, LTE, UTS, UTE); an interval with start >= end is empty.

    Raises:
        see :func:`validate_startend_row_indices`.
    """
    arr, sq = validate_startend_row_indices(startend_row_indices, causal, seqlen_q)
    return _column_bounds(arr, bool(causal), sq)


def _column_bounds(arr: np.ndarray, causal: bool, sq: int) -> np.ndarray:
    """:func:`column_bounds` of ``arr``, the values of a validated mask (clamped to ``[0, sq]``)."""
    b, h, sk, c = arr.shape
    out = np.empty((b, h, sk, 4), dtype=np.int64)
    out[..., 0] = arr[..., 0]
    if causal:
        out[..., 1] = arr[..., 1] if c == 2 else sq
        out[..., 2] = 0
        out[..., 3] = _causal_first_row(sq, sk)
    elif c == 2:
        out[..., 1] = sq
        out[..., 2] = 0
        out[..., 3] = arr[..., 1]
    else:
        out[..., 1:] = arr[..., 1:]
    return out


def to_dense(startend_row_indices, causal: bool, seqlen_q: Optional[int] = None) -> np.ndarray:
    """Expand a FlashMask into a dense boolean visibility mask.

    Args:
        startend_row_indices: integer ``[B, H_mask, S_k, C]``.
        causal: the ``causal`` flag the mask goes with.
        seqlen_q: number of query rows S_q (default S_k).

    Returns:
        bool ``[B, H_mask, S_q, S_k]``, True where query row ``i`` may attend key column ``j``.

    Raises:
        see :func:`validate_startend_row_indices`.
    """
    bounds = column_bounds(startend_row_indices, causal, seqlen_q)
    sq = bounds.shape[2] if seqlen_q is None else int(seqlen_q)
    rows = np.arange(sq, dtype=np.int64)[None, None, :, None]
    lts, lte, uts, ute = (bounds[:, :, None, :, k] for k in range(4))  # each [B, H, 1, S_k]
    return ~(((rows >= lts) & (rows < lte)) | ((rows >= uts) & (rows < ute)))


def _runs(x: np.ndarray):
    """Runs of True along axis 2 of ``x`` [B, H, S_q, S_k].

    Returns (number of runs, first run start, first run length, second run start, second run
    length), each [B, H, S_k]; starts/lengths are 0 where the run does not exist.
    """
    prev = np.zeros_like(x)
    prev[:, :, 1:, :] = x[:, :, :-1, :]
    starts = x & ~prev
    nruns = starts.sum(axis=2)
    run_id = np.cumsum(starts, axis=2) * x  # run number (1-based) for True rows, 0 elsewhere
    s1 = np.argmax(starts, axis=2)
    l1 = (run_id == 1).sum(axis=2)
    s2 = np.argmax(starts & (np.cumsum(starts, axis=2) == 2), axis=2)
    l2 = (run_id == 2).sum(axis=2)
    return nruns, s1, l1, s2, l2


def _first_bad(bad: np.ndarray) -> Tuple[int, int, int]:
    b, h, j = np.argwhere(bad)[0]
    return int(b), int(h), int(j)


def from_dense(visible, causal: bool) -> np.ndarray:
    """Inverse of :func:`to_dense`: the smallest-C ``startend_row_indices`` for a dense mask.

    Args:
        visible: bool (or 0/1 integer) ``[B, H, S_q, S_k]`` (a 2-D ``[S_q, S_k]`` is taken as
            ``[1, 1, S_q, S_k]``), True = visible.
        causal: whether to produce a causal (C in {1, 2}) or non-causal (C in {2, 4}) mask.

    Returns:
        int32 ``[B, H, S_k, C]`` with ``to_dense(result, causal, S_q) == visible``. C is 1 (causal)
        or 2 (non-causal) when every column allows it, else 2 (causal) or 4 (non-causal).
        Canonical values: an empty lower interval is ``(S_q, S_q)``, an empty upper interval
        ``(0, 0)``; causal intervals start at or below the causal boundary; a non-causal
        fully-masked column is ``LTS = UTE = 0``; with C=4 a single masked interval goes into
        (LTS, LTE) if it reaches row S_q, else into (UTS, UTE).

    Raises:
        TypeError: ``visible`` not bool / 0-1 integer.
        ValueError: wrong rank, or a column that cannot be represented (the message names the first
        such column: batch, head and key index): for causal, a visible entry above the
        (bottom-right aligned) diagonal or more than one masked interval below it; for non-causal,
        more than two masked intervals.
    """
    causal = check_bool("causal", causal)
    vis = np.asarray(visible)
    if vis.dtype != np.bool_:
        if not np.issubdtype(vis.dtype, np.integer) or (vis.size and not np.isin(vis, (0, 1)).all()):
            raise TypeError(f"visible must be a bool (or 0/1 integer) array, got dtype {vis.dtype}")
        vis = vis.astype(bool)
    if vis.ndim == 2:
        vis = vis[None, None]
    if vis.ndim != 4 or vis.shape[2] < 1 or vis.shape[3] < 1:
        raise ValueError(f"visible must be [B, H, S_q, S_k] (or [S_q, S_k]) with S_q, S_k >= 1, got shape {vis.shape}")
    b, h, sq, sk = vis.shape
    masked = ~vis
    if causal:
        c0 = _causal_first_row(sq, sk)  # [S_k]
        rows = np.arange(sq)[:, None]
        above = rows < c0[None, :]  # [S_q, S_k] causally masked region
        bad = (vis & above).any(axis=2)
        if bad.any():
            bi, hi, j = _first_bad(bad)
            raise ValueError(f"visible is not representable as a causal FlashMask: column j={j} "
                             f"(batch {bi}, head {hi}) has a visible row above the causal diagonal "
                             f"(bottom-right aligned, first allowed row {int(c0[j])})")
        low = masked & ~above
        nruns, s1, l1, _, _ = _runs(low)
        bad = nruns > 1
        if bad.any():
            bi, hi, j = _first_bad(bad)
            raise ValueError(f"visible is not representable as a causal FlashMask: column j={j} "
                             f"(batch {bi}, head {hi}) has {int(nruns[bi, hi, j])} masked row intervals "
                             f"below the causal diagonal; at most 1 is allowed")
        has = nruns == 1
        start = np.where(has, s1, sq)
        end = np.where(has, s1 + l1, sq)
        if (end == sq).all():
            out = start[..., None]
        else:
            out = np.stack([start, end], axis=-1)
        return np.ascontiguousarray(out, dtype=np.int32)

    nvis, vs, vl, _, _ = _runs(vis)
    if (nvis <= 1).all():
        ute = np.where(nvis == 1, vs, 0)
        lts = np.where(nvis == 1, vs + vl, 0)
        return np.ascontiguousarray(np.stack([lts, ute], axis=-1), dtype=np.int32)
    nruns, s1, l1, s2, l2 = _runs(masked)
    bad = nruns > 2
    if bad.any():
        bi, hi, j = _first_bad(bad)
        raise ValueError(f"visible is not representable as a non-causal FlashMask: column j={j} "
                         f"(batch {bi}, head {hi}) has {int(nruns[bi, hi, j])} masked row intervals; "
                         f"at most 2 are allowed")
    e1 = s1 + l1
    e2 = s2 + l2
    one_low = (nruns == 1) & (e1 == sq)
    one_up = (nruns == 1) & ~one_low
    two = nruns == 2
    lts = np.where(two, s2, np.where(one_low, s1, sq))
    lte = np.where(two, e2, np.where(one_low, e1, sq))
    uts = np.where(two | one_up, s1, 0)
    ute = np.where(two | one_up, e1, 0)
    return np.ascontiguousarray(np.stack([lts, lte, uts, ute], axis=-1), dtype=np.int32)


def density(startend_row_indices, causal: bool, seqlen_q: Optional[int] = None) -> float:
    """Fraction of visible (query, key) pairs of a FlashMask, in O(B * H_mask * S_k).

    Args: as :func:`to_dense`.

    Returns:
        float in [0, 1]: ``to_dense(...).mean()``, computed from the vectors without expanding.

    Raises:
        see :func:`validate_startend_row_indices`.
    """
    bounds = column_bounds(startend_row_indices, causal, seqlen_q)
    b, h, sk, _ = bounds.shape
    sq = sk if seqlen_q is None else int(seqlen_q)
    if b * h == 0:
        raise ValueError(f"density of an empty mask (batch {b}, mask heads {h}) is undefined")
    lts, lte, uts, ute = (bounds[..., k] for k in range(4))
    overlap = np.maximum(0, np.minimum(lte, ute) - np.maximum(lts, uts))
    masked = np.maximum(0, lte - lts) + np.maximum(0, ute - uts) - overlap
    return float((sq - masked).sum(dtype=np.int64)) / float(b * h * sq * sk)


def document_lengths(startend_row_indices, causal: bool) -> Optional[List[List[int]]]:
    """The packed documents of a block-diagonal mask, in O(B * H_mask * S): per batch row, the lengths
    of its documents in order, or None where the mask is not block-diagonal (documents, causal or
    not, covering every key; the same on every mask head; S_q = S_k). A mask with one document is
    full or causal attention. This is what a FlashAttention user passes to a varlen call as
    ``cu_seqlens``.

    Args: as :func:`to_dense` (``seqlen_q`` is the keys' length).

    Raises:
        see :func:`validate_startend_row_indices`.
    """
    bounds = column_bounds(startend_row_indices, causal)
    b, h, sk, _ = bounds.shape
    if b * h * sk == 0 or (bounds != bounds[:, :1]).any():
        return None
    lts, lte, uts, ute = (bounds[:, 0, :, k] for k in range(4))
    if (lte != sk).any() or (uts != 0).any():
        return None
    keys = np.arange(sk)
    out = []
    for row in range(b):
        end = lts[row]  # a document [start, end): its keys' masked lower interval starts at its end
        starts = np.flatnonzero(np.concatenate([[True], end[1:] != end[:-1]]))
        run_end = np.append(starts[1:], sk)
        start_of_key = np.repeat(starts, np.diff(np.append(starts, sk)))
        if (end[starts] != run_end).any():
            return None
        # above the diagonal: rows before the document (non-causal) or before the key (causal)
        if (ute[row] != (keys if causal else start_of_key)).any():
            return None
        out.append(np.diff(np.append(starts, sk)).tolist())
    return out
