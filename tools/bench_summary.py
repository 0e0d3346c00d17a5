#!/usr/bin/env python3
"""Worst ratio of ours over each peer, per (head dim, sequence length, family), across the rows of
tools/bench_attention.py runs (JSON files from --out; typically --random-params seeds), so that a
claim holds on every drawn instance and not only on one.

    python3 tools/bench_summary.py fwd_rows.json [more.json ...] [--peers fastest,fa4]

Prints one line per group and peer ("fastest": each row's fastest peer, the ratio a claim is made
against): the worst (smallest) ours / peer TFLOP/s, the seed and density of
that row, the median ratio and the number of rows. Rows without the peer (null: it could not run) are
left out of that peer's column. A FlashAttention-4 call whose results disagree with ours (fa4_disagrees)
is not a peer a user could train with: it is left out of "fastest" (its own column keeps it) and
listed after the table. Ours is checked against the reference at the benchmark's shapes by
tools/check_peer_grads.py.
"""
import argparse
import collections
import json

import numpy as np

PEERS = ("fastest", "fa4", "flex_flash", "flex_triton", "cudnn")
TIMED_PEERS = PEERS[1:]
# FlashAttention-4's output or gradients against ours (bench_attention.py). Where both are right (bf16,
# each about 0.0025 from the fp32 reference, relative Frobenius: tools/check_peer_grads.py) the rows
# differ by at most 0.031 element-wise; FA4 4.0.0b36's wrong dQ at head dim 80 on Hopper by 0.35-6.
FA4_DISAGREE_REL, FA4_DISAGREE_ABS = 0.05, 0.1


def fa4_disagrees(row):
    """True where FlashAttention-4's call computed something else than ours on this row."""
    if row.get("fa4_reldiff") is not None:
        return row["fa4_reldiff"] > FA4_DISAGREE_REL
    return row.get("fa4_maxdiff") is not None and row["fa4_maxdiff"] > FA4_DISAGREE_ABS


def with_fastest(row):
    """The row with "fastest": the TFLOP/s of its fastest peer that ran (and "fastest_peer", which),
    FlashAttention-4 left out where it disagrees with ours."""
    ran = {p: row[p] for p in TIMED_PEERS if row.get(p) and not (p == "fa4" and fa4_disagrees(row))}
    if not ran:
        return row
    best = max(ran, key=ran.get)
    return {**row, "fastest": ran[best], "fastest_peer": best}


def worst_ratios(rows, peers=PEERS):
    """{(head_dim, head_dim_v, seqlen, family, peer): dict(worst, seed, density, median, n)}; the peer
    "fastest" is each row's fastest peer."""
    groups = collections.defaultdict(list)
    for r in map(with_fastest, rows):
        for peer in peers:
            if r.get("fm3") and r.get(peer):
                key = (r["head_dim"], r.get("head_dim_v", r["head_dim"]), r["seqlen"], r["family"], peer)
                groups[key].append((r["fm3"] / r[peer], r.get("params_seed"), r.get("density")))
    out = {}
    for key, vals in groups.items():
        ratio, seed, density = min(vals, key=lambda x: x[0])
        out[key] = {"worst": ratio, "seed": seed, "density": density,
                    "median": float(np.median([v[0] for v in vals])), "n": len(vals)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON rows written by bench_attention.py --out")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated peer columns")
    args = ap.parse_args()
    rows = [r for f in args.files for r in json.load(open(f))]
    table = worst_ratios(rows, args.peers.split(","))
    print(f"{'D':>8} {'S':>6} {'family':<22} {'peer':<12} {'worst':>6} {'seed':>5} {'density':>8} {'median':>6} {'n':>3}")
    for (d, dv, s, fam, peer), v in sorted(table.items()):
        dims = str(d) if d == dv else f"{d}x{dv}"
        density = "" if v["density"] is None else f"{v['density']:.3f}"
        print(f"{dims:>8} {s:>6} {fam:<22} {peer:<12} {v['worst']:6.3f} {str(v['seed']):>5} {density:>8} "
              f"{v['median']:6.3f} {v['n']:>3}")
    wrong = sorted({(r["head_dim"], r.get("head_dim_v", r["head_dim"]), r["seqlen"], r["family"])
                    for r in rows if fa4_disagrees(r)})
    for d, dv, s, fam in wrong:
        dims = str(d) if d == dv else f"{d}x{dv}"
        print(f"FlashAttention-4 disagrees with ours (not a peer in 'fastest'): D {dims}, S {s}, {fam}")


if __name__ == "__main__":
    main()
