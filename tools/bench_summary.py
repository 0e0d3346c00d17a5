#!/usr/bin/env python3
"""Worst ratio of ours over each peer, per (head dim, sequence length, family), across the rows of
tools/bench_attention.py runs (JSON files from --out; typically --random-params seeds), so that a
claim holds on every drawn instance and not only on one.

    python3 tools/bench_summary.py fwd_rows.json [more.json ...] [--peers fastest,fa4]

Prints one line per group and peer ("fastest": each row's fastest peer, the ratio a claim is made
against): the worst (smallest) ours / peer TFLOP/s, the seed and density of
that row, the median ratio and the number of rows. Rows without the peer (null: it could not run) are
left out of that peer's column.
"""
import argparse
import collections
import json

import numpy as np

PEERS = ("fastest", "fa4", "flex_flash", "flex_triton", "cudnn")
TIMED_PEERS = PEERS[1:]


def with_fastest(row):
    """The row with "fastest": the TFLOP/s of its fastest peer that ran (and "fastest_peer", which)."""
    ran = {p: row[p] for p in TIMED_PEERS if row.get(p)}
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


if __name__ == "__main__":
    main()
