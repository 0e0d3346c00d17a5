#!/usr/bin/env python3
"""Per-tile against per-block costs of one kernel, from two ncu source views of the same binary
(tools/gpu_profile.sh, `*_sass.csv.gz`) on problems with the same number of tiles and different
numbers of key blocks per tile (e.g. full and causal at one length: causal runs about half the
blocks). A SASS line whose executed count scales with the blocks is loop code; one whose count stays
is per-tile code (set-up, the pipeline's first and last block, the epilogue). Prints, per kernel
role (the code between two EXITs) and class, the stall samples of each profile and their share, then
the runs of per-tile lines that hold the most samples.

    tools/sass_tile_costs.py full/fm3_sass.csv.gz causal/fm3_sass.csv.gz [--top 12]
"""
import argparse
import re

from sass_mix import read_source_page  # tools/: the directory of this script is on sys.path


def read_lines(path):
    """read_source_page's rows (SASS text, instructions executed, stall samples), with absolute branch
    targets masked: they differ between two loads of one binary."""
    return [(re.sub(r"0x[0-9a-f]{8,}", "ADDR", src), n, smp) for src, n, smp in read_source_page(path)[1]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("more_blocks", help="source view of the run with more key blocks per tile (e.g. full)")
    ap.add_argument("fewer_blocks", help="source view of the run with fewer (e.g. causal), same binary and tiles")
    ap.add_argument("--top", type=int, default=12, help="per-tile runs to list")
    args = ap.parse_args()
    a, b = read_lines(args.more_blocks), read_lines(args.fewer_blocks)
    if [x[0] for x in a] != [x[0] for x in b]:
        raise SystemExit("the two source views are not of the same binary (their SASS lines differ)")
    blocks = sum(x[1] for x in a) / max(1, sum(x[1] for x in b))  # rough ratio, for the split below
    role, roles = 0, []
    for text, _, _ in a:
        roles.append(role)
        role += "EXIT" in text
    cut = (1 + blocks) / 2 if blocks > 1.2 else 1.3

    def kind(i):
        ea, eb = a[i][1], b[i][1]
        if ea == 0 and eb == 0:
            return None
        return "per-block" if ea / max(eb, 1) > cut else "per-tile"

    tot_a, tot_b = sum(x[2] for x in a), sum(x[2] for x in b)
    print(f"stall samples: {args.more_blocks} {tot_a}, {args.fewer_blocks} {tot_b}")
    print("| role | code | samples (more blocks) | share | samples (fewer blocks) | share |")
    print("|---|---|---|---|---|---|")
    sums = {}
    for i in range(len(a)):
        k = kind(i)
        if k:
            s = sums.setdefault((roles[i], k), [0, 0])
            s[0] += a[i][2]
            s[1] += b[i][2]
    for (r, k), (sa, sb) in sorted(sums.items()):
        print(f"| {r} | {k} | {sa} | {100 * sa / tot_a:.1f}% | {sb} | {100 * sb / tot_b:.1f}% |")
    runs, cur = [], None
    for i in range(len(a)):
        k = kind(i)
        if k != "per-tile":
            continue
        if cur and cur["role"] == roles[i] and i - cur["last"] <= 3:
            cur["last"] = i
            cur["lines"].append(i)
        else:
            cur = {"role": roles[i], "first": i, "last": i, "lines": [i]}
            runs.append(cur)
    for r in runs:
        r["sa"], r["sb"] = sum(a[i][2] for i in r["lines"]), sum(b[i][2] for i in r["lines"])
    print("\n| role | SASS lines | samples (more blocks) | samples (fewer blocks) | line with the most samples |")
    print("|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: -(r["sa"] + r["sb"]))[:args.top]:
        top = max(r["lines"], key=lambda i: a[i][2] + b[i][2])
        print(f"| {r['role']} | {r['first']}-{r['last']} | {r['sa']} | {r['sb']} | `{a[top][0][:60]}` |")


if __name__ == "__main__":
    main()
