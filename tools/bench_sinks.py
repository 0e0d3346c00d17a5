#!/usr/bin/env python3
"""Learnable sinks on the GPU machine: ours with and without a sink, side by side in one run, and
FlashAttention-4 (flash_attn.cute.flash_attn_func, its learnable_sink; needs flash-attn-4, see
../shared/tools/fa4_anchor.sh, and FM3_EXTRA_SITE=/tmp/site) with and without, at gpt-oss's
attention shape: head dim 64, 64 query / 8 kv heads, bf16, causal and a sliding window of 128
(keys [i - 128, i]: masks.sliding_window for ours, window_size=(128, 0) for FlashAttention-4).
Forward, and with --bwd the backward (ours: paddle_fm3.kernels.flashmask_bwd with the sink's
gradient; FlashAttention-4: autograd, the sink's gradient included). Each implementation is timed
alone (CUDA events, median of --rep), the implementations of a row in --rounds alternating rounds.
TFLOP/s count visible pairs (backward 2.5x the forward's FLOPs). Rows as JSON with --out.

    python3 tools/bench_sinks.py --seqlens 8192,32768 --total-tokens 32768 [--bwd] --out rows.json
"""
import argparse
import json
import os
import sys

import numpy as np

if os.environ.get("FM3_EXTRA_SITE"):
    import site
    site.addsitedir(os.environ["FM3_EXTRA_SITE"])
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from paddle_fm3 import kernels, masks  # noqa: E402

import torch  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, WINDOW = 64, 8, 64, 128


def median_ms(fn, rep):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def visible_pairs(s, window):
    i = np.arange(s)
    return int(np.minimum(i + 1, s if window is None else window + 1).sum())


def fa4():
    """flash_attn.cute.flash_attn_func, or the reason it cannot run."""
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func, None
    except Exception as e:  # noqa: BLE001 - any import failure means: not available here
        return None, f"{type(e).__name__}: {e}"


def impls(s, b, window, bwd):
    """{name: zero-argument callable} of one row's implementations."""
    g = torch.Generator(device="cuda").manual_seed(s)
    q = torch.randn(b, s, HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(b, s, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(b, s, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
    sink = torch.randn(HEADS, device="cuda", generator=g)
    sri = None if window is None else torch.from_numpy(masks.sliding_window(s, window, batch=b).startend_row_indices).cuda()
    out, lse = torch.empty_like(q), torch.empty(b, HEADS, s, device="cuda")
    do = torch.randn_like(q)
    dq, dk, dv, dsink = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(sink)
    run = {}
    for name, sk in (("ours", None), ("ours_sink", sink)):
        if bwd:
            kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=True, learnable_sink=sk)
            extra = {} if sk is None else {"learnable_sink": sk, "dlearnable_sink": dsink}
            run[name] = (lambda extra=extra: kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv,
                                                                   causal=True, **extra))
        else:
            run[name] = lambda sk=sk: kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=True, learnable_sink=sk)
    fn, err = fa4()
    errors = {}
    if fn is None:
        errors["fa4_error"] = errors["fa4_sink_error"] = err
    else:
        ws = (None, 0) if window is None else (window, 0)
        for name, sk in (("fa4", None), ("fa4_sink", sink)):
            try:
                if bwd:
                    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                    skg = None if sk is None else sk.detach().requires_grad_()
                    o = fn(qg, kg, vg, causal=True, window_size=ws, learnable_sink=skg)
                    o = o[0] if isinstance(o, tuple) else o
                    inputs = tuple(x for x in (qg, kg, vg, skg) if x is not None)
                    # autograd.grad: no accumulation into .grad (an extra pass over the gradients)
                    run[name] = lambda o=o, inputs=inputs: torch.autograd.grad(o, inputs, do, retain_graph=True)
                else:
                    run[name] = lambda sk=sk: fn(q, k, v, causal=True, window_size=ws, learnable_sink=sk)
                run[name]()
            except Exception as e:  # noqa: BLE001 - recorded, the row goes on
                run.pop(name, None)
                errors[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return run, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", default="8192,32768")
    ap.add_argument("--total-tokens", type=int, default=32768, help="batch = total / S")
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--rep", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for s in (int(x) for x in args.seqlens.split(",")):
        b = max(1, args.total_tokens // s)
        for window in (None, WINDOW):
            run, errors = impls(s, b, window, args.bwd)
            flops = (2.5 if args.bwd else 1.0) * 4 * b * HEADS * HEAD_DIM * visible_pairs(s, window)
            rounds = {n: [] for n in run}
            for r in range(args.rounds):
                for n in (list(run) if r % 2 == 0 else list(run)[::-1]):
                    rounds[n].append(median_ms(run[n], args.rep))
            row = {"pass": "bwd" if args.bwd else "fwd", "seqlen": s, "batch": b, "heads": HEADS,
                   "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "family": "causal" if window is None else f"window{window}",
                   **errors}
            for n, ms in rounds.items():
                row[f"{n}_ms"] = float(np.median(ms))
                row[f"{n}_rounds_ms"] = ms
                row[f"{n}_tflops"] = flops / (row[f"{n}_ms"] * 1e-3) / 1e12
            row["sink_over_nosink"] = row["ours_sink_ms"] / row["ours_ms"]
            if "fa4_sink_ms" in row:
                row["ours_sink_vs_fa4_sink"] = row["fa4_sink_ms"] / row["ours_sink_ms"]
            rows.append(row)
            print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()
                              if not k.endswith("rounds_ms")}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
