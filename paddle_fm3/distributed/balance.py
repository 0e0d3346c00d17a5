"""HCC-IPO: cardinality-constrained min-max partition of segment weights over CP ranks (numpy only).

Context parallelism, balance (docs/design.md, "Context parallelism"): ``n`` segments with
non-negative integer weights (the number of not-fully-masked (query tile, key block) pairs of each
query segment, from the block summary) go to ``P`` ranks, exactly ``n / P`` each, minimizing the
heaviest rank's load.

1. Largest-first greedy (LPT with a cardinality cap): segments by decreasing weight, each to the
   lightest rank that still has room.
2. Iterative pairwise optimization: re-partition the heaviest rank together with a partner exactly
   (choose ``n/P`` of the ``2n/P`` segments whose sum is closest to half: a cardinality-indexed
   subset-sum DP on integer bitsets); partners are tried lightest first; the first strict
   improvement of the pair's maximum is applied and the loop restarts from the new heaviest rank.
3. On small cases (``n/P <= 3``) a three-way exact re-partition of the heaviest rank with every two
   partners.
4. Stop when no move improves, or the heaviest rank is within ``rel_tol`` (default 1e-3) of the
   lower bound ``ceil(total / P)``.

The pairwise DP is exact while the pair's total weight is at most ``exact_limit`` (default 2**12);
above it weights are quantized to that many units for the DP, the candidate split is evaluated
with the true weights and only applied if it strictly improves, so the result is never worse than
greedy and is within ``(n/P) * quantum`` of the pairwise optimum.
"""

from __future__ import annotations

import heapq
import itertools
import math
import numbers

import numpy as np

__all__ = ["hcc_ipo", "greedy_partition", "pair_repartition", "brute_force_partition"]


def greedy_partition(weights: np.ndarray, num_ranks: int) -> list:
    """Largest-first greedy with exactly ``n/P`` segments per rank; ties broken by index."""
    n = len(weights)
    m = n // num_ranks
    order = sorted(range(n), key=lambda i: (-int(weights[i]), i))
    heap = [(0, r) for r in range(num_ranks)]
    groups = [[] for _ in range(num_ranks)]
    for i in order:
        load, r = heapq.heappop(heap)
        groups[r].append(i)
        if len(groups[r]) < m:
            heapq.heappush(heap, (load + int(weights[i]), r))
    return groups


def pair_repartition(w: list, exact_limit: int = 1 << 14):
    """Split ``w`` (length 2m) into two halves of m items minimizing the larger sum.

    Returns ``(mask, best_max)``: a list of booleans (True = first half) and the true larger sum.
    Exact when ``sum(w) <= exact_limit``, else on weights quantized to ``exact_limit`` units.
    """
    k2 = len(w)
    m = k2 // 2
    total = sum(w)
    q = 1 if total <= exact_limit else -(-total // exact_limit)
    wq = [(x + q // 2) // q for x in w] if q > 1 else list(w)
    # reach[k]: bitset of achievable (quantized) sums with exactly k of the items seen so far.
    reach = [1] + [0] * m
    hist = []
    for i, x in enumerate(wq):
        hist.append(reach[:])
        lo = max(1, m - (k2 - i) + 1)
        for k in range(min(i + 1, m), lo - 1, -1):
            reach[k] |= reach[k - 1] << x
    tq = sum(wq)
    cand = reach[m] & ((1 << (tq // 2 + 1)) - 1)
    s = cand.bit_length() - 1
    if s < 0:  # only possible if every choice exceeds half: take the smallest achievable
        r = reach[m]
        s = (r & -r).bit_length() - 1
    mask = [False] * k2
    k = m
    for i in range(k2 - 1, -1, -1):  # every recorded bit is achievable; prefer "not used"
        if not (hist[i][k] >> s) & 1:
            mask[i] = True
            s -= wq[i]
            k -= 1
    assert k == 0 and s == 0, "pair_repartition backtracking failed"
    a = sum(wi for wi, f in zip(w, mask) if f)
    return mask, max(a, total - a)


def _three_way(w: list):
    """Exact split of 3m items into three groups of m (small m only)."""
    n = len(w)
    m = n // 3
    idx = range(n)
    best, best_split = None, None
    for a in itertools.combinations(idx, m):
        rest = [i for i in idx if i not in a]
        sa = sum(w[i] for i in a)
        for b in itertools.combinations(rest, m):
            if b[0] != rest[0]:  # groups b and c are interchangeable
                break
            sb = sum(w[i] for i in b)
            mx = max(sa, sb, sum(w) - sa - sb)
            if best is None or mx < best:
                best, best_split = mx, (a, b)
    a, b = best_split
    c = [i for i in idx if i not in a and i not in b]
    return best, (list(a), list(b), c)


def hcc_ipo(weights, num_ranks: int, *, exact_limit: int = 1 << 12, three_way_max_m: int = 3,
            three_way_candidates: int = 64, max_moves: int = 10000, rel_tol: float = 1e-3) -> np.ndarray:
    """Assign ``n`` weighted segments to ``num_ranks`` ranks, ``n/num_ranks`` each, min-max load.

    Args:
        weights: non-negative integers, shape ``[n]``; ``n % num_ranks == 0``.
        num_ranks: P.
        exact_limit: pair totals up to this are partitioned exactly (see module doc).
        three_way_max_m: run the three-way step when ``n/P`` is at most this.
        three_way_candidates: the three-way step tries pairs among this many lightest other ranks
            (all pairs of all ranks cost O(P^2) per move: minutes at P in the thousands).
        max_moves: safety cap on improvement moves.
        rel_tol: also stop once the heaviest load is within ``rel_tol`` of the lower bound
            ``ceil(total / P)`` (improvements below that are noise for the kernel time; 0 runs to
            the exact fixed point).

    Returns:
        int64 ``[P, n/P]``: the segments of each rank, ascending within a rank. Deterministic.

    Raises:
        TypeError: ``num_ranks`` not an int, ``rel_tol`` not a number.
        ValueError: bad sizes, negative weights, ``rel_tol`` negative or not finite.
    """
    from .. import _checks  # noqa: PLC0415 - numpy only

    num_ranks = _checks.check_int("num_ranks", num_ranks, lo=1)
    exact_limit = _checks.check_int("exact_limit", exact_limit, lo=1)
    three_way_max_m = _checks.check_int("three_way_max_m", three_way_max_m, lo=0)
    three_way_candidates = _checks.check_int("three_way_candidates", three_way_candidates, lo=2)
    max_moves = _checks.check_int("max_moves", max_moves, lo=0)
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, numbers.Real):
        raise TypeError(f"rel_tol must be a number, got {type(rel_tol).__name__}")
    if not (math.isfinite(rel_tol) and rel_tol >= 0):
        raise ValueError(f"rel_tol must be a finite number >= 0, got {rel_tol}")
    w = np.asarray(weights)
    if w.ndim != 1 or not np.issubdtype(w.dtype, np.integer):
        raise ValueError(f"weights must be a 1-D integer array, got dtype {w.dtype} shape {w.shape}")
    if w.size and int(w.min()) < 0:
        raise ValueError("weights must be non-negative")
    n = w.size
    if num_ranks < 1 or n % num_ranks != 0 or n == 0:
        raise ValueError(f"number of segments ({n}) must be a positive multiple of num_ranks ({num_ranks})")
    wl = [int(x) for x in w]
    m = n // num_ranks
    groups = greedy_partition(w, num_ranks)
    if num_ranks > 1 and m > 0:
        loads = [sum(wl[i] for i in g) for g in groups]
        lower = -(-sum(wl) // num_ranks)
        stop_at = max(lower, int(lower * (1.0 + rel_tol)))
        moves = 0
        while moves < max_moves:
            h = max(range(num_ranks), key=lambda r: (loads[r], -r))
            if loads[h] <= stop_at:
                break
            improved = False
            for p in sorted((r for r in range(num_ranks) if r != h), key=lambda r: (loads[r], r)):
                if loads[p] >= loads[h] - 1:
                    break
                items = groups[h] + groups[p]
                mask, mx = pair_repartition([wl[i] for i in items], exact_limit)
                if mx < loads[h]:
                    groups[h] = [i for i, f in zip(items, mask) if f]
                    groups[p] = [i for i, f in zip(items, mask) if not f]
                    loads[h] = sum(wl[i] for i in groups[h])
                    loads[p] = sum(wl[i] for i in groups[p])
                    improved = True
                    break
            if not improved and m <= three_way_max_m and num_ranks >= 3:
                others = sorted((r for r in range(num_ranks) if r != h), key=lambda r: (loads[r], r))
                for p1, p2 in itertools.combinations(others[:three_way_candidates], 2):
                    items = groups[h] + groups[p1] + groups[p2]
                    mx, (a, b, c) = _three_way([wl[i] for i in items])
                    if mx < loads[h]:
                        for r, part in zip((h, p1, p2), (a, b, c)):
                            groups[r] = [items[i] for i in part]
                            loads[r] = sum(wl[i] for i in groups[r])
                        improved = True
                        break
            if not improved:
                break
            moves += 1
    return np.array([sorted(g) for g in groups], dtype=np.int64).reshape(num_ranks, m)


def brute_force_partition(weights, num_ranks: int) -> int:
    """Optimal min-max load by exhaustive search (tests only; tiny n)."""
    w = [int(x) for x in weights]
    n = len(w)
    m = n // num_ranks

    def rec(remaining):
        if not remaining:
            return 0
        first, rest = remaining[0], remaining[1:]
        best = None
        for comb in itertools.combinations(rest, m - 1):
            g = (first,) + comb
            left = [i for i in rest if i not in comb]
            val = max(sum(w[i] for i in g), rec(left))
            if best is None or val < best:
                best = val
        return best

    return rec(list(range(n)))
