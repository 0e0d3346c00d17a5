"""Builders of ``startend_row_indices`` for the mask families of the FlashMask paper / Paddle docs,
and Paddle's ``window_size`` conversion (numpy only). Semantics: :mod:`paddle_fm3.masks`."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ._checks import (MAX_SEQLEN, causal_offset, check_batch_heads, check_bool, check_int, is_int, is_seq,
                      normalize_window_size)
from .mask_semantics import FlashMask

__all__ = ["full", "causal", "sliding_window", "causal_document", "causal_document_padded", "document",
           "share_question", "global_sliding_window", "causal_blockwise", "prefix_lm_causal", "prefix_lm_document",
           "qk_sparse", "random_eviction", "window_to_startend"]


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
    if not is_seq(doc_lens) or len(doc_lens) == 0:
        raise TypeError(f"{name} must be a non-empty list of ints or a non-empty list of lists of ints")
    if all(is_int(x) for x in doc_lens):
        rows = [list(doc_lens)]
    elif all(is_seq(r) for r in doc_lens):
        rows = [list(r) for r in doc_lens]
        for bi, r in enumerate(rows):
            if len(r) == 0 or not all(is_int(x) for x in r):
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
        seqlen = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    w = min(check_int("window", window, lo=0), s)  # a window past the sequence is the whole causal past
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    batch, num_heads = check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, batch)
    v = np.stack([_doc_bounds(r)[1] for r in rows])[..., None]
    return _finish(v, num_heads, True)


def causal_document_padded(doc_lens, seqlen: int, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Causal attention within each packed document, followed by a padding tail.

    The mask of a packed training batch (e.g. PaddleFormers' ``attn_mask_startend_row_indices``):
    each row holds documents back to back, and the positions after the last one, up to
    ``seqlen``, are padding. Real tokens attend causally within their own document and never to a
    padding position; a padding row sees no key at all, so ``flashmask_attention`` gives it output
    0 and zero gradients (give those positions the ignored label in the loss).

    Args:
        doc_lens: list of document lengths (each >= 1) for one sample, broadcast over ``batch``;
            or a list of such lists, one per batch row. Each row sums to at most ``seqlen``; rows
            may differ in their sums (the rest of each row is its padding).
        seqlen: the padded sequence length.

    Returns a causal FlashMask, C=1, shape ``[B, num_heads, seqlen, 1]`` int32: ``LTS[j]`` is the
    end of ``j``'s document for a real column and the start of the padding for a padding column.
    With no padding it equals :func:`causal_document`. Example: ``causal_document_padded([4, 3], 10)``
    gives ``LTS = [4, 4, 4, 4, 7, 7, 7, 7, 7, 7]``.

    Raises:
        TypeError / ValueError: malformed ``doc_lens``, lengths < 1, a row longer than ``seqlen``,
        or a ``batch`` that does not match the number of rows.
    """
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = check_batch_heads(batch, num_heads)
    nested = is_seq(doc_lens) and len(doc_lens) > 0 and all(is_seq(r) for r in doc_lens)
    # One row at a time: rows may differ in their sums here (their padding makes up the rest).
    rows = [_normalize_doc_lens(list(r), None, 1, f"doc_lens[{bi}]")[0] for bi, r in enumerate(doc_lens)] \
        if nested else _normalize_doc_lens(doc_lens, None, 1)
    rows = _rows_for_batch(rows, batch, "doc_lens")
    vecs = []
    for bi, r in enumerate(rows):
        real = sum(r)
        if real > s:
            raise ValueError(f"doc_lens[{bi}] sums to {real} but seqlen={s}; a row must fit in seqlen")
        lts = np.full(s, real, dtype=np.int64)  # padding columns: masked from the padding on
        lts[:real] = _doc_bounds(r)[1]
        vecs.append(lts)
    return _finish(np.stack(vecs)[..., None], num_heads, True)


def document(doc_lens, seqlen: Optional[int] = None, *, batch: int = 1, num_heads: int = 1) -> FlashMask:
    """Bidirectional attention within each packed document.

    Non-causal FlashMask, C=2: ``LTS[j] = end of j's document``, ``UTE[j] = start of j's document``
    (Paddle doc example "Document Mask": ``[4, 3, 3]``). Arguments and errors as in
    :func:`causal_document`.
    """
    batch, num_heads = check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, batch)
    v = np.stack([np.stack(_doc_bounds(r)[::-1], axis=-1) for r in rows])
    return _finish(v, num_heads, False)


def _normalize_share_question(docs, seqlen, batch) -> List[List[Tuple[int, List[int]]]]:
    def is_sample(x) -> bool:
        return is_seq(x) and len(x) == 2 and is_int(x[0])

    if not is_seq(docs) or len(docs) == 0:
        raise TypeError("docs must be a non-empty list of (question_len, [answer_lens...]) samples "
                        "or a non-empty list of such lists (one per batch row)")
    if all(is_sample(x) for x in docs):
        rows = [list(docs)]
    elif all(is_seq(r) and len(r) > 0 and all(is_sample(x) for x in r) for r in docs):
        rows = [list(r) for r in docs]
    else:
        raise TypeError(f"docs must be a list of (question_len, [answer_lens...]) samples or a list of "
                        f"such lists, got {docs!r}")
    out_rows = []
    for bi, r in enumerate(rows):
        samples = []
        for si, (q, answers) in enumerate(r):
            if not is_seq(answers) or not all(is_int(a) for a in answers):
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
        seqlen = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
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
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    g = check_int("global_tokens", global_tokens, lo=0, hi=s)
    w = min(check_int("window", window, lo=0), s)  # a window past the sequence covers it all
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    p = check_int("prefix_len", prefix_len, lo=0, hi=s)
    batch, num_heads = check_batch_heads(batch, num_heads)
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
    batch, num_heads = check_batch_heads(batch, num_heads)
    rows = _normalize_doc_lens(doc_lens, seqlen, 1)  # raw rows; broadcast over batch below
    if not is_seq(prefix_lens) or len(prefix_lens) == 0:
        raise TypeError("prefix_lens must be a list of ints (or list of lists) matching doc_lens")
    if all(is_int(x) for x in prefix_lens):
        prows = [list(prefix_lens)]
    elif all(is_seq(r) and all(is_int(x) for x in r) for r in prefix_lens):
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
        return is_seq(x) and len(x) == 4 and all(is_int(t) for t in x)

    if not is_seq(spans):
        raise TypeError(f"spans must be a list of (k_start, k_end, q_start, q_end) tuples, got {spans!r}")
    if len(spans) == 0 or all(is_span(x) for x in spans):
        rows = [list(spans)]
    elif all(is_seq(r) and all(is_span(x) for x in r) for r in spans):
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = check_batch_heads(batch, num_heads)
    if spans is None:
        n = check_int("num_spans", num_spans, lo=0)
        rng = np.random.default_rng(check_int("seed", seed, lo=0))
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
    s = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
    batch, num_heads = check_batch_heads(batch, num_heads)
    rng = np.random.default_rng(check_int("seed", seed, lo=0))
    j = np.arange(s, dtype=np.int64)
    lts = rng.integers(j + 1, s + 1, size=(batch, num_heads, s))
    return FlashMask(np.ascontiguousarray(lts[..., None], dtype=np.int32), True)


def window_to_startend(window_size, seqlen_q: int, seqlen_k: Optional[int] = None, batch: int = 1,
                       causal: bool = False) -> np.ndarray:
    """Convert Paddle's ``window_size`` into ``startend_row_indices``: as Paddle does when
    ``seqlen_q == seqlen_k``, aligned bottom-right (as the causal mask, and FlashAttention's
    ``window_size``) otherwise.

    With ``o = seqlen_k - seqlen_q`` (0 in Paddle, which accepts only equal lengths), query ``i``
    sees keys ``[i + o - w[0], i + o]`` (``causal=True``) or ``[i + o - w[0], i + o + w[1]]``; for
    key column ``j in range(seqlen_k)`` (``w = (w, w)`` for an int):

    - ``causal=True``: C=1, ``LTS[j] = clip(j - o + w[0] + 1, 0, seqlen_q)``;
    - ``causal=False``: C=2, ``[clip(j - o + w[0] + 1, 0, seqlen_q), clip(j - o - w[1], 0, seqlen_q)]``.

    A decoding step (one query, ``seqlen_k`` keys, causal) sees the last ``w[0] + 1`` keys.

    Returns:
        int32 ``[batch, 1, seqlen_k, C]``.

    Raises:
        TypeError: ``window_size`` not an int or a pair of ints.
        ValueError: negative window, bad ``seqlen_q``/``seqlen_k``/``batch``.
    """
    w0, w1 = normalize_window_size(window_size)
    sq = check_int("seqlen_q", seqlen_q, lo=1, hi=MAX_SEQLEN)
    sk = sq if seqlen_k is None else check_int("seqlen_k", seqlen_k, lo=1, hi=MAX_SEQLEN)
    batch = check_int("batch", batch, lo=1)
    w0, w1 = min(w0, sq + sk), min(w1, sq + sk)  # wider windows change nothing; avoids int64 overflow
    causal = check_bool("causal", causal)
    row = np.arange(sk, dtype=np.int64) - causal_offset(sq, sk)  # the row on key column j's diagonal
    if causal:
        v = np.clip(row + w0 + 1, 0, sq)[:, None]
    else:
        v = np.stack([np.clip(row + w0 + 1, 0, sq), np.clip(row - w1, 0, sq)], axis=-1)
    return np.ascontiguousarray(np.broadcast_to(v[None, None], (batch, 1) + v.shape), dtype=np.int32)


