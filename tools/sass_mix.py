#!/usr/bin/env python3
"""Executed-instruction mix of profiled kernels, side by side: reads the per-SASS-line CSVs that
tools/gpu_profile.sh writes (ncu's source page, `--print-source sass --csv`, gzip or plain) and
prints, per opcode, the instructions executed (warp level) and the stall samples of each kernel, with
the ratio to the first one. Normalized by HGMMA count (the same tensor work gives the same HGMMA
count at the same tile shape), so "per HGMMA" shows what each kernel issues around its products.

    tools/sass_mix.py $OUT/fm3_sass.csv.gz $OUT/flex_flash_sass.csv.gz [--top 30] [--full-opcode]
"""
import argparse
import collections
import csv
import gzip
import io
from pathlib import Path


def read_source_page(path):
    """(kernel name, [(SASS text, instructions executed, stall samples)]) of one ncu source-page CSV
    (gzip or plain), in address order; rows without integer counts are left out."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().split("\n")
    # Line 1: "Kernel Name","<name>"; line 2 on: the table.
    kernel = next(csv.reader([lines[0]]))[1] if lines and lines[0].startswith('"Kernel Name"') else Path(path).name
    table = csv.reader(io.StringIO("\n".join(lines[1:])))
    header = next(table, [])
    try:
        col_src, col_exec = header.index("Source"), header.index("Instructions Executed")
        col_smp = header.index("Warp Stall Sampling (All Samples)")
    except ValueError:
        raise SystemExit(f"{path}: no ncu source-page table (Source, Instructions Executed, Warp Stall Sampling "
                         f"columns); make it with tools/gpu_profile.sh") from None
    rows = []
    for row in table:
        if len(row) <= max(col_src, col_exec, col_smp):
            continue
        try:
            rows.append((row[col_src].strip(), int(row[col_exec]), int(row[col_smp])))
        except ValueError:
            continue
    return kernel, rows


def read_mix(path, full_opcode=False):
    """(kernel name, {opcode: executed}, {opcode: stall samples}) of one source-page CSV."""
    kernel, rows = read_source_page(path)
    executed, samples = collections.Counter(), collections.Counter()
    for src, n, s in rows:
        words = src.split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        key = op if full_opcode else op.split(".")[0]
        executed[key] += n
        samples[key] += s
    return kernel, executed, samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+", help="source-page CSVs (the first is the reference of the ratios)")
    ap.add_argument("--top", type=int, default=30, help="opcodes shown (by the first kernel's count)")
    ap.add_argument("--full-opcode", action="store_true", help="keep opcode modifiers (MUFU.EX2, SYNCS....)")
    args = ap.parse_args()
    mixes = [read_mix(p, args.full_opcode) for p in args.csv]
    per = [max(sum(n for op, n in m[1].items() if op.split(".")[0] == "HGMMA"), 1) for m in mixes]
    for i, ((kernel, ex, smp), hgmma) in enumerate(zip(mixes, per)):
        print(f"[{i}] {kernel[:150]}: {sum(ex.values()):,} instructions, {hgmma:,} HGMMA, "
              f"{sum(smp.values()):,} stall samples")
    ops = sorted(set().union(*(m[1] for m in mixes)), key=lambda o: -mixes[0][1][o])[: args.top]
    head = "| opcode | " + " | ".join(f"[{i}] per HGMMA | [{i}] % samples" for i in range(len(mixes)))
    print(head + (" | [i] / [0] |" if len(mixes) > 1 else " |"))
    print("|---" * (1 + 2 * len(mixes) + (len(mixes) > 1)) + "|")
    for op in ops + ["(all)"]:
        cells, ratios = [], []
        for m, h in zip(mixes, per):
            n = sum(m[1].values()) if op == "(all)" else m[1][op]
            s = sum(m[2].values()) if op == "(all)" else m[2][op]
            cells.append(f"{n / h:.1f} | {100 * s / max(sum(m[2].values()), 1):.1f}")
            ratios.append(n / h)
        ratio = " / ".join(f"{r / ratios[0]:.2f}" if ratios[0] else "-" for r in ratios[1:])
        print(f"| {op} | " + " | ".join(cells) + (f" | {ratio} |" if len(mixes) > 1 else " |"))


if __name__ == "__main__":
    main()
