"""Tests of paddle_fm3.masks: builders, dense conversion, inverse, density (numpy only)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_fm3 import masks as M

FAMILY_NAMES = [
    "full", "causal", "sliding_window", "causal_document", "document", "share_question",
    "global_sliding_window", "causal_blockwise", "prefix_lm_causal", "prefix_lm_document",
    "qk_sparse", "random_eviction",
]


# ---------------------------------------------------------------------------
# Independent oracles, written with explicit Python loops
# ---------------------------------------------------------------------------


def paddle_flashmask_to_densemask(sri, causal):
    """Paddle's documented `flashmask_to_densemask`, rewritten in numpy (square only).

    Returns True where visible (Paddle's m == 0).
    """
    bz, num_head, seq_len, bound_num = sri.shape
    m = np.zeros((bz, num_head, seq_len, seq_len))
    has_end = (causal and bound_num == 2) or ((not causal) and bound_num == 4)
    for bi in range(bz):
        for hi in range(num_head):
            for j in range(seq_len):
                downstart = sri[bi, hi, j, 0]
                if has_end:
                    downend = sri[bi, hi, j, 1]
                    m[bi, hi, downstart:downend, j] = -np.inf
                else:
                    m[bi, hi, downstart:, j] = -np.inf
                if causal:
                    m[bi, hi, :j, j] = -np.inf
                else:
                    if has_end:
                        upstart = sri[bi, hi, j, 2]
                        upend = sri[bi, hi, j, 3]
                        m[bi, hi, upstart:upend, j] = -np.inf
                    else:
                        upend = sri[bi, hi, j, 1]
                        m[bi, hi, :upend, j] = -np.inf
    return m == 0


def loop_to_dense(sri, causal, sq):
    """The semantics table (paddle_fm3.masks, docs/design.md), element by element, for any S_q (bottom-right causal)."""
    b, h, sk, c = sri.shape
    out = np.zeros((b, h, sq, sk), dtype=bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                for j in range(sk):
                    v = [int(x) for x in sri[bi, hi, j]]
                    if causal:
                        masked = i >= v[0] if c == 1 else v[0] <= i < v[1]
                        masked = masked or j > i + (sk - sq)
                    elif c == 2:
                        masked = i >= v[0] or i < v[1]
                    else:
                        masked = (v[0] <= i < v[1]) or (v[2] <= i < v[3])
                    out[bi, hi, i, j] = not masked
    return out


def loop_min_c(visible, causal):
    """Smallest C representing `visible` ([S_q, S_k]); None if not representable (loops)."""
    sq, sk = visible.shape
    need = 1 if causal else 2
    for j in range(sk):
        col = [bool(visible[i, j]) for i in range(sq)]
        if causal:
            first = max(0, min(sq, j - (sk - sq)))
            if any(col[:first]):
                return None
            region = [not x for x in col[first:]]
        else:
            region = [not x for x in col]
        runs = sum(1 for i, x in enumerate(region) if x and (i == 0 or not region[i - 1]))
        if causal:
            if runs > 1:
                return None
            if runs == 1 and not region[-1]:
                need = 2
        else:
            vis_runs = sum(1 for i, x in enumerate(col) if x and (i == 0 or not col[i - 1]))
            if runs > 2:
                return None
            if vis_runs > 1:
                need = 4
    return need


def tokens_of(lens):
    """doc id and doc start per token."""
    ids, starts, pos = [], [], 0
    for d, n in enumerate(lens):
        ids += [d] * n
        starts += [pos] * n
        pos += n
    return ids, starts


def bf(S, pred):
    return np.array([[bool(pred(i, j)) for j in range(S)] for i in range(S)])


def bf_causal_document(lens):
    ids, _ = tokens_of(lens)
    return bf(sum(lens), lambda i, j: j <= i and ids[i] == ids[j])


def bf_document(lens):
    ids, _ = tokens_of(lens)
    return bf(sum(lens), lambda i, j: ids[i] == ids[j])


def bf_share_question(docs):
    sample, seg = [], []
    for si, (q, answers) in enumerate(docs):
        sample += [si] * q
        seg += [0] * q
        for ai, a in enumerate(answers):
            sample += [si] * a
            seg += [ai + 1] * a
    return bf(len(sample), lambda i, j: j <= i and sample[i] == sample[j] and (seg[j] == 0 or seg[j] == seg[i]))


def bf_causal_blockwise(lens):
    ids, _ = tokens_of(lens)
    last = len(lens) - 1
    return bf(sum(lens), lambda i, j: j <= i and (ids[i] == ids[j] or ids[i] == last))


def bf_prefix_lm_document(lens, prefixes):
    ids, starts = tokens_of(lens)
    return bf(sum(lens), lambda i, j: ids[i] == ids[j] and (j < starts[j] + prefixes[ids[j]] or j <= i))


def bf_qk_sparse(S, spans):
    return bf(S, lambda i, j: j <= i and not any(qs <= i < qe and ks <= j < ke for ks, ke, qs, qe in spans))


def dense_of(fm, sq=None):
    assert isinstance(fm, M.FlashMask)
    sri = fm.startend_row_indices
    assert sri.dtype == np.int32 and sri.ndim == 4 and sri.flags.c_contiguous
    return M.to_dense(sri, fm.causal, sq)


def random_lens(rng, S, max_docs=5):
    n = int(rng.integers(1, min(S, max_docs) + 1))
    cuts = sorted(rng.choice(np.arange(1, S), size=n - 1, replace=False).tolist()) if n > 1 else []
    return [b - a for a, b in zip([0] + cuts, cuts + [S])]


# ---------------------------------------------------------------------------
# Paddle's documented examples (S = 10), arrays and dense pictures reproduced exactly
# ---------------------------------------------------------------------------

PADDLE_EXAMPLES = {
    # name: (FlashMask, expected vectors [S, C], dense picture)
    "causal": (
        lambda: M.causal(10), True, [[10]] * 10,
        [[1 if j <= i else 0 for j in range(10)] for i in range(10)],
    ),
    "sliding_window": (
        lambda: M.sliding_window(10, 2), True, [[x] for x in [3, 4, 5, 6, 7, 8, 9, 10, 10, 10]],
        [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
         [0, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [0, 0, 1, 1, 1, 0, 0, 0, 0, 0],
         [0, 0, 0, 1, 1, 1, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 0, 1, 1, 1, 0, 0],
         [0, 0, 0, 0, 0, 0, 1, 1, 1, 0],
         [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]],
    ),
    "causal_document": (
        lambda: M.causal_document([4, 3, 3]), True, [[x] for x in [4, 4, 4, 4, 7, 7, 7, 10, 10, 10]],
        [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
         [0, 0, 0, 0, 0, 0, 0, 1, 1, 0],
         [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]],
    ),
    "document": (
        lambda: M.document([4, 3, 3]), False,
        list(zip([4, 4, 4, 4, 7, 7, 7, 10, 10, 10], [0, 0, 0, 0, 4, 4, 4, 7, 7, 7])),
        [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
         [0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
         [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]],
    ),
    "share_question": (
        lambda: M.share_question([(4, [3, 3])]), True, [[x] for x in [10, 10, 10, 10, 7, 7, 7, 10, 10, 10]],
        [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 1, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 1, 1, 0],
         [1, 1, 1, 1, 0, 0, 0, 1, 1, 1]],
    ),
    "global_sliding_window": (
        lambda: M.global_sliding_window(10, 2, 1), False,
        list(zip([10, 10, 4, 5, 6, 7, 8, 9, 10, 10], [10] * 10,
                 [0, 0, 0, 0, 2, 2, 2, 2, 2, 2], [0, 0, 0, 0, 3, 4, 5, 6, 7, 8])),
        [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 0, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 0, 0, 1, 1, 1, 0, 0, 0],
         [1, 1, 0, 0, 0, 1, 1, 1, 0, 0],
         [1, 1, 0, 0, 0, 0, 1, 1, 1, 0],
         [1, 1, 0, 0, 0, 0, 0, 1, 1, 1],
         [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]],
    ),
    "causal_blockwise": (
        lambda: M.causal_blockwise([4, 3, 3]), True,
        list(zip([4, 4, 4, 4, 10, 10, 10, 10, 10, 10], [7, 7, 7, 7, 10, 10, 10, 10, 10, 10])),
        [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]],
    ),
    "prefix_lm_document": (
        lambda: M.prefix_lm_document([3, 2, 5], [2, 2, 2]), False,
        list(zip([3, 3, 3, 5, 5, 10, 10, 10, 10, 10], [0, 0, 2, 3, 3, 5, 5, 7, 8, 9])),
        [[1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
         [0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
         [0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
         [0, 0, 0, 0, 0, 1, 1, 1, 0, 0],
         [0, 0, 0, 0, 0, 1, 1, 1, 1, 0],
         [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]],
    ),
    "prefix_lm_causal": (
        lambda: M.prefix_lm_causal(10, 5), False,
        list(zip([10] * 10, [0, 0, 0, 0, 0, 5, 6, 7, 8, 9])),
        [[1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]],
    ),
    "qk_sparse": (
        lambda: M.qk_sparse(10, spans=[(2, 6, 2, 5), (6, 8, 5, 8)]), True,
        list(zip([10, 10, 2, 3, 4, 5, 6, 7, 10, 10], [10, 10, 5, 5, 5, 5, 8, 8, 10, 10])),
        [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]],
    ),
}


@pytest.mark.parametrize("name", sorted(PADDLE_EXAMPLES))
def test_paddle_documented_examples(name):
    build, causal_flag, vectors, picture = PADDLE_EXAMPLES[name]
    fm = build()
    assert fm.causal is causal_flag
    expected = np.asarray(vectors, dtype=np.int32).reshape(1, 1, 10, -1)
    np.testing.assert_array_equal(fm.startend_row_indices, expected)
    picture = np.asarray(picture, dtype=bool)
    np.testing.assert_array_equal(dense_of(fm)[0, 0], picture)
    np.testing.assert_array_equal(paddle_flashmask_to_densemask(expected, causal_flag)[0, 0], picture)


def test_paddle_causal_example_with_lts_8():
    # The docs' "Causal Mask" example uses LTS = 8 for every column: rows 8, 9 see nothing.
    sri = np.full((1, 1, 10, 1), 8, dtype=np.int32)
    d = M.to_dense(sri, True)[0, 0]
    assert not d[8:].any()
    np.testing.assert_array_equal(d[:8], np.tril(np.ones((10, 10), bool))[:8])


def test_paddle_global_sliding_window_from_dense_reproduces_docs_array():
    fm = M.global_sliding_window(10, 2, 1)
    np.testing.assert_array_equal(M.from_dense(dense_of(fm), False), fm.startend_row_indices)


def test_paddle_api_example_two_heads():
    # flashmask_attention docstring example: [8]*10 + [5]*10 reshaped to [1, 2, 10, 1]
    sri = np.asarray([8] * 10 + [5] * 10, dtype=np.int32).reshape(1, 2, 10, 1)
    d = M.to_dense(sri, True)
    assert d[0, 0, :8].any(axis=1).all() and not d[0, 0, 8:].any()
    assert d[0, 1, :5].any(axis=1).all() and not d[0, 1, 5:].any()


# ---------------------------------------------------------------------------
# Every builder against a brute-force dense mask
# ---------------------------------------------------------------------------

SEEDS = list(range(12))


@pytest.mark.parametrize("seed", SEEDS)
def test_builders_vs_bruteforce(seed):
    rng = np.random.default_rng(seed)
    S = int(rng.integers(1, 33))
    lens = random_lens(rng, S)

    np.testing.assert_array_equal(dense_of(M.full(S))[0, 0], bf(S, lambda i, j: True))
    np.testing.assert_array_equal(dense_of(M.causal(S))[0, 0], bf(S, lambda i, j: j <= i))

    w = int(rng.integers(0, S + 2))
    np.testing.assert_array_equal(dense_of(M.sliding_window(S, w))[0, 0], bf(S, lambda i, j: i - w <= j <= i))

    np.testing.assert_array_equal(dense_of(M.causal_document(lens))[0, 0], bf_causal_document(lens))
    np.testing.assert_array_equal(dense_of(M.document(lens, S))[0, 0], bf_document(lens))
    np.testing.assert_array_equal(dense_of(M.causal_blockwise(lens))[0, 0], bf_causal_blockwise(lens))

    docs = []
    for d in lens:
        q = int(rng.integers(1, d + 1))
        docs.append((q, random_lens(rng, d - q) if d > q else []))
    np.testing.assert_array_equal(dense_of(M.share_question(docs, S))[0, 0], bf_share_question(docs))

    g = int(rng.integers(0, S + 1))
    w = int(rng.integers(0, S + 1))
    np.testing.assert_array_equal(
        dense_of(M.global_sliding_window(S, g, w))[0, 0],
        bf(S, lambda i, j: i < g or j < g or abs(i - j) <= w))

    p = int(rng.integers(0, S + 1))
    np.testing.assert_array_equal(dense_of(M.prefix_lm_causal(S, p))[0, 0], bf(S, lambda i, j: j < p or j <= i))

    prefixes = [int(rng.integers(0, d + 1)) for d in lens]
    np.testing.assert_array_equal(dense_of(M.prefix_lm_document(lens, prefixes))[0, 0],
                                  bf_prefix_lm_document(lens, prefixes))

    # explicit qk-sparse spans: disjoint key ranges, arbitrary query ranges
    pts = sorted(rng.choice(S + 1, size=min(4, S + 1) // 2 * 2, replace=False).tolist())
    spans = []
    for ks, ke in zip(pts[0::2], pts[1::2]):
        qs = int(rng.integers(0, S + 1))
        qe = int(rng.integers(qs, S + 1))
        spans.append((ks, ke, qs, qe))
    fm = M.qk_sparse(S, spans)
    assert fm.startend_row_indices.shape == (1, 1, S, 2) and fm.causal
    np.testing.assert_array_equal(dense_of(fm)[0, 0], bf_qk_sparse(S, spans))

    fm = M.random_eviction(S, seed=seed)
    lts = fm.startend_row_indices[0, 0, :, 0]
    np.testing.assert_array_equal(dense_of(fm)[0, 0], bf(S, lambda i, j: j <= i < lts[j]))


def test_builders_broadcast_batch_and_heads():
    fm = M.document([3, 5], batch=3, num_heads=4)
    assert fm.startend_row_indices.shape == (3, 4, 8, 2)
    assert (fm.startend_row_indices == fm.startend_row_indices[:1, :1]).all()
    for build in (M.full, M.causal):
        assert build(7, batch=2, num_heads=3).startend_row_indices.shape[:3] == (2, 3, 7)
    assert M.sliding_window(7, 2, batch=2, num_heads=3).startend_row_indices.shape == (2, 3, 7, 1)
    assert M.global_sliding_window(7, 1, 2, batch=2, num_heads=3).startend_row_indices.shape == (2, 3, 7, 4)
    assert M.prefix_lm_causal(7, 3, batch=2, num_heads=3).startend_row_indices.shape == (2, 3, 7, 2)


def test_builders_batched_doc_lens():
    rows = [[4, 3, 3], [1, 9], [10]]
    for build, oracle in ((M.causal_document, bf_causal_document), (M.document, bf_document),
                          (M.causal_blockwise, bf_causal_blockwise)):
        fm = build(rows, 10, num_heads=2)
        assert fm.startend_row_indices.shape[:3] == (3, 2, 10)
        d = dense_of(fm)
        for bi, r in enumerate(rows):
            for hi in range(2):
                np.testing.assert_array_equal(d[bi, hi], oracle(r))
    prefixes = [[1, 0, 3], [1, 4], [10]]
    d = dense_of(M.prefix_lm_document(rows, prefixes, batch=3))
    for bi in range(3):
        np.testing.assert_array_equal(d[bi, 0], bf_prefix_lm_document(rows[bi], prefixes[bi]))
    docs = [[(2, [1, 1]), (3, [3])], [(10, [])]]
    d = dense_of(M.share_question(docs))
    for bi in range(2):
        np.testing.assert_array_equal(d[bi, 0], bf_share_question(docs[bi]))
    spans = [[(0, 2, 3, 5)], [(1, 4, 0, 10), (6, 7, 8, 9)]]
    d = dense_of(M.qk_sparse(10, spans))
    for bi in range(2):
        np.testing.assert_array_equal(d[bi, 0], bf_qk_sparse(10, spans[bi]))


def test_qk_sparse_random_spans():
    a = M.qk_sparse(50, num_spans=3, seed=7, batch=2, num_heads=2)
    b = M.qk_sparse(50, num_spans=3, seed=7, batch=2, num_heads=2)
    np.testing.assert_array_equal(a.startend_row_indices, b.startend_row_indices)
    assert a.causal and a.startend_row_indices.shape == (2, 2, 50, 2)
    d = dense_of(a)
    causal_d = np.tril(np.ones((50, 50), bool))
    assert not (d & ~causal_d).any()
    assert (d != causal_d).any()  # something was hidden
    np.testing.assert_array_equal(a.startend_row_indices[:, 0], a.startend_row_indices[:, 1])
    assert not np.array_equal(a.startend_row_indices, M.qk_sparse(50, num_spans=3, seed=8).startend_row_indices)
    assert np.array_equal(M.qk_sparse(5, num_spans=0).startend_row_indices[0, 0], np.full((5, 2), 5))


def test_random_eviction_properties():
    S = 64
    fm = M.random_eviction(S, seed=3, batch=2, num_heads=3)
    lts = fm.startend_row_indices[..., 0]
    assert fm.causal and fm.startend_row_indices.shape == (2, 3, S, 1)
    j = np.arange(S)
    assert (lts > j).all() and (lts <= S).all()
    np.testing.assert_array_equal(lts, M.random_eviction(S, seed=3, batch=2, num_heads=3).startend_row_indices[..., 0])
    assert not np.array_equal(lts[0, 0], lts[0, 1])  # independent per head
    assert not np.array_equal(lts, M.random_eviction(S, seed=4, batch=2, num_heads=3).startend_row_indices[..., 0])
    d = dense_of(fm)
    assert np.diagonal(d, axis1=2, axis2=3).all()  # every query sees at least itself


# ---------------------------------------------------------------------------
# window_to_startend
# ---------------------------------------------------------------------------


def paddle_window(window_size, sq, bsz, causal):
    """Paddle's flashmask_attention window_size conversion, transcribed to numpy."""
    if isinstance(window_size, int):
        window_size = (window_size, window_size)
    if causal:
        sri = np.arange(window_size[0] + 1, sq + window_size[0] + 1).reshape((1, 1, sq, 1))
        return np.repeat(np.clip(sri, None, sq), bsz, 0)
    sri = np.empty((1, 1, sq, 2), dtype=np.int64)
    sri[0, 0, :, 0] = np.arange(window_size[0] + 1, sq + window_size[0] + 1)
    sri[0, 0, :, 1] = np.arange(-window_size[1], sq - window_size[1])
    return np.repeat(np.clip(sri, 0, sq), bsz, 0)


@pytest.mark.parametrize("causal_flag", [True, False])
@pytest.mark.parametrize("window_size", [0, 1, 3, 20, (2, 0), (0, 2), (1, 4), (50, 50)])
def test_window_to_startend_matches_paddle(window_size, causal_flag):
    S = 13
    got = M.window_to_startend(window_size, S, S, 2, causal_flag)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, paddle_window(window_size, S, 2, causal_flag))
    w0, w1 = (window_size, window_size) if isinstance(window_size, int) else window_size
    if causal_flag:
        expect = bf(S, lambda i, j: i - w0 <= j <= i)
    else:
        expect = bf(S, lambda i, j: i - w0 <= j <= i + w1)
    np.testing.assert_array_equal(M.to_dense(got, causal_flag)[1, 0], expect)


@pytest.mark.parametrize("causal_flag", [True, False])
@pytest.mark.parametrize("sq,sk", [(5, 9), (9, 5), (1, 64), (64, 1), (7, 7)])
@pytest.mark.parametrize("window_size", [0, 1, 3, (2, 3), (0, 5), (70, 70)])
def test_window_to_startend_rectangular_is_bottom_right(window_size, causal_flag, sq, sk):
    """Where seqlen_q != seqlen_k (Paddle refuses the window there) it is aligned as the causal mask:
    query i sees keys [i + o - left, i + o (+ right)], o = seqlen_k - seqlen_q."""
    got = M.window_to_startend(window_size, sq, sk, 2, causal_flag)
    assert got.dtype == np.int32 and got.shape == (2, 1, sk, 1 if causal_flag else 2)
    w0, w1 = (window_size, window_size) if isinstance(window_size, int) else window_size
    o = sk - sq
    hi = 0 if causal_flag else w1
    expect = np.array([[i + o - w0 <= j <= i + o + hi for j in range(sk)] for i in range(sq)])
    np.testing.assert_array_equal(M.to_dense(got, causal_flag, sq)[1, 0], expect)


def test_window_to_startend_decode_step_sees_the_last_keys():
    dense = M.to_dense(M.window_to_startend(3, 1, 64, causal=True), True, 1)[0, 0, 0]
    np.testing.assert_array_equal(np.flatnonzero(dense), [60, 61, 62, 63])


def test_window_to_startend_and_sliding_window_agree():
    np.testing.assert_array_equal(M.window_to_startend(4, 11, causal=True), M.sliding_window(11, 4).startend_row_indices)


# ---------------------------------------------------------------------------
# to_dense vs Paddle's algorithm and the table; from_dense; density
# ---------------------------------------------------------------------------


@st.composite
def startend_vectors(draw, square=True):
    causal_flag = draw(st.booleans())
    c = draw(st.sampled_from([1, 2] if causal_flag else [2, 4]))
    sk = draw(st.integers(1, 9))
    sq = sk if square else draw(st.integers(1, 9))
    b = draw(st.integers(1, 2))
    h = draw(st.integers(1, 2))
    flat = draw(st.lists(st.integers(0, sq), min_size=b * h * sk * c, max_size=b * h * sk * c))
    sri = np.asarray(flat, dtype=np.int32).reshape(b, h, sk, c)
    return sri, causal_flag, sq


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(startend_vectors(square=True))
def test_to_dense_matches_paddle_algorithm(case):
    sri, causal_flag, _ = case
    np.testing.assert_array_equal(M.to_dense(sri, causal_flag), paddle_flashmask_to_densemask(sri, causal_flag))


@FAST
@given(startend_vectors(square=False))
def test_to_dense_matches_table_rectangular(case):
    sri, causal_flag, sq = case
    d = M.to_dense(sri, causal_flag, sq)
    assert d.dtype == np.bool_ and d.shape == sri.shape[:2] + (sq, sri.shape[2])
    np.testing.assert_array_equal(d, loop_to_dense(sri, causal_flag, sq))


@pytest.mark.parametrize("causal_flag,c", [(True, 1), (True, 2), (False, 2), (False, 4)])
def test_to_dense_every_variant_random(causal_flag, c):
    rng = np.random.default_rng(c + 10 * causal_flag)
    for _ in range(20):
        S = int(rng.integers(1, 12))
        sri = rng.integers(0, S + 1, size=(2, 2, S, c)).astype(np.int32)
        np.testing.assert_array_equal(M.to_dense(sri, causal_flag), paddle_flashmask_to_densemask(sri, causal_flag))


@FAST
@given(startend_vectors(square=False))
def test_from_dense_round_trip_and_density(case):
    sri, causal_flag, sq = case
    d = M.to_dense(sri, causal_flag, sq)
    back = M.from_dense(d, causal_flag)
    assert back.dtype == np.int32 and back.shape[:3] == sri.shape[:3]
    np.testing.assert_array_equal(M.to_dense(back, causal_flag, sq), d)
    # smallest C, checked independently
    need = max(loop_min_c(d[bi, hi], causal_flag) for bi in range(d.shape[0]) for hi in range(d.shape[1]))
    assert back.shape[-1] == need
    assert M.density(sri, causal_flag, sq) == pytest.approx(d.mean(), abs=1e-12)
    assert M.density(back, causal_flag, sq) == pytest.approx(d.mean(), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.integers(1, 6), st.integers(1, 6), st.data())
def test_from_dense_arbitrary_masks(causal_flag, sq, sk, data):
    flat = data.draw(st.lists(st.booleans(), min_size=sq * sk, max_size=sq * sk))
    vis = np.asarray(flat, dtype=bool).reshape(1, 1, sq, sk)
    need = loop_min_c(vis[0, 0], causal_flag)
    if need is None:
        with pytest.raises(ValueError, match=r"column j=\d+"):
            M.from_dense(vis, causal_flag)
    else:
        back = M.from_dense(vis, causal_flag)
        assert back.shape[-1] == need
        np.testing.assert_array_equal(M.to_dense(back, causal_flag, sq), vis)


def test_from_dense_errors_name_the_column():
    S = 6
    vis = np.tril(np.ones((S, S), bool))
    vis[0, 3] = True  # visible above the diagonal
    with pytest.raises(ValueError, match=r"column j=3 .*above the causal diagonal"):
        M.from_dense(vis, True)
    vis = np.tril(np.ones((S, S), bool))
    vis[2, 1] = vis[4, 1] = False  # two masked intervals below the diagonal
    with pytest.raises(ValueError, match=r"column j=1 .*2 masked row intervals"):
        M.from_dense(vis, True)
    vis = np.ones((1, 2, S, S), bool)
    vis[0, 1, [0, 2, 4], 5] = False  # three masked intervals
    with pytest.raises(ValueError, match=r"column j=5 \(batch 0, head 1\) has 3 masked row intervals"):
        M.from_dense(vis, False)
    with pytest.raises(TypeError, match="visible"):
        M.from_dense(np.full((2, 2), 0.5), False)
    with pytest.raises(ValueError, match="visible"):
        M.from_dense(np.ones((2, 2, 2), bool), False)


def test_from_dense_canonical_forms():
    S = 5
    # causal, nothing extra masked -> C=1 with LTS = S
    np.testing.assert_array_equal(M.from_dense(np.tril(np.ones((S, S), bool)), True), np.full((1, 1, S, 1), S))
    # full -> non-causal C=2 (LTS=S, UTE=0)
    np.testing.assert_array_equal(M.from_dense(np.ones((S, S), bool), False), M.full(S).startend_row_indices)
    # non-causal, fully masked column -> LTS = UTE = 0
    vis = np.ones((S, S), bool)
    vis[:, 2] = False
    out = M.from_dense(vis, False)
    assert out.shape[-1] == 2 and tuple(out[0, 0, 2]) == (0, 0)
    # documented families come back exactly for the canonical builders
    for fm in (M.causal_document([2, 3]), M.document([2, 3]), M.sliding_window(5, 1), M.prefix_lm_causal(5, 2)):
        np.testing.assert_array_equal(M.from_dense(dense_of(fm), fm.causal), fm.startend_row_indices)


def test_from_dense_rectangular_causal():
    # S_q < S_k: bottom-right aligned causal
    sq, sk = 3, 6
    vis = np.array([[j <= i + 3 for j in range(sk)] for i in range(sq)])
    out = M.from_dense(vis, True)
    assert out.shape == (1, 1, sk, 1) and (out == sq).all()
    np.testing.assert_array_equal(M.to_dense(out, True, sq)[0, 0], vis)
    # S_q > S_k: rows before the offset see nothing
    sq, sk = 6, 3
    d = M.to_dense(np.full((1, 1, sk, 1), sq, np.int32), True, sq)[0, 0]
    np.testing.assert_array_equal(d, np.array([[j <= i - 3 for j in range(sk)] for i in range(sq)]))
    assert not d[:3].any()


# ---------------------------------------------------------------------------
# FAMILIES
# ---------------------------------------------------------------------------


def test_families_has_all_twelve():
    assert sorted(M.FAMILIES) == sorted(FAMILY_NAMES)


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("seqlen", [1, 2, 3, 127, 129, 1000])
def test_families_any_seqlen(name, seqlen):
    rng = np.random.default_rng(seqlen)
    fm = M.FAMILIES[name](seqlen, rng)
    sri = fm.startend_row_indices
    assert isinstance(fm, M.FlashMask) and isinstance(fm.causal, bool)
    assert sri.dtype == np.int32 and sri.shape[:3] == (1, 1, seqlen)
    assert sri.shape[-1] in ((1, 2) if fm.causal else (2, 4))
    assert sri.min() >= 0 and sri.max() <= seqlen
    d = fm.to_dense()
    assert fm.density() == pytest.approx(d.mean(), abs=1e-12)
    if seqlen <= 129:
        np.testing.assert_array_equal(M.to_dense(M.from_dense(d, fm.causal), fm.causal), d)
    fm2 = M.FAMILIES[name](seqlen, rng, batch=2, num_heads=3)
    assert fm2.startend_row_indices.shape[:3] == (2, 3, seqlen)


def test_families_are_randomized():
    seen = {name: set() for name in FAMILY_NAMES}
    rng = np.random.default_rng(0)
    for _ in range(8):
        for name in FAMILY_NAMES:
            seen[name].add(M.FAMILIES[name](64, rng).startend_row_indices.tobytes())
    for name in FAMILY_NAMES:
        if name not in ("full", "causal"):
            assert len(seen[name]) > 1, name


def test_density_known_values():
    assert M.density(M.full(8).startend_row_indices, False) == 1.0
    assert M.density(M.causal(8).startend_row_indices, True) == pytest.approx(36 / 64)
    assert M.full(8).density() == 1.0
    # rectangular causal, S_q = 2, S_k = 4 (bottom-right): rows see 3 and 4 keys
    assert M.density(np.full((1, 1, 4, 1), 2, np.int32), True, 2) == pytest.approx(7 / 8)


def test_to_paddle():
    paddle = pytest.importorskip("paddle")
    fm = M.document([3, 4], num_heads=2)
    t = fm.to_paddle()
    assert t.dtype == paddle.int32 and list(t.shape) == [1, 2, 7, 2]
    np.testing.assert_array_equal(t.numpy(), fm.startend_row_indices)


def test_masks_module_does_not_import_paddle():
    import ast
    import inspect

    for node in ast.parse(inspect.getsource(M)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not any(n.split(".")[0] == "paddle" for n in names)


# ---------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------

BAD_CALLS = [
    (lambda: M.full(0), ValueError, "seqlen"),
    (lambda: M.full(3.0), TypeError, "seqlen"),
    (lambda: M.causal(True), TypeError, "seqlen"),
    (lambda: M.causal(4, batch=0), ValueError, "batch"),
    (lambda: M.causal(4, num_heads=0), ValueError, "num_heads"),
    (lambda: M.sliding_window(4, -1), ValueError, "window"),
    (lambda: M.sliding_window(4, 1.5), TypeError, "window"),
    (lambda: M.causal_document([2, 2], 5), ValueError, "seqlen"),
    (lambda: M.causal_document([2, 0, 2]), ValueError, "doc_lens"),
    (lambda: M.causal_document([]), TypeError, "doc_lens"),
    (lambda: M.causal_document("abc"), TypeError, "doc_lens"),
    (lambda: M.document([[2, 2], [1, 2]]), ValueError, "doc_lens"),
    (lambda: M.document([[2, 2], [1, 3]], batch=3), ValueError, "batch"),
    (lambda: M.document([2, [2]]), TypeError, "doc_lens"),
    (lambda: M.share_question([(0, [2])]), ValueError, "question_len"),
    (lambda: M.share_question([(2, [0])]), ValueError, "answer"),
    (lambda: M.share_question([(2, [1])], 4), ValueError, "seqlen"),
    (lambda: M.share_question([(2, 3)]), TypeError, "docs"),
    (lambda: M.share_question([]), TypeError, "docs"),
    (lambda: M.global_sliding_window(5, 6, 1), ValueError, "global_tokens"),
    (lambda: M.global_sliding_window(5, 1, -1), ValueError, "window"),
    (lambda: M.causal_blockwise([3, 3], 7), ValueError, "seqlen"),
    (lambda: M.prefix_lm_causal(5, 6), ValueError, "prefix_len"),
    (lambda: M.prefix_lm_causal(5, -1), ValueError, "prefix_len"),
    (lambda: M.prefix_lm_document([3, 2], [4, 0]), ValueError, "prefix_lens"),
    (lambda: M.prefix_lm_document([3, 2], [1]), ValueError, "prefix_lens"),
    (lambda: M.prefix_lm_document([3, 2], "x"), TypeError, "prefix_lens"),
    (lambda: M.qk_sparse(10, [(3, 2, 0, 5)]), ValueError, "spans"),
    (lambda: M.qk_sparse(10, [(0, 4, 0, 5), (3, 6, 0, 5)]), ValueError, "overlaps"),
    (lambda: M.qk_sparse(10, [(0, 4, 6, 5)]), ValueError, "spans"),
    (lambda: M.qk_sparse(10, [(0, 4, 6)]), TypeError, "spans"),
    (lambda: M.qk_sparse(10, num_spans=-1), ValueError, "num_spans"),
    (lambda: M.random_eviction(10, seed=-1), ValueError, "seed"),
    (lambda: M.random_eviction(10, seed=1.5), TypeError, "seed"),
    (lambda: M.window_to_startend(-1, 5), ValueError, "window_size"),
    (lambda: M.window_to_startend((1, 2, 3), 5), TypeError, "window_size"),
    (lambda: M.window_to_startend(1, 0), ValueError, "seqlen_q"),
    (lambda: M.window_to_startend(1, 5, causal=1), TypeError, "causal"),
    (lambda: M.to_dense(np.zeros((1, 1, 4, 3), np.int32), True), ValueError, "C must be one of"),
    (lambda: M.to_dense(np.zeros((1, 1, 4, 1), np.int32), False), ValueError, "C must be one of"),
    (lambda: M.to_dense(np.zeros((1, 4, 1), np.int32), True), ValueError, "4-D"),
    (lambda: M.to_dense(np.zeros((1, 1, 4, 1), np.float32), True), TypeError, "integer"),
    (lambda: M.to_dense(np.zeros((1, 1, 4, 1), np.int32), "yes"), TypeError, "causal"),
    (lambda: M.density(np.zeros((1, 1, 4, 2), np.int32), False, seqlen_q=0), ValueError, "seqlen_q"),
]


@pytest.mark.parametrize("call,exc,match", BAD_CALLS)
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------------------
# document_lengths: the documents of a block-diagonal mask (a varlen call's cu_seqlens)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_document_lengths_reads_back_the_documents(causal):
    from paddle_fm3.mask_semantics import document_lengths
    rng = np.random.default_rng(5)
    for _ in range(20):
        s = int(rng.integers(1, 300))
        rows = [[int(x) for x in np.diff(np.concatenate([[0], np.sort(rng.choice(np.arange(1, s), size=min(
            s - 1, int(rng.integers(0, 6))), replace=False)), [s]]))] for _ in range(2)]
        fm = (M.causal_document if causal else M.document)(rows, s, num_heads=2)
        assert document_lengths(fm.startend_row_indices, causal) == rows
        # the same visible pairs as the block-diagonal dense mask
        dense = np.zeros((s, s), bool)
        start = 0
        for n in rows[0]:
            dense[start:start + n, start:start + n] = True
            start += n
        if causal:
            dense &= np.tril(np.ones((s, s), bool))
        assert np.array_equal(M.to_dense(fm.startend_row_indices, causal)[0, 0], dense)


def test_document_lengths_refuses_other_masks():
    from paddle_fm3.mask_semantics import document_lengths
    rng = np.random.default_rng(0)
    for fam in FAMILY_NAMES:
        fm = M.FAMILIES[fam](256, rng, batch=2)
        got = document_lengths(fm.startend_row_indices, fm.causal)
        if fam in ("full", "causal", "document", "causal_document"):
            assert got is not None and all(sum(r) == 256 for r in got)
        else:
            assert got is None, fam
    # a padded key (masked for every query) is not a document boundary
    sri = M.causal_document([100, 156], 256).startend_row_indices.copy()
    sri[:, :, 10, 0] = 10
    assert document_lengths(sri, True) is None
