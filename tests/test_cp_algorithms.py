"""In-process tests of the CP algorithms (no process group): localization against the dense mask,
HCC-IPO against brute force, its speed, plan pruning and determinism."""

import time

import numpy as np
import pytest

from paddle_fm3 import masks
import zlib

from paddle_fm3.distributed import balance
from paddle_fm3.distributed.localize import explicit_four_column, local_row_bound, localize
from paddle_fm3.distributed.comm import PlanOnlyCommunicator
from paddle_fm3.distributed.plan import CPPlan, build_layout, default_segment_size


def _random_segments(rng, n, p):
    perm = rng.permutation(n)
    return [np.sort(perm[r::p]) for r in range(p)]


@pytest.mark.parametrize("family", sorted(masks.FAMILIES))
@pytest.mark.parametrize("p,seg", [(2, 16), (4, 8), (3, 12)])
def test_localize_matches_dense(family, p, seg):
    rng = np.random.default_rng(zlib.crc32(f"{family}-{p}-{seg}".encode()))
    s = p * seg * 4
    fm = masks.FAMILIES[family](s, rng, batch=2, num_heads=2)
    dense = masks.to_dense(fm.startend_row_indices, fm.causal, s)
    for segs in _random_segments(rng, s // seg, p):
        local = localize(fm.startend_row_indices, fm.causal, segs, seg)
        assert local.shape == fm.startend_row_indices.shape[:3] + (4,) and local.dtype == np.int32
        rows = (segs[:, None] * seg + np.arange(seg)).reshape(-1)
        np.testing.assert_array_equal(masks.to_dense(local, False, rows.size), dense[:, :, rows, :])


def test_explicit_causal_is_equivalent():
    rng = np.random.default_rng(0)
    for fam in ("causal", "causal_document", "sliding_window", "prefix_lm_causal", "qk_sparse"):
        fm = masks.FAMILIES[fam](64, rng)
        four = explicit_four_column(fm.startend_row_indices, fm.causal)
        np.testing.assert_array_equal(masks.to_dense(four, False, 64), masks.to_dense(fm.startend_row_indices, fm.causal, 64))
        if not fm.causal:
            continue
        np.testing.assert_array_equal(four[0, 0, :, 2], 0)
        np.testing.assert_array_equal(four[0, 0, :, 3], np.arange(64))


def test_local_row_bound_edges():
    segs = np.array([1, 3])  # rows 4..7 and 12..15 with C=4
    r = np.arange(17)
    want = np.array([0, 0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(local_row_bound(r, segs, 4), want)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 3), (2, 4), (2, 5), (3, 2), (3, 3), (4, 2)])
def test_balance_optimal_on_small_cases(p, m):
    rng = np.random.default_rng(p * 10 + m)
    worse = 0
    for _ in range(30):
        w = rng.integers(0, 60, p * m)
        a = balance.hcc_ipo(w, p)
        assert sorted(a.ravel().tolist()) == list(range(p * m))
        assert a.shape == (p, m)
        got, opt = int(w[a].sum(1).max()), balance.brute_force_partition(w, p)
        assert got >= opt
        if p <= 3:  # pairwise (P=2) and three-way (P=3, m<=3) re-partition are exact
            assert got == opt, (w.tolist(), got, opt)
        worse += got > opt
        assert got <= 1.1 * opt + 1
    assert worse <= 3


def test_balance_never_worse_than_greedy_and_fast():
    rng = np.random.default_rng(7)
    cases = {"uniform": rng.integers(0, 200000, 512), "pareto": (rng.pareto(1.5, 512) * 1e4).astype(np.int64),
             "causal_like": np.arange(512) * 64 + 32}
    for name, w in cases.items():
        g = balance.greedy_partition(w, 32)
        gmax = max(int(w[x].sum()) for x in g)
        t0 = time.perf_counter()
        a = balance.hcc_ipo(w, 32)
        dt = time.perf_counter() - t0
        loads = w[a].sum(1)
        assert loads.max() <= gmax
        if name != "pareto":  # pareto has one segment heavier than the mean: cannot balance
            assert loads.max() / loads.mean() < 1.005, name
        assert dt < 0.05, f"{name}: {dt * 1e3:.1f} ms"  # target 5 ms (measured ~1.5-3 ms); CI slack


def test_balance_rejects_bad_sizes():
    with pytest.raises(ValueError):
        balance.hcc_ipo(np.arange(7), 2)
    with pytest.raises(ValueError):
        balance.hcc_ipo(np.array([1, -1]), 2)


@pytest.mark.parametrize("family", sorted(masks.FAMILIES))
def test_plan_prunes_only_fully_masked_segments(family):
    rng = np.random.default_rng(3)
    s, seg, p = 256, 16, 4
    fm = masks.FAMILIES[family](s, rng)
    lay = build_layout(fm.startend_row_indices, fm.causal, p, seg)
    dense = masks.to_dense(fm.startend_row_indices, fm.causal, s)[0, 0]  # [S, S]
    seg_vis = dense.reshape(s // seg, seg, s // seg, seg).any(axis=(1, 3))
    for r in range(p):
        rows_any = seg_vis[lay.segments[r]].any(axis=0)  # key segments my rows see
        for q in range(p):
            if q == r:
                continue
            sent = set(lay.recv[r][q].tolist())
            for t in lay.segments[q]:
                if rows_any[t]:
                    assert t in sent, (r, q, t)  # needed data is always sent
                elif t in sent:  # conservative classification may send an unneeded one, rarely
                    pass
    # the weights are the not-fully-masked pair counts: full mask -> every pair
    assert lay.weights.sum() > 0 or not dense.any()


def test_plan_deterministic_and_agrees_across_ranks():
    rng = np.random.default_rng(11)
    fm = masks.FAMILIES["causal_document"](512, rng)
    l1 = build_layout(fm.startend_row_indices, True, 4, 32)
    l2 = build_layout(fm.startend_row_indices.copy(), True, 4, 32)
    assert l1.digest() == l2.digest()
    plans = [CPPlan(l1, fm.startend_row_indices, True, PlanOnlyCommunicator(r, 4)) for r in range(4)]
    for r, pl in enumerate(plans):  # what r receives from q is what q sends to r
        for q in pl.recv_peers:
            assert r in plans[q].send_peers
            np.testing.assert_array_equal(plans[q].send_rows(r) // 32, l1.position[l1.recv[r][q]].repeat(32) )
    s = plans[0].stats()
    assert s["max_over_mean_load"] <= 1.05 and s["remote_segments_total"] == 4 * 12
    other = masks.FAMILIES["document"](512, np.random.default_rng(12))
    assert build_layout(other.startend_row_indices, False, 4, 32).digest() != l1.digest()


def test_plan_errors():
    sri = masks.causal(256).startend_row_indices
    with pytest.raises(ValueError, match="divisible"):
        build_layout(sri, True, 2, 48)
    with pytest.raises(ValueError, match="divisible"):
        build_layout(masks.causal(250).startend_row_indices, True, 4)
    with pytest.raises(TypeError):
        build_layout(sri, 1, 2, 32)
    assert default_segment_size(1 << 20, 8) == 8192 and default_segment_size(256, 4) == 32


@pytest.mark.parametrize("family", sorted(masks.FAMILIES))
@pytest.mark.parametrize("seg,tile", [(64, 16), (48, 32), (32, 128)])
def test_segment_summary_equals_counting_block_classify(family, seg, tile):
    """The O(S) summary equals counting the (query tile, key block) classification pair by pair."""
    from paddle_fm3 import block_classify
    from paddle_fm3.distributed.plan import segment_summary

    rng = np.random.default_rng(zlib.crc32(f"{family}-{seg}-{tile}".encode()))
    s = seg * 6
    fm = masks.FAMILIES[family](s, rng, batch=2, num_heads=2)
    weights, needed = segment_summary(fm.startend_row_indices, fm.causal, seg, tile)
    g = np.gcd(seg, tile)
    n, tps = s // seg, seg // g
    cls = block_classify(fm.startend_row_indices, causal=fm.causal, seqlen_q=s, block_m=g, block_n=g)
    nz = (cls != 0).reshape(-1, n, tps, n, tps)
    np.testing.assert_array_equal(weights, nz.sum(axis=(0, 2, 3, 4)))
    np.testing.assert_array_equal(needed, nz.any(axis=(0, 2, 4)))
    # And against the dense mask: a segment pair is needed iff some query sees some key.
    dense = masks.to_dense(fm.startend_row_indices, fm.causal, s).reshape(-1, n, seg, n, seg)
    assert np.all(needed >= dense.any(axis=(0, 2, 4)))  # never prunes a visible pair
