"""FlashMask mask builders and conversions (numpy only).

A FlashMask is a column-wise sparse attention mask, stored as
``startend_row_indices``: an integer array of shape ``[B, H_mask, S_k, C]``
(``int32`` when produced here), indexed by **key column** ``j``, whose values
are **query row** indices in ``[0, S_q]`` (any other int32 value is read as Paddle's kernels
read it: above ``S_q`` as ``S_q``, negative as 0; see :func:`validate_startend_row_indices`).
Its meaning is the one of
``paddle.nn.functional.flashmask_attention`` (Paddle >= 3.0 docs) and of the
FlashMask paper (Wang et al., "FlashMask: Efficient and Rich Mask Extension of
FlashAttention", arXiv:2410.01359, section 3):

======  ===  ======================  ==========================================
causal   C   vectors                 query rows masked for key column ``j``
======  ===  ======================  ==========================================
True     1   LTS                     ``row >= LTS[j]`` (plus the causal part)
True     2   LTS, LTE                ``LTS[j] <= row < LTE[j]`` (plus causal)
False    2   LTS, UTE                ``row >= LTS[j]`` or ``row < UTE[j]``
False    4   LTS, LTE, UTS, UTE      ``LTS[j] <= row < LTE[j]`` or
                                     ``UTS[j] <= row < UTE[j]``
======  ===  ======================  ==========================================

The causal part is bottom-right aligned when ``S_q != S_k`` (as in
FlashAttention >= 2.1): key ``j`` is visible to query row ``i`` only if
``j <= i + (S_k - S_q)``.

Dense masks produced here are boolean arrays of shape ``[B, H_mask, S_q, S_k]``
where ``True`` means *visible* (the query row may attend to the key column).

This module deliberately imports nothing but numpy at module level (the GPU
test machine has no Paddle); :meth:`FlashMask.to_paddle` imports Paddle lazily.
"""

from __future__ import annotations

import numbers
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "FlashMask",
    "full",
    "causal",
    "sliding_window",
    "causal_document",
    "document",
    "share_question",
    "global_sliding_window",
    "causal_blockwise",
    "prefix_lm_causal",
    "prefix_lm_document",
    "qk_sparse",
    "random_eviction",
    "window_to_startend",
    "to_dense",
    "from_dense",
    "density",
    "validate_startend_row_indices",
    "FAMILIES",
]


# ---------------------------------------------------------------------------
# The container
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Argument checking helpers
# ---------------------------------------------------------------------------


MAX_SEQLEN = 2**31 - 1  # row indices are int32


def _check_int(name: str, value, *, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """Return ``value`` as a Python int, or raise TypeError/ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r})")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return value


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return bool(value)


def _check_batch_heads(batch, num_heads) -> Tuple[int, int]:
    return _check_int("batch", batch, lo=1), _check_int("num_heads", num_heads, lo=1)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_seq(x) -> bool:
    return isinstance(x, (list, tuple)) or (isinstance(x, np.ndarray) and x.ndim >= 1)


def _rows_for_batch(rows: list, batch: int, name: str) -> list:
    """Broadcast a single per-sample description over ``batch``, or check a batched one."""
    if len(rows) == 1:
        return rows * batch
    if batch not in (1, len(rows)):
        raise ValueError(
            f"{name} describes {len(rows)} batch rows but batch={batch}; "
            f"pass batch=1 or batch={len(rows)}"
        )
    return rows


def _finish(vectors: np.ndarray, num_heads: int, causal_flag: bool) -> FlashMask:
    """``vectors`` [B, S, C] -> FlashMask with [B, num_heads, S, C] int32."""
    b, s, c = vectors.shape
    out = np.broadcast_to(vectors[:, None, :, :], (b, num_heads, s, c))
    return FlashMask(np.ascontiguousarray(out, dtype=np.int32), bool(causal_flag))


def _normalize_doc_lens(doc_lens, seqlen, batch: int, name: str = "doc_lens") -> List[List[int]]:
    """Turn ``doc_lens`` (list of ints, or list of lists of ints) into ``batch`` rows.

    Every document length must be >= 1; every row must sum to ``seqlen`` (when given) and all
    rows must have the same sum.
    """
    if not _is_seq(doc_lens) or len(doc_lens) == 0:
        raise TypeError(f"{name} must be a non-empty list of ints or a non-empty list of lists of ints")
    if all(_is_int(x) for x in doc_lens):
        rows = [list(doc_lens)]
    elif all(_is_seq(r) for r in doc_lens):
        rows = [list(r) for r in doc_lens]
        for bi, r in enumerate(rows):
            if len(r) == 0 or not all(_is_int(x) for x in r):
                raise TypeError(f"{name}[{bi}] must be a non-empty list of ints, got {r!r}")
    else:
        raise TypeError(f"{name} must be a list of ints or a list of lists of ints, got {doc_lens!r}")
    for bi, r in enumerate(rows):
        for di, x in enumerate(r):
            if x < 1:
                raise ValueError(f"{name}: every document length must be >= 1, got {x} (row {bi}, doc {di})")
    rows = [[int(x) for x in r] for r in rows]
    sums = {sum(r) for r in rows}
    if seqlen is not None:
        seqlen = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
        for bi, r in enumerate(rows):
            if sum(r) != seqlen:
                raise ValueError(f"{name}[{bi}] sums to {sum(r)} but seqlen={seqlen}; they must be equal")
    elif len(sums) != 1:
        raise ValueError(f"all rows of {name} must sum to the same sequence length, got sums {sorted(sums)}")
    if max(sums) > MAX_SEQLEN:
        raise ValueError(f"{name} sums to {max(sums)}; sequences longer than {MAX_SEQLEN} do not fit int32 indices")
    return _rows_for_batch(rows, batch, name)


def _doc_bounds(lens: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """Per-token (start, end) of the document containing that token."""
    ends = np.cumsum(lens)
    starts = ends - np.asarray(lens)
    return np.repeat(starts, lens), np.repeat(ends, lens)


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def full(seqlen: int, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Full (bidirectional, nothing masked) attention.

    Returns a non-causal FlashMask, C=2, with ``LTS = S``, ``UTE = 0`` for every column.
    Shape ``[batch, num_heads, seqlen, 2]`` int32.

    Raises:
        TypeError / ValueError: ``seqlen``, ``batch`` or ``num_heads`` not an integer >= 1.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = _check_batch_heads(batch, num_heads)
    v = np.empty((batch, s, 2), dtype=np.int64)
    v[..., 0] = s
    v[..., 1] = 0
    return _finish(v, num_heads, False)


def causal(seqlen: int, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Plain causal attention: causal FlashMask, C=1, ``LTS = S`` (nothing masked below the diagonal).

    Shape ``[batch, num_heads, seqlen, 1]`` int32.

    Raises:
        TypeError / ValueError: ``seqlen``, ``batch`` or ``num_heads`` not an integer >= 1.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = _check_batch_heads(batch, num_heads)
    return _finish(np.full((batch, s, 1), s, dtype=np.int64), num_heads, True)


def sliding_window(seqlen: int, window: int, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Causal sliding-window attention: query ``i`` sees keys ``[i - window, i]``.

    Causal FlashMask, C=1, ``LTS[j] = min(j + window + 1, S)``; the same as Paddle's
    ``flashmask_attention(..., causal=True, window_size=window)`` and its
    "Sliding Window Mask" doc example (``window=2``, ``S=10``).

    Raises:
        TypeError / ValueError: ``window`` not an integer >= 0; ``seqlen``/``batch``/``num_heads``
        not an integer >= 1.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    w = min(_check_int("window", window, lo=0), s)  # a window past the sequence is the whole causal past
    batch, num_heads = _check_batch_heads(batch, num_heads)
    lts = np.minimum(np.arange(s, dtype=np.int64) + w + 1, s)
    return _finish(np.broadcast_to(lts[None, :, None], (batch, s, 1)), num_heads, True)


def causal_document(doc_lens, seqlen: Optional[int] = None, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Causal attention within each packed document.

    Args:
        doc_lens: list of document lengths (each >= 1) for one sample, broadcast over ``batch``;
            or a list of such lists, one per batch row (all with the same sum).
        seqlen: optional; if given, every row of ``doc_lens`` must sum to it.

    Returns a causal FlashMask, C=1, ``LTS[j] = end of j's document``, shape
    ``[B, num_heads, S, 1]`` int32 (Paddle doc example "Causal Document Mask": ``[4, 3, 3]``).

    Raises:
        TypeError / ValueError: malformed ``doc_lens``, lengths < 1, sum != ``seqlen``, rows of
        different sums, or a ``batch`` that does not match the number of rows.
    """
    batch, num_heads = _check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, batch)
    v = np.stack([_doc_bounds(r)[1] for r in rows])[..., None]
    return _finish(v, num_heads, True)


def document(doc_lens, seqlen: Optional[int] = None, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Bidirectional attention within each packed document.

    Non-causal FlashMask, C=2: ``LTS[j] = end of j's document``, ``UTE[j] = start of j's document``
    (Paddle doc example "Document Mask": ``[4, 3, 3]``). Arguments and errors as in
    :func:`causal_document`.
    """
    batch, num_heads = _check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, batch)
    v = np.stack([np.stack(_doc_bounds(r)[::-1], axis=-1) for r in rows])
    return _finish(v, num_heads, False)


def _normalize_share_question(docs, seqlen, batch) -> List[List[Tuple[int, List[int]]]]:
    def is_sample(x) -> bool:
        return _is_seq(x) and len(x) == 2 and _is_int(x[0])

    if not _is_seq(docs) or len(docs) == 0:
        raise TypeError("docs must be a non-empty list of (question_len, [answer_lens...]) samples "
                        "or a non-empty list of such lists (one per batch row)")
    if all(is_sample(x) for x in docs):
        rows = [list(docs)]
    elif all(_is_seq(r) and len(r) > 0 and all(is_sample(x) for x in r) for r in docs):
        rows = [list(r) for r in docs]
    else:
        raise TypeError(f"docs must be a list of (question_len, [answer_lens...]) samples or a list of "
                        f"such lists, got {docs!r}")
    out_rows = []
    for bi, r in enumerate(rows):
        samples = []
        for si, (q, answers) in enumerate(r):
            if not _is_seq(answers) or not all(_is_int(a) for a in answers):
                raise TypeError(f"docs: answers of sample {si} (row {bi}) must be a list of ints, got {answers!r}")
            if q < 1:
                raise ValueError(f"docs: question_len must be >= 1, got {q} (row {bi}, sample {si})")
            for a in answers:
                if a < 1:
                    raise ValueError(f"docs: every answer length must be >= 1, got {a} (row {bi}, sample {si})")
            samples.append((int(q), [int(a) for a in answers]))
        out_rows.append(samples)
    totals = [sum(q + sum(a) for q, a in r) for r in out_rows]
    if seqlen is not None:
        seqlen = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
        for bi, t in enumerate(totals):
            if t != seqlen:
                raise ValueError(f"docs[{bi}] has total length {t} but seqlen={seqlen}; they must be equal")
    elif len(set(totals)) != 1:
        raise ValueError(f"all rows of docs must have the same total length, got {sorted(set(totals))}")
    if max(totals) > MAX_SEQLEN:
        raise ValueError(f"docs has total length {max(totals)}; sequences longer than {MAX_SEQLEN} do not fit "
                         "int32 indices")
    return _rows_for_batch(out_rows, batch, "docs")


def share_question(docs, seqlen: Optional[int] = None, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Share-question mask (packed samples, each one question followed by several answers).

    Within a sample, attention is causal; every answer sees the question and (causally) itself,
    but not its sibling answers; samples do not see each other.

    Args:
        docs: list of ``(question_len, [answer_len, ...])`` per packed sample (question_len >= 1,
            answer lengths >= 1, answers may be empty), broadcast over ``batch``; or a list of such
            lists, one per batch row (all with the same total length).
        seqlen: optional; total length must equal it.

    Returns a causal FlashMask, C=1: question columns have ``LTS`` = end of the sample, answer
    columns ``LTS`` = end of that answer (Paddle doc example "Share Question Mask":
    ``[(4, [3, 3])]``).

    Raises:
        TypeError / ValueError: malformed ``docs``, lengths < 1, total != ``seqlen``.
    """
    batch, num_heads = _check_batch_heads(batch, num_heads)
    rows = _normalize_share_question(docs, seqlen, batch)
    vecs = []
    for r in rows:
        lts = []
        for q, answers in r:
            end = len(lts) + q + sum(answers)
            lts.extend([end] * q)
            pos = len(lts)
            for a in answers:
                pos += a
                lts.extend([pos] * a)
        vecs.append(lts)
    return _finish(np.asarray(vecs, dtype=np.int64)[..., None], num_heads, True)


def global_sliding_window(seqlen: int, global_tokens: int, window: int, *,
                          batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Global + sliding-window (bidirectional) mask.

    The first ``global_tokens`` rows see every key and the first ``global_tokens`` columns are
    seen by every query; any other (i, j) is visible iff ``|i - j| <= window``.

    Non-causal FlashMask, C=4 (LTS, LTE, UTS, UTE). For a global column: ``(S, S, 0, 0)``;
    otherwise the lower masked interval is ``[min(j+window+1, S), S)`` and the upper one
    ``[global_tokens, j-window)`` (written ``(0, 0)`` when empty), exactly as Paddle's doc example
    "Global + Sliding Window Mask" (``S=10, global_tokens=2, window=1``).

    Raises:
        TypeError / ValueError: ``global_tokens`` not in ``[0, S]``; ``window`` < 0.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    g = _check_int("global_tokens", global_tokens, lo=0, hi=s)
    w = min(_check_int("window", window, lo=0), s)  # a window past the sequence covers it all
    batch, num_heads = _check_batch_heads(batch, num_heads)
    j = np.arange(s, dtype=np.int64)
    lts = np.minimum(j + w + 1, s)
    lte = np.full(s, s, dtype=np.int64)
    ute = j - w
    has_upper = ute > g
    uts = np.where(has_upper, g, 0)
    ute = np.where(has_upper, ute, 0)
    is_global = j < g
    lts = np.where(is_global, s, lts)
    uts = np.where(is_global, 0, uts)
    ute = np.where(is_global, 0, ute)
    v = np.stack([lts, lte, uts, ute], axis=-1)
    return _finish(np.broadcast_to(v[None], (batch, s, 4)), num_heads, False)


def causal_blockwise(doc_lens, seqlen: Optional[int] = None, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Causal blockwise mask: causal within each block; the last block also sees all earlier blocks.

    Args: as in :func:`causal_document` (``doc_lens`` are the block lengths).

    Causal FlashMask, C=2: a column of a non-last block has masked rows
    ``[end of its block, start of the last block)``; empty intervals are written ``(S, S)``
    (Paddle doc example "Causal Blockwise Mask": blocks ``[4, 3, 3]``).
    """
    batch, num_heads = _check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, batch)
    vecs = []
    for r in rows:
        s = sum(r)
        _, ends = _doc_bounds(r)
        last_start = s - r[-1]
        lts = ends.copy()
        lte = np.full(s, last_start, dtype=np.int64)
        empty = lts >= lte
        lts[empty] = s
        lte[empty] = s
        vecs.append(np.stack([lts, lte], axis=-1))
    return _finish(np.stack(vecs), num_heads, True)


def prefix_lm_causal(seqlen: int, prefix_len: int, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Prefix-LM mask: the first ``prefix_len`` tokens attend bidirectionally, the rest causally.

    Non-causal FlashMask, C=2: ``LTS = S``; ``UTE[j] = 0`` for ``j < prefix_len``, else ``j``
    (Paddle doc example "Prefix LM Causal Mask": ``S=10, prefix_len=5``).

    Raises:
        TypeError / ValueError: ``prefix_len`` not in ``[0, seqlen]``.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    p = _check_int("prefix_len", prefix_len, lo=0, hi=s)
    batch, num_heads = _check_batch_heads(batch, num_heads)
    j = np.arange(s, dtype=np.int64)
    v = np.stack([np.full(s, s, dtype=np.int64), np.where(j < p, 0, j)], axis=-1)
    return _finish(np.broadcast_to(v[None], (batch, s, 2)), num_heads, False)


def prefix_lm_document(doc_lens, prefix_lens, seqlen: Optional[int] = None, *,
                       batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Prefix-LM within each packed document.

    Args:
        doc_lens: as in :func:`causal_document`.
        prefix_lens: same structure as ``doc_lens``; ``prefix_lens[d]`` in ``[0, doc_lens[d]]``
            tokens at the start of document ``d`` attend bidirectionally (within the document).

    Non-causal FlashMask, C=2: ``LTS[j]`` = end of j's document; ``UTE[j]`` = start of j's
    document if j is in its prefix, else ``j`` (Paddle doc example "Prefix LM Document Mask":
    docs ``[3, 2, 5]``, prefixes ``[2, 2, 2]``).

    Raises:
        TypeError / ValueError: as :func:`causal_document`, plus a ``prefix_lens`` whose structure
        differs from ``doc_lens`` or whose entries fall outside ``[0, doc_len]``.
    """
    batch, num_heads = _check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, 1)  # raw rows; broadcast over batch below
    if not _is_seq(prefix_lens) or len(prefix_lens) == 0:
        raise TypeError("prefix_lens must be a list of ints (or list of lists) matching doc_lens")
    if all(_is_int(x) for x in prefix_lens):
        prows = [list(prefix_lens)]
    elif all(_is_seq(r) and all(_is_int(x) for x in r) for r in prefix_lens):
        prows = [list(r) for r in prefix_lens]
    else:
        raise TypeError(f"prefix_lens must be a list of ints or a list of lists of ints, got {prefix_lens!r}")
    if len(prows) == 1 and len(rows) > 1:
        prows = prows * len(rows)
    if len(prows) != len(rows):
        raise ValueError(f"prefix_lens has {len(prows)} rows but doc_lens has {len(rows)}")
    for bi, (r, pr) in enumerate(zip(rows, prows)):
        if len(pr) != len(r):
            raise ValueError(f"prefix_lens[{bi}] has {len(pr)} entries but doc_lens[{bi}] has {len(r)} documents")
        for di, (d, p) in enumerate(zip(r, pr)):
            if not 0 <= p <= d:
                raise ValueError(f"prefix_lens: entry {p} (row {bi}, doc {di}) must be in [0, {d}]")
    rows = _rows_for_batch(rows, batch, "doc_lens")
    prows = _rows_for_batch(prows, batch, "prefix_lens")
    vecs = []
    for r, pr in zip(rows, prows):
        starts, ends = _doc_bounds(r)
        pref_end = starts + np.repeat(np.asarray(pr, dtype=np.int64), r)
        j = np.arange(len(starts), dtype=np.int64)
        vecs.append(np.stack([ends, np.where(j < pref_end, starts, j)], axis=-1))
    return _finish(np.stack(vecs), num_heads, False)


def _normalize_spans(spans, s: int, batch: int) -> List[List[Tuple[int, int, int, int]]]:
    def is_span(x) -> bool:
        return _is_seq(x) and len(x) == 4 and all(_is_int(t) for t in x)

    if not _is_seq(spans):
        raise TypeError(f"spans must be a list of (k_start, k_end, q_start, q_end) tuples, got {spans!r}")
    if len(spans) == 0 or all(is_span(x) for x in spans):
        rows = [list(spans)]
    elif all(_is_seq(r) and all(is_span(x) for x in r) for r in spans):
        rows = [list(r) for r in spans]
    else:
        raise TypeError(f"spans must be a list of (k_start, k_end, q_start, q_end) tuples or a list "
                        f"of such lists (one per batch row), got {spans!r}")
    for bi, r in enumerate(rows):
        covered = np.zeros(s, dtype=bool)
        for si, (ks, ke, qs, qe) in enumerate(r):
            if not 0 <= ks < ke <= s:
                raise ValueError(f"spans: key range [{ks}, {ke}) of span {si} (row {bi}) must satisfy "
                                 f"0 <= k_start < k_end <= seqlen={s}")
            if not 0 <= qs <= qe <= s:
                raise ValueError(f"spans: query range [{qs}, {qe}) of span {si} (row {bi}) must satisfy "
                                 f"0 <= q_start <= q_end <= seqlen={s}")
            if covered[ks:ke].any():
                raise ValueError(f"spans: key range [{ks}, {ke}) of span {si} (row {bi}) overlaps an "
                                 f"earlier span; key ranges must be disjoint (C=2 holds one interval per column)")
            covered[ks:ke] = True
    return _rows_for_batch([[tuple(int(t) for t in x) for x in r] for r in rows], batch, "spans")


def qk_sparse(seqlen: int, spans=None, *, num_spans: int = 2, seed: int = 0,
              batch: int = 1, num_heads: int = 1) -> FlashMask:
    """QK-sparse mask: causal attention where some key ranges are hidden from some query ranges.

    Args:
        seqlen: sequence length S.
        spans: list of ``(k_start, k_end, q_start, q_end)``: query rows ``[q_start, q_end)`` cannot
            see keys ``[k_start, k_end)`` (on top of causality). Key ranges must be disjoint. A list
            of such lists gives one per batch row. If None, ``num_spans`` random spans are drawn per
            batch row with ``np.random.default_rng(seed)``: disjoint key ranges, each hidden from a
            query range that starts at or after the key range's start.
        num_spans: number of random spans (ignored when ``spans`` is given).
        seed: seed of the random spans.

    Causal FlashMask, C=2: for ``j`` in a span, ``LTS[j] = max(j, q_start)`` and
    ``LTE[j] = max(LTS[j], q_end)``; other columns ``(S, S)``. Paddle's doc example "QK-sparse
    Mask" is ``qk_sparse(10, spans=[(2, 6, 2, 5), (6, 8, 5, 8)])`` exactly.

    Raises:
        TypeError / ValueError: malformed or out-of-range spans, overlapping key ranges,
        ``num_spans`` < 0.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = _check_batch_heads(batch, num_heads)
    if spans is None:
        n = _check_int("num_spans", num_spans, lo=0)
        rng = np.random.default_rng(_check_int("seed", seed, lo=0))
        rows = []
        for _ in range(batch):
            k = min(2 * n, s + 1)
            k -= k % 2
            pts = np.sort(rng.choice(s + 1, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)
            r = []
            for ks, ke in zip(pts[0::2], pts[1::2]):
                qs = int(rng.integers(ks, s))
                qe = int(rng.integers(qs + 1, s + 1))
                r.append((int(ks), int(ke), qs, qe))
            rows.append(r)
    else:
        rows = _normalize_spans(spans, s, batch)
    vecs = []
    j = np.arange(s, dtype=np.int64)
    for r in rows:
        lts = np.full(s, s, dtype=np.int64)
        lte = np.full(s, s, dtype=np.int64)
        for ks, ke, qs, qe in r:
            jj = j[ks:ke]
            lts[ks:ke] = np.maximum(jj, qs)
            lte[ks:ke] = np.maximum(lts[ks:ke], qe)
        vecs.append(np.stack([lts, lte], axis=-1))
    return _finish(np.stack(vecs), num_heads, True)


def random_eviction(seqlen: int, *, seed: int = 0, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Random-eviction mask (FlashMask paper, arXiv:2410.01359, "Random Eviction Mask").

    Causal attention in which every key column ``j`` is evicted (masked) from a random query row
    ``LTS[j]`` onwards, drawn uniformly from ``(j, S]`` (``LTS[j] = S``: never evicted), so every
    query still sees at least itself. Draws are independent for every (batch, head) row (KV
    eviction is per head), from ``np.random.default_rng(seed)``.

    Causal FlashMask, C=1, shape ``[batch, num_heads, S, 1]`` int32.

    Raises:
        TypeError / ValueError: ``seed`` not an integer >= 0, bad ``seqlen``/``batch``/``num_heads``.
    """
    s = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = _check_batch_heads(batch, num_heads)
    rng = np.random.default_rng(_check_int("seed", seed, lo=0))
    j = np.arange(s, dtype=np.int64)
    lts = rng.integers(j + 1, s + 1, size=(batch, num_heads, s))
    return FlashMask(np.ascontiguousarray(lts[..., None], dtype=np.int32), True)


# ---------------------------------------------------------------------------
# Paddle's window_size
# ---------------------------------------------------------------------------


def window_to_startend(window_size, seqlen_q: int, seqlen_k: Optional[int] = None, batch: int = 1,
                       causal: bool = False) -> np.ndarray:
    """Convert Paddle's ``window_size`` into ``startend_row_indices`` exactly as Paddle does.

    ``paddle.nn.functional.flashmask_attention(..., window_size=...)`` builds, for key column
    ``j in range(seqlen_k)`` (``w = (w, w)`` for an int):

    - ``causal=True``: C=1, ``LTS[j] = min(j + w[0] + 1, seqlen_q)`` (query ``i`` sees ``[i-w[0], i]``);
    - ``causal=False``: C=2, ``[clip(j + w[0] + 1, 0, seqlen_q), clip(j - w[1], 0, seqlen_q)]``
      (query ``i`` sees ``[i-w[0], i+w[1]]``).

    Note that the window is expressed in raw row indices (top-left aligned), as in Paddle, even
    though the causal part is bottom-right aligned when ``seqlen_q != seqlen_k``.

    Returns:
        int32 ``[batch, 1, seqlen_k, C]``.

    Raises:
        TypeError: ``window_size`` not an int or a pair of ints.
        ValueError: negative window, bad ``seqlen_q``/``seqlen_k``/``batch``.
    """
    if _is_int(window_size):
        w0 = w1 = int(window_size)
    elif _is_seq(window_size) and len(window_size) == 2 and all(_is_int(x) for x in window_size):
        w0, w1 = int(window_size[0]), int(window_size[1])
    else:
        raise TypeError(f"window_size must be an int or a (left, right) pair of ints, got {window_size!r}")
    if w0 < 0 or w1 < 0:
        raise ValueError(f"window_size must be >= 0, got {window_size!r}")
    sq = _check_int("seqlen_q", seqlen_q, lo=1, hi=MAX_SEQLEN)
    sk = sq if seqlen_k is None else _check_int("seqlen_k", seqlen_k, lo=1, hi=MAX_SEQLEN)
    batch = _check_int("batch", batch, lo=1)
    w0, w1 = min(w0, sq + sk), min(w1, sq + sk)  # wider windows change nothing; avoids int64 overflow
    causal = _check_bool("causal", causal)
    j = np.arange(sk, dtype=np.int64)
    if causal:
        v = np.minimum(j + w0 + 1, sq)[:, None]
    else:
        v = np.stack([np.clip(j + w0 + 1, 0, sq), np.clip(j - w1, 0, sq)], axis=-1)
    return np.ascontiguousarray(np.broadcast_to(v[None, None], (batch, 1) + v.shape), dtype=np.int32)


# ---------------------------------------------------------------------------
# Dense conversion, inverse, density
# ---------------------------------------------------------------------------


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
    causal = _check_bool("causal", causal)
    arr = np.asarray(startend_row_indices)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be an integer (int32) array, got dtype {arr.dtype}")
    if arr.ndim != 4:
        raise ValueError(f"{name} must be 4-D [B, H_mask, S_k, C], got shape {arr.shape}")
    c = arr.shape[-1]
    allowed = (1, 2) if causal else (2, 4)
    if c not in allowed:
        raise ValueError(f"{name}: with causal={causal} the last dimension C must be one of {allowed}, got {c}")
    if arr.shape[2] < 1:
        raise ValueError(f"{name}: S_k (dimension 2) must be >= 1, got shape {arr.shape}")
    sq = arr.shape[2] if seqlen_q is None else _check_int("seqlen_q", seqlen_q, lo=1, hi=MAX_SEQLEN)
    if arr.size and arr.dtype.itemsize >= 4 and (int(arr.min()) < -MAX_SEQLEN - 1 or int(arr.max()) > MAX_SEQLEN):
        raise ValueError(f"{name}: values must fit int32 (Paddle's mask dtype), got min {int(arr.min())}, "
                         f"max {int(arr.max())}")
    return np.clip(arr.astype(np.int64, copy=False), 0, sq), sq


def _causal_first_row(sq: int, sk: int) -> np.ndarray:
    """First query row allowed by bottom-right aligned causality, per key column ([S_k])."""
    return np.clip(np.arange(sk, dtype=np.int64) - (sk - sq), 0, sq)


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
    arr, sq = validate_startend_row_indices(startend_row_indices, causal, seqlen_q)
    sk = arr.shape[2]
    c = arr.shape[-1]
    rows = np.arange(sq, dtype=np.int64)[None, None, :, None]
    vec = [arr[:, :, None, :, k] for k in range(c)]  # each [B, H, 1, S_k]
    if causal:
        masked = rows >= vec[0]
        if c == 2:
            masked &= rows < vec[1]
        cols = np.arange(sk, dtype=np.int64)[None, None, None, :]
        masked = masked | (cols > rows + (sk - sq))
    elif c == 2:
        masked = (rows >= vec[0]) | (rows < vec[1])
    else:
        masked = ((rows >= vec[0]) & (rows < vec[1])) | ((rows >= vec[2]) & (rows < vec[3]))
    return ~masked


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
    causal = _check_bool("causal", causal)
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
    arr, sq = validate_startend_row_indices(startend_row_indices, causal, seqlen_q)
    b, h, sk, c = arr.shape
    if b * h == 0:
        raise ValueError(f"density of an empty mask (batch {b}, mask heads {h}) is undefined")
    if causal:
        c0 = _causal_first_row(sq, sk)[None, None, :]
        allowed = sq - c0
        lts = arr[..., 0]
        if c == 1:
            vis = np.clip(lts, c0, sq) - c0
        else:
            overlap = np.maximum(0, np.minimum(arr[..., 1], sq) - np.maximum(lts, c0))
            vis = allowed - overlap
    elif c == 2:
        vis = np.maximum(0, arr[..., 0] - arr[..., 1])
    else:
        lts, lte, uts, ute = (arr[..., k] for k in range(4))
        la = np.maximum(0, lte - lts)
        ua = np.maximum(0, ute - uts)
        inter = np.maximum(0, np.minimum(lte, ute) - np.maximum(lts, uts))
        vis = sq - la - ua + inter
    return float(vis.sum(dtype=np.int64)) / float(b * h * sq * sk)


# ---------------------------------------------------------------------------
# Representative instances of every family
# ---------------------------------------------------------------------------


def _random_doc_lens(s: int, rng: np.random.Generator, max_docs: int = 6) -> List[int]:
    n = int(rng.integers(1, min(s, max_docs) + 1))
    cuts = np.sort(rng.choice(np.arange(1, s), size=n - 1, replace=False)) if n > 1 else np.zeros(0, np.int64)
    return [int(x) for x in np.diff(np.concatenate([[0], cuts, [s]]))]


def _random_share_question(s: int, rng: np.random.Generator) -> List[Tuple[int, List[int]]]:
    docs = []
    for d in _random_doc_lens(s, rng, max_docs=3):
        q = int(rng.integers(1, d + 1))
        rest = d - q
        docs.append((q, _random_doc_lens(rest, rng, max_docs=4) if rest else []))
    return docs


def _family_full(s, rng, **kw):
    return full(s, **kw)


def _family_causal(s, rng, **kw):
    return causal(s, **kw)


def _family_sliding_window(s, rng, **kw):
    return sliding_window(s, int(rng.integers(0, max(1, s // 4) + 1)), **kw)


def _family_causal_document(s, rng, batch=1, **kw):
    return causal_document([_random_doc_lens(s, rng) for _ in range(batch)], s, **kw)


def _family_document(s, rng, batch=1, **kw):
    return document([_random_doc_lens(s, rng) for _ in range(batch)], s, **kw)


def _family_share_question(s, rng, batch=1, **kw):
    return share_question([_random_share_question(s, rng) for _ in range(batch)], s, **kw)


def _family_global_sliding_window(s, rng, **kw):
    g = int(rng.integers(0, max(1, s // 8) + 1))
    w = int(rng.integers(0, max(1, s // 4) + 1))
    return global_sliding_window(s, g, w, **kw)


def _family_causal_blockwise(s, rng, batch=1, **kw):
    return causal_blockwise([_random_doc_lens(s, rng) for _ in range(batch)], s, **kw)


def _family_prefix_lm_causal(s, rng, **kw):
    return prefix_lm_causal(s, int(rng.integers(0, s + 1)), **kw)


def _family_prefix_lm_document(s, rng, batch=1, **kw):
    docs = [_random_doc_lens(s, rng) for _ in range(batch)]
    prefixes = [[int(rng.integers(0, d + 1)) for d in r] for r in docs]
    return prefix_lm_document(docs, prefixes, s, **kw)


def _family_qk_sparse(s, rng, **kw):
    return qk_sparse(s, num_spans=int(rng.integers(1, 4)), seed=int(rng.integers(0, 2**31)), **kw)


def _family_random_eviction(s, rng, **kw):
    return random_eviction(s, seed=int(rng.integers(0, 2**31)), **kw)


def _family(fn: Callable[..., FlashMask]) -> Callable[..., FlashMask]:
    """Checks the arguments every family instance takes, then builds it."""
    def build(seqlen, rng, *, batch=1, num_heads=1) -> FlashMask:
        seqlen = _check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        batch, num_heads = _check_batch_heads(batch, num_heads)
        return fn(seqlen, rng, batch=batch, num_heads=num_heads)
    build.__name__ = build.__qualname__ = fn.__name__.lstrip("_")
    build.__doc__ = fn.__doc__
    return build


#: name -> ``callable(seqlen, rng, *, batch=1, num_heads=1) -> FlashMask``: a representative,
#: randomized instance of each of the 12 mask families of the FlashMask paper / Paddle docs, valid
#: for any ``seqlen >= 1``. Document-based families draw different document lengths per batch row.
FAMILIES: Dict[str, Callable[..., FlashMask]] = {
    "full": _family(_family_full),
    "causal": _family(_family_causal),
    "sliding_window": _family(_family_sliding_window),
    "causal_document": _family(_family_causal_document),
    "document": _family(_family_document),
    "share_question": _family(_family_share_question),
    "global_sliding_window": _family(_family_global_sliding_window),
    "causal_blockwise": _family(_family_causal_blockwise),
    "prefix_lm_causal": _family(_family_prefix_lm_causal),
    "prefix_lm_document": _family(_family_prefix_lm_document),
    "qk_sparse": _family(_family_qk_sparse),
    "random_eviction": _family(_family_random_eviction),
}
