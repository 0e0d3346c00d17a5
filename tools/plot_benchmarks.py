"""Plot the recorded benchmark tables (markdown) as PNGs for BENCHMARKS.md.

Reads the tables that the benchmark scripts wrote -- BENCHMARKS.md (Hopper forward and
backward, from tools/bench_attention.py on the device) and docs/cp_simulation.md (from
tools/simulate_cp.py) -- and draws:

- docs/gpu_forward_d128_s32k.png: TFLOP/s per mask family, fm3 vs FlexAttention (and cuDNN);
- docs/gpu_backward_d128_s32k.png: the same for the backward, where recorded;
- docs/cp_speedup.png: simulated CP speedup over zigzag ring attention per family and P;
- docs/gpu_vs_flex_flash.png: ours over FlexAttention-FLASH (FlashAttention-4) per family, one panel
  per (forward/backward, head_dim, S), from the raw rows docs/bench/{fwd,bwd}_vs_peers.json.

Usage: python tools/plot_benchmarks.py [--gpu BENCHMARKS.md] [--cp docs/cp_simulation.md] [--out docs]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def read_tables(path: pathlib.Path) -> list[list[dict]]:
    """Every markdown table in the file as a list of row dicts (header -> cell text)."""
    tables, header, rows = [], None, []
    for line in path.read_text().splitlines() + [""]:
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif set("".join(cells)) <= set("-: "):
                continue
            else:
                rows.append(dict(zip(header, cells)))
        elif header is not None:
            tables.append(rows)
            header, rows = None, []
    return tables


def number(text: str) -> float:
    try:
        return float(text.rstrip("x"))
    except ValueError:
        return float("nan")


def find_rows(tables, required: set[str], **where) -> list[dict]:
    for rows in tables:
        if rows and required <= set(rows[0]) and all(
                any(r.get(k) == v for r in rows) for k, v in where.items()):
            return [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    return []


def bars(ax, labels, series: dict, ylabel: str, title: str) -> None:
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(x, labels, rotation=45, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)


def save(fig, out: pathlib.Path, dpi: int) -> None:
    """The figure as a 256-colour PNG (a third of matplotlib's RGBA file: these plots have few colours)."""
    from PIL import Image  # matplotlib's own dependency
    fig.savefig(out, dpi=dpi)
    Image.open(out).convert("RGB").quantize(colors=256).save(out, optimize=True)


def plot_gpu(tables, out: pathlib.Path, direction: str, required: set[str], ours: str, flex: str,
             cudnn: str) -> bool:
    rows = find_rows(tables, required, D="128", S="32768")
    if not rows:
        return False
    fams = [r["family"] for r in rows]
    series = {"paddle_fm3": [number(r[ours]) for r in rows], "FlexAttention": [number(r[flex]) for r in rows]}
    if cudnn in rows[0]:
        series["cuDNN SDPA"] = [number(r[cudnn]) for r in rows]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    bars(ax, fams, series, "TFLOP/s (visible pairs only)", f"H200 bf16 {direction}, head_dim 128, S = 32K")
    fig.tight_layout()
    save(fig, out, dpi=110)
    plt.close(fig)
    return True


def plot_cp(tables, out: pathlib.Path) -> bool:
    rows = [r for rows in tables for r in rows if "speedup vs ring" in r]
    if not rows:
        return False
    fams = sorted({r["family"] for r in rows})
    ps = sorted({r["P"] for r in rows}, key=int)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    series = {}
    for p in ps:
        best = {}
        for r in rows:
            if r["P"] == p:  # the longest sequence per family
                if r["family"] not in best or int(r["S"]) > int(best[r["family"]]["S"]):
                    best[r["family"]] = r
        series[f"P = {p}"] = [number(best[f]["speedup vs ring"]) if f in best else np.nan for f in fams]
    bars(ax, fams, series, "speedup over zigzag ring (x)", "Simulated CP step time: this design vs zigzag ring")
    ax.axhline(1.0, color="k", lw=0.8)
    fig.tight_layout()
    save(fig, out, dpi=110)
    plt.close(fig)
    return True


def plot_peers(bench: pathlib.Path, out: pathlib.Path) -> bool:
    """fm3 / flex_flash per family for every (direction, head dims, seqlen) recorded."""
    panels = []
    for direction in ("fwd", "bwd"):
        path = bench / f"{direction}_vs_peers.json"
        if path.exists():
            rows = json.loads(path.read_text())
            dims = lambda r: (r["head_dim"], r.get("head_dim_v", r["head_dim"]), r["seqlen"])  # noqa: E731
            for key in sorted({dims(r) for r in rows}):
                sel = [r for r in rows if dims(r) == key and r.get("flex_flash")]
                if sel:
                    panels.append((direction, key, sel))
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.6 * len(panels)), squeeze=False)
    for ax, (direction, (d, dv, s), sel) in zip(axes[:, 0], panels):
        ratio = [r["fm3"] / r["flex_flash"] for r in sel]
        ax.bar(range(len(sel)), ratio, color=["tab:green" if x >= 1.05 else "tab:red" for x in ratio])
        ax.set_xticks(range(len(sel)), [r["family"] for r in sel], rotation=30, ha="right", fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.05, color="k", lw=0.8, ls="--")
        ax.set_ylim(0.5, max(1.3, max(ratio) + 0.05))
        ax.set_ylabel("fm3 / Flex FLASH")
        ax.set_title(f"H200 bf16 {'forward' if direction == 'fwd' else 'backward'}, head_dim {d}"
                     f"{f' (v {dv})' if dv != d else ''}, S = {s}",
                     fontsize=9)
    fig.tight_layout()
    save(fig, out, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=pathlib.Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--cp", type=pathlib.Path, default=ROOT / "docs" / "cp_simulation.md")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "docs")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    made = []
    if args.gpu.exists():
        gpu = read_tables(args.gpu)
        if plot_gpu(gpu, args.out / "gpu_forward_d128_s32k.png", "forward",
                    {"fm3 TFLOP/s", "Flex TFLOP/s"}, "fm3 TFLOP/s", "Flex TFLOP/s", "cuDNN TFLOP/s"):
            made.append("gpu_forward_d128_s32k.png")
        if plot_gpu(gpu, args.out / "gpu_backward_d128_s32k.png", "backward",
                    {"fm3 bwd", "Flex bwd"}, "fm3 bwd", "Flex bwd", "cuDNN bwd"):
            made.append("gpu_backward_d128_s32k.png")
    if args.cp.exists() and plot_cp(read_tables(args.cp), args.out / "cp_speedup.png"):
        made.append("cp_speedup.png")
    if plot_peers(ROOT / "docs" / "bench", args.out / "gpu_vs_flex_flash.png"):
        made.append("gpu_vs_flex_flash.png")
    print("wrote:", ", ".join(made) if made else "nothing (no matching tables)")


if __name__ == "__main__":
    main()
